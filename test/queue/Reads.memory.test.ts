import { Layer } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Reads from "../../packages/pgfiber/src/queue/Reads.js"
import { contract } from "./ReadsContract.js"

contract({
  name: "memory",
  layer: Reads.layerMemory.pipe(Layer.provideMerge(MemoryQueue.layer())),
  live: false
})
