import { Layer } from "effect"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Reads from "../../packages/pgfiber/src/queue/Reads.js"
import { layerDb } from "../support/pg.js"
import { contract } from "./ReadsContract.js"

contract({
  name: "Postgres",
  layer: Layer.merge(Reads.layer, PgQueue.layer()).pipe(Layer.provide(layerDb({ poolMax: 6 })), Layer.orDie),
  live: true
})
