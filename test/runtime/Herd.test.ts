/**
 * No thundering herd: 8 worker processes (test/fixtures/fleetWorker.ts) listen on one stage, and a trickle of
 * single jobs (each enqueued once the one before has run) costs at most 2 claim statements per job in all, not
 * one per process: only the stage's wake leader claims on a NOTIFY (src/runtime/Waker.ts). Claims are counted by
 * each process's `pgfiber_claims_total`, from once every process is up and quiet to the last job. Then a backlog
 * enqueued in one statement (one NOTIFY) is still run by several processes: the leader, whose claim comes back
 * full, asks the others to claim (`pgfiber:more:<stage>`).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import { claimsOf, errorsOf } from "../support/fleet.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor, waitForQuiet } from "../support/waitFor.js"
import { fixture, freshSchema, spawnWorkerProcess } from "../support/workerProcess.js"

const fleet = Stage.make({ name: "fleet", payload: Schema.Struct({ sleepMs: Schema.Number }), handler: () => Effect.void })

const processes = 8
const jobs = 30

describe("wake-ups with many processes listening", () => {
  it.live(`a trickle of single jobs costs at most 2 claims per job with ${processes} processes`, () =>
    Effect.gen(function*() {
      const { schema, sql } = yield* freshSchema("herd", "create table executions (job_id text not null, worker_id text not null)")
      const workers = yield* Effect.forEach(Array.from({ length: processes }, (_, i) => i), (i) =>
        spawnWorkerProcess(fixture("fleetWorker.ts"), { PGFIBER_SCHEMA: schema, WORKER_ID: `herd-${i}`, SHUTDOWN_GRACE_MS: "10000" }))
      const total = () => workers.reduce((n, w) => n + claimsOf(w), 0)
      // every process listening and past its start-up claim, and nothing more claimed for a while
      // (a pool registers once LISTEN has been tried, and claims once at once)
      yield* waitFor("every process to claim once", Effect.sync(() => workers.every((w) => claimsOf(w) > 0)))
      yield* waitForQuiet("the start-up claims", total)
      const before = total()

      const producer = PgQueue.layer().pipe(
        Layer.provideMerge(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 })))
      )
      yield* Effect.gen(function*() {
        for (let n = 1; n <= jobs; n++) {
          yield* Stage.enqueue(fleet, { sleepMs: 0 })
          yield* waitFor(
            `job ${n} to run`,
            Effect.promise(() => sql`select count(*)::int as n from executions`).pipe(Effect.map((rows) => rows[0]!.n >= n)),
            "2 minutes",
            "20 millis"
          )
        }
      }).pipe(Effect.provide(producer), Effect.orDie)
      yield* waitForQuiet("the last claims", total)
      const claims = total() - before
      console.log(`herd: ${processes} processes, ${jobs} jobs one at a time: ${claims} claims (${(claims / jobs).toFixed(2)} per job)`)

      const [runs] = yield* Effect.promise(() =>
        sql`select count(*)::int as runs, count(distinct job_id)::int as jobs, count(distinct worker_id)::int as workers from executions`
      )
      expect({ runs: runs!.runs, jobs: runs!.jobs }).toEqual({ runs: jobs, jobs })
      expect(claims).toBeGreaterThanOrEqual(jobs)
      expect(claims).toBeLessThanOrEqual(2 * jobs)

      // a backlog in one statement: one NOTIFY, more than one process can hold (8 × 10 slots, jobs of 50 ms)
      const backlog = 400
      yield* Effect.gen(function*() {
        const queue = yield* Queue.Queue
        yield* queue.enqueue(yield* Effect.forEach(Array.from({ length: backlog }, () => 0), () => Stage.job(fleet, { sleepMs: 50 })))
      }).pipe(Effect.provide(producer), Effect.orDie)
      yield* waitFor(
        "the backlog to run",
        Effect.promise(() => sql`select count(*)::int as n from executions`).pipe(Effect.map((rows) => rows[0]!.n >= jobs + backlog))
      )
      // processes that had run nothing of the trickle (the leader ran it) ran some of the backlog
      const [shared] = yield* Effect.promise(() => sql`select count(distinct worker_id)::int as workers from executions`)
      expect(shared!.workers).toBeGreaterThan(runs!.workers)
      for (const w of workers) expect(errorsOf(w), w.output()).toEqual([])
    }).pipe(Effect.scoped), { timeout: 300_000 })
})
