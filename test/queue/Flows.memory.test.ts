import { TestClock } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import { flowsContract } from "./flowsContract.js"

flowsContract({
  name: "MemoryQueue",
  layer: MemoryQueue.layer(),
  fresh: () => MemoryQueue.layer(),
  advance: (d) => TestClock.adjust(d),
  live: false
})
