import { Effect, Layer } from "effect"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import { layerDb } from "../support/pg.js"
import { contract } from "./contract.js"

contract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 12 }))),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 }))),
  advance: (d) => Effect.sleep(d),
  live: true
})
