/** A pg-boss 10 worker process: defaults (maintenance, cron, monitoring on), one work() at batchSize 10, plus the LISTEN bridge. */
import PgBoss from "pg-boss"
import { connect, nowNs, tell } from "../lib.js"
import { makeHandler, readConfig } from "./hooks.js"
import { notifyChannel } from "./pgboss.js"
import { queueName } from "./types.js"

const config = readConfig()
const onJob = makeHandler(config)

tell({ t: "starting", at: nowNs() })
const boss = new PgBoss({ connectionString: config.url })
boss.on("error", (e) => process.stderr.write(`pg-boss: ${e.message}\n`))
await boss.start()
const workerId = await boss.work<{ seq: number }>(
  queueName,
  { batchSize: config.concurrency, pollingIntervalSeconds: 0.5 },
  async (jobs) => {
    for (const job of jobs) onJob(job.data.seq)
  }
)
const listener = connect(config.url, { max: 1, app: "pgboss-bench-listener" })
await listener.listen(notifyChannel, () => boss.notifyWorker(workerId))
tell({ t: "ready", at: nowNs() })

const shutdown = async () => {
  await listener.end({ timeout: 2 }).catch(() => undefined)
  await boss.stop({ graceful: true, wait: true, timeout: 10_000 })
  process.exit(0)
}
process.once("SIGTERM", () => void shutdown())
process.once("SIGINT", () => void shutdown())
