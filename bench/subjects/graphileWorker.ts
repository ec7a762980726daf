/** A graphile-worker process: `run()` with a task list, concurrency 10, its own signal handling. */
import { run } from "graphile-worker"
import { nowNs, tell } from "../lib.js"
import { batchedPreset } from "./graphile.js"
import { makeHandler, readConfig } from "./hooks.js"
import { queueName } from "./types.js"

const config = readConfig()
const onJob = makeHandler(config)

tell({ t: "starting", at: nowNs() })
const runner = await run({
  connectionString: config.url,
  concurrency: config.concurrency,
  taskList: { [queueName]: async (payload) => onJob((payload as { seq: number }).seq) },
  ...(config.variant === "batched" ? { preset: batchedPreset } : {})
})
tell({ t: "ready", at: nowNs() })
await runner.promise
