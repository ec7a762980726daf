/** A pg-boss 12 worker process: defaults (maintenance, cron, monitoring on), LISTEN/NOTIFY on, one work() fetching 10 jobs at a time (burstWhenBatchFull). */
import { PgBoss } from "pg-boss"
import { nowNs, tell } from "../lib.js"
import { makeHandler, readConfig } from "./hooks.js"
import { queueName } from "./types.js"

const config = readConfig()
const onJob = makeHandler(config)

tell({ t: "starting", at: nowNs() })
const boss = new PgBoss({ connectionString: config.url, useListenNotify: true })
boss.on("error", (e: Error) => process.stderr.write(`pg-boss: ${e.message}\n`))
await boss.start()
await boss.work<{ seq: number }>(
  queueName,
  // ten jobs per fetch, fetching again at once while fetches come back full (burst): the fastest drain its
  // options give at ten jobs in flight; NOTIFY wakes it when idle, the 0.5 s poll is the backstop
  { batchSize: config.concurrency, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
  async (jobs) => {
    for (const job of jobs) onJob(job.data.seq)
  }
)
tell({ t: "ready", at: nowNs() })

const shutdown = async () => {
  await boss.stop({ graceful: true, timeout: 10_000 })
  process.exit(0)
}
process.once("SIGTERM", () => void shutdown())
process.once("SIGINT", () => void shutdown())
