import { Effect, Layer } from "effect"
import * as PgQueue from "../../src/queue/PgQueue.js"
import { layerDb } from "../support/pg.js"
import { bulkContract } from "./BulkContract.js"

bulkContract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 4 }))),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 }))),
  advance: (d) => Effect.sleep(d),
  live: true
})
