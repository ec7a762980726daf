/** A pg-boss 12 worker process: defaults (maintenance, cron, monitoring on), LISTEN/NOTIFY on, one work() fetching `concurrency` jobs at a time (burstWhenBatchFull). */
import { PgBoss } from "pg-boss"
import { nowNs, tell } from "../lib.js"
import { makeJob, readConfig } from "./hooks.js"
import { queueName } from "./types.js"

const config = readConfig()
const job = makeJob(config)

tell({ t: "starting", at: nowNs() })
const boss = new PgBoss({ connectionString: config.url, useListenNotify: true })
boss.on("error", (e: Error) => process.stderr.write(`pg-boss: ${e.message}\n`))
await boss.start()
await boss.work<{ seq: number }>(
  queueName,
  // `concurrency` jobs per fetch, fetching again at once while fetches come back full (burst): the fastest drain
  // its options give at that many jobs in flight; NOTIFY wakes it when idle, the 0.5 s poll is the backstop
  { batchSize: config.concurrency, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
  // a batch of jobs (pg-boss takes only a Promise-returning batch handler): the plain function on each in turn, the
  // async one on all of them at once (the batch is the worker's concurrency, so they run side by side)
  config.handler === "sync"
    ? async (jobs) => {
      for (const j of jobs) job.sync(j.data.seq)
    }
    : async (jobs) => {
      await Promise.all(jobs.map((j) => job.async(j.data.seq)))
    }
)
tell({ t: "ready", at: nowNs() })

const shutdown = async () => {
  await boss.stop({ graceful: true, timeout: 10_000 })
  process.exit(0)
}
process.once("SIGTERM", () => void shutdown())
process.once("SIGINT", () => void shutdown())
