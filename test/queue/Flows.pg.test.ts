import { Effect, Layer } from "effect"
import * as PgQueue from "../../src/queue/PgQueue.js"
import { layerDb } from "../support/pg.js"
import { flowsContract } from "./flowsContract.js"

flowsContract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 12 }))),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 }))),
  advance: (d) => Effect.sleep(d),
  live: true
})
