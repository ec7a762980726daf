import { TestClock } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import { bulkContract } from "./BulkContract.js"

bulkContract({
  name: "MemoryQueue",
  layer: MemoryQueue.layer(),
  fresh: () => MemoryQueue.layer(),
  advance: (d) => TestClock.adjust(d),
  live: false
})
