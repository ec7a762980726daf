import { Layer, TestClock } from "effect"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as SqlClock from "../../packages/pgfiber/src/queue/SqlClock.js"
import { layerDb } from "../support/pg.js"
import { contract } from "./contract.js"

// on the TestClock: the statements take its time (SqlClock.layerTest), so nothing sleeps
contract({
  name: "PgQueue",
  layer: PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 12 })), Layer.provide(SqlClock.layerTest)),
  fresh: () => PgQueue.layer().pipe(Layer.provide(layerDb({ poolMax: 2 })), Layer.provide(SqlClock.layerTest)),
  advance: (d) => TestClock.adjust(d),
  live: false
})
