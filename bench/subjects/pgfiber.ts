/**
 * pgfiber as a subject: enqueue through `Queue.enqueue` (one INSERT … SELECT FROM unnest per batch), run by
 * `pgfiberWorker.ts`: `Worker.layer` with one stage at the workload's concurrency, launched under `NodeRuntime.runMain`.
 */
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { connect } from "../lib.js"
import { type Producer, queueName, type Subject } from "./types.js"

export const schema = "pgfiber"

const runtimeFor = (url: string, connections = 4) =>
  ManagedRuntime.make(PgQueue.layer().pipe(Layer.provideMerge(Db.layerWith({ url: Redacted.make(url), schema, poolMax: connections }))))

export const subject: Subject = {
  key: "pgfiber",
  label: "pgfiber",
  variant: "default",
  workerScript: "subjects/pgfiberWorker.ts",
  notes: "the workload's concurrency (10; 100 for I/O-bound jobs); LISTEN/NOTIFY wake-ups; claims sized to free capacity; completions group-committed; finished jobs kept 7 days (jobs_archive)",
  drainCapMs: 60_000,
  statements: {
    // `Queue.claimBatch`: claimReady, claimReadyIfAll or claimShares (src/queue/JobsSql.ts), each setting the lease
    claim: /status = (\$\d+|'running'), locked_by = \$\d+, locked_until = now\(\) \+/,
    // completeOutcomes (completions only) or settleOutcomes (any outcome)
    settle: /delete from jobs j\s+using unnest\(|as i\(id, lease, kind, delay_ms/,
    enqueue: /insert into jobs \(/
  },
  install: async (url) => {
    const runtime = runtimeFor(url)
    try {
      await runtime.runPromise(Migrations.migrate())
    } finally {
      await runtime.dispose()
    }
  },
  producer: async (url, connections): Promise<Producer> => {
    const runtime = runtimeFor(url, connections)
    const sql = connect(url, { max: 1, schema })
    const enqueue = (seqs: ReadonlyArray<number>) =>
      runtime.runPromise(Effect.flatMap(Queue.Queue, (q) => q.enqueue(seqs.map((seq) => ({ stage: queueName, payload: { seq } })))))
    await runtime.runPromise(Effect.void)
    return {
      enqueueBatch: async (seqs) => void (await enqueue(seqs)),
      enqueueOne: async (seq) => void (await enqueue([seq])),
      pending: async () => Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n),
      close: async () => {
        await sql.end({ timeout: 5 })
        await runtime.dispose()
      }
    }
  }
}

/** The same worker with retention off (PGFIBER_RETAIN_COMPLETED=0): finished jobs deleted at once, no history. */
export const noRetention: Subject = {
  ...subject,
  key: "pgfiber-noretain",
  label: "pgfiber (retention off)",
  variant: "noretain",
  notes: "as pgfiber, with finished jobs deleted at once instead of kept 7 days: the cost of the kept history"
}
