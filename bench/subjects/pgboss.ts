/**
 * pg-boss 10 as a subject. pg-boss 10 has no LISTEN/NOTIFY of its own (it polls; its in-process wake-up is
 * `notifyWorker(id)`), so "LISTEN/NOTIFY on" is built here the way an application would: a statement trigger
 * on `pgboss.job` NOTIFYs, and the worker process LISTENs and calls `notifyWorker` for its worker.
 * Concurrency 10 is one `work()` with `batchSize: 10` (v10 dropped teamSize), polling at 0.5 s (the minimum).
 */
import PgBoss from "pg-boss"
import { connect } from "../lib.js"
import { type Producer, queueName, type Subject } from "./types.js"

export const notifyChannel = "pgboss_bench_inserted"

const install = async (url: string) => {
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false })
  boss.on("error", () => undefined)
  await boss.start()
  await boss.createQueue(queueName)
  await boss.stop({ graceful: false, wait: true })
  const sql = connect(url, { max: 1 })
  try {
    await sql.unsafe(`
      create function pgboss.bench_notify_inserted() returns trigger language plpgsql as $$
      begin perform pg_notify('${notifyChannel}', ''); return null; end $$;
      create trigger bench_notify_inserted after insert on pgboss.job
        for each statement execute function pgboss.bench_notify_inserted();`)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

const producer = async (url: string): Promise<Producer> => {
  // a producer only sends: no maintenance, no cron, no migration checks beyond start-up
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false, max: 4 })
  boss.on("error", () => undefined)
  await boss.start()
  const sql = connect(url, { max: 1 })
  return {
    enqueueBatch: async (seqs) => void (await boss.insert(seqs.map((seq) => ({ name: queueName, data: { seq } })))),
    enqueueOne: async (seq) => void (await boss.send(queueName, { seq })),
    pending: async () =>
      Number((await sql<Array<{ n: string }>>`
        select count(*)::text as n from pgboss.job where name = ${queueName} and state < 'completed'`)[0]!.n),
    close: async () => {
      await sql.end({ timeout: 5 })
      await boss.stop({ graceful: false, wait: true })
    }
  }
}

export const subject: Subject = {
  key: "pgboss",
  label: "pg-boss",
  variant: "notify-bridge",
  workerScript: "subjects/pgbossWorker.ts",
  notes: "work() with batchSize 10 (= concurrency 10), pollingIntervalSeconds 0.5 (the minimum); LISTEN/NOTIFY via a trigger + notifyWorker bridge, since pg-boss 10 has none",
  // pg-boss 10 waits pollingInterval between fetches even with a backlog, so a 20,000-job drain is cut off
  drainCapMs: 15_000,
  install,
  producer
}
