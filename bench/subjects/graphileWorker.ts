/** A graphile-worker process: `run()` with a task list, the workload's concurrency, its own signal handling. */
import { run } from "graphile-worker"
import { nowNs, tell } from "../lib.js"
import { batchedPreset } from "./graphile.js"
import { makeJob, readConfig } from "./hooks.js"
import { queueName } from "./types.js"

const config = readConfig()
const job = makeJob(config)

tell({ t: "starting", at: nowNs() })
const runner = await run({
  connectionString: config.url,
  concurrency: config.concurrency,
  // the task itself: graphile-worker awaits what it returns (undefined from the plain function)
  taskList: {
    [queueName]: config.handler === "sync"
      ? (payload) => job.sync((payload as { seq: number }).seq)
      : (payload) => job.async((payload as { seq: number }).seq)
  },
  ...(config.variant === "batched" ? { preset: batchedPreset } : {})
})
tell({ t: "ready", at: nowNs() })
await runner.promise
