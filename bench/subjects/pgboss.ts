/**
 * pg-boss 12 as a subject, with its own LISTEN/NOTIFY (`useListenNotify` on the instance, `notify: true` on
 * the queue): a send NOTIFYs and wakes the worker at once; polling stays as its backstop. Concurrency c is one
 * `work()` with `batchSize: c` and `burstWhenBatchFull` (fetch again at once while fetches come back full):
 * without a burst trigger a notify-enabled worker waits `notifyPollingIntervalSeconds` (30 s) between fetches
 * unless a NOTIFY arrives, and a drain of an existing backlog gets none.
 */
import { PgBoss } from "pg-boss"
import { connect } from "../lib.js"
import { type Producer, queueName, type Subject } from "./types.js"

const install = async (url: string) => {
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false })
  boss.on("error", () => undefined)
  await boss.start()
  await boss.createQueue(queueName, { notify: true })
  await boss.stop({ graceful: false })
}

const producer = async (url: string, connections = 4): Promise<Producer> => {
  // a producer only sends: no maintenance, no cron
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false, max: connections })
  boss.on("error", () => undefined)
  await boss.start()
  const sql = connect(url, { max: 1 })
  return {
    enqueueBatch: async (seqs) => void (await boss.insert(queueName, seqs.map((seq) => ({ data: { seq } })))),
    enqueueOne: async (seq) => void (await boss.send(queueName, { seq })),
    pending: async () =>
      Number((await sql<Array<{ n: string }>>`
        select count(*)::text as n from pgboss.job where name = ${queueName} and state < 'completed'`)[0]!.n),
    close: async () => {
      await sql.end({ timeout: 5 })
      await boss.stop({ graceful: false })
    }
  }
}

export const subject: Subject = {
  key: "pgboss",
  label: "pg-boss",
  variant: "notify",
  workerScript: "subjects/pgbossWorker.ts",
  notes: "pg-boss 12: useListenNotify with a notify queue; work() with batchSize = the workload's concurrency (10; 100 for I/O-bound jobs, run side by side) and burstWhenBatchFull, pollingIntervalSeconds 0.5 (the minimum) as the backstop",
  drainCapMs: 60_000,
  // fetch (its plans' fetchNextJob), complete (completeJobs), send / insert
  statements: {
    claim: /state = (\$\d+|'active'),\s*started_on = /i,
    settle: /completed_on = \S*job_now\(\),\s*state = /i,
    enqueue: /insert into \S*\.?job\s*\(/i
  },
  install,
  producer
}
