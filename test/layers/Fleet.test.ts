/**
 * A fleet behind a real PgBouncer (transaction mode): 20 worker processes (test/fixtures/fleetWorker.ts, each
 * concurrency 10) whose pools go through a PgBouncer of 10 server connections, their LISTEN direct
 * (DATABASE_LISTEN_URL, DB_PREPARE=false, DB_POOLER=transaction), drain jobs a producer enqueues through the same PgBouncer:
 * - every job runs exactly once (one row in `executions` per job, none twice);
 * - no process logs an error or a failed claim, and each exits 0 on SIGTERM;
 * - the server connections behind PgBouncer (backends of its login role in pg_stat_activity, sampled every
 *   100 ms through the run) never exceed its pool of 10. The processes' direct connections are counted apart
 *   (another role): one LISTEN connection each, and the session connection for the migrations' lock while open;
 * - PgBouncer never logs an answer it had nowhere to send ("got packet from server when not linked").
 *
 * What makes it pass on PgBouncer 1.18: DB_POOLER=transaction (Db's ConnectionSlots), one statement in flight per
 * connection of each pool, so porsager never pipelines a statement behind another that the pooler would answer
 * to nobody. The stage's lease is a minute (test/fixtures/fleetWorker.ts), so a heartbeat held up on a loaded
 * machine cannot rerun a job: a run counted twice is a lost answer, not a slow beat.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Schema } from "effect"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import { errorsOf, fleetDatabase } from "../support/fleet.js"
import { pgbouncerBin, pgbouncerRequired } from "../support/pgbouncer.js"
import { waitFor } from "../support/waitFor.js"

/** The fixture's stage, for enqueueing (its handler runs in the worker processes). */
const fleet = Stage.make({ name: "fleet", payload: Schema.Struct({ sleepMs: Schema.Number }), handler: () => Effect.void })

const processes = 20
const poolSize = 10
const total = 1_000

// minutes of 20 processes starting on 2 cores: run once by CI (.ci/run, PGFIBER_FLEET_TEST=1), not in each `npm test`
describe.skipIf((pgbouncerBin === undefined && !pgbouncerRequired) || process.env.PGFIBER_FLEET_TEST !== "1")("a fleet behind PgBouncer", () => {
  it.live(`${processes} worker processes on ${poolSize} server connections run every job exactly once`, () =>
    Effect.gen(function*() {
      const db = yield* fleetDatabase({ prefix: "fleet", poolSize })
      const workers = yield* db.spawnWorkers(processes)
      yield* db.awaitListening(workers)

      // sampled through the run, from before the first job to after the last
      let maxServer = 0
      let samples = 0
      const sampler = yield* Effect.fork(
        Effect.flatMap(db.serverConnections, (n) =>
          Effect.sync(() => {
            maxServer = Math.max(maxServer, n)
            samples++
          })).pipe(Effect.zipRight(Effect.sleep("100 millis")), Effect.forever)
      )

      // a producer through the same PgBouncer: batches of 100, a few jobs sleeping so that slots fill
      yield* Effect.gen(function*() {
        const queue = yield* Queue.Queue
        for (let b = 0; b < total / 100; b++) {
          const jobs = yield* Effect.forEach(Array.from({ length: 100 }, (_, i) => i), (i) => Stage.job(fleet, { sleepMs: i % 10 === 0 ? 20 : 0 }))
          yield* queue.enqueue(jobs)
        }
      }).pipe(Effect.provide(Layer.fresh(db.producer)), Effect.orDie)

      const done = yield* waitFor(
        "every job to run and the queue to empty",
        Effect.promise(() => db.sql`select (select count(*)::int from executions) as runs, (select count(*)::int from jobs) as left`).pipe(
          Effect.map((rows) => (rows[0]!.runs >= total && rows[0]!.left === 0 ? rows[0]! : undefined))
        ),
        "8 minutes",
        "250 millis"
      )
      yield* Fiber.interrupt(sampler)

      const [counts] = yield* Effect.promise(() =>
        db.sql`select count(*)::int as runs, count(distinct job_id)::int as jobs, count(distinct worker_id)::int as workers from executions`
      )
      expect(done.left).toBe(0)
      expect(counts!.jobs).toBe(total)
      // exactly once: no job ran twice
      expect(counts!.runs).toBe(total)
      // the work was shared (not one process doing it all while the rest hung at start)
      expect(counts!.workers).toBeGreaterThan(1)

      // no answer went astray: PgBouncer 1.18 logs the answers it drops for a client it has unlinked
      expect(db.bouncer.log()).not.toMatch(/not linked/)
      expect(samples).toBeGreaterThan(0)
      expect(maxServer).toBeGreaterThan(0)
      expect(maxServer).toBeLessThanOrEqual(poolSize)
      // one LISTEN per process went to the database directly
      expect((yield* db.directConnections).listening).toBe(processes)

      for (const w of workers) {
        expect(errorsOf(w), w.output()).toEqual([])
        expect(w.child.exitCode, w.output()).toBeNull()
      }
      yield* Effect.forEach(workers, (w) => Effect.sync(() => w.child.kill("SIGTERM")), { discard: true })
      const codes = yield* Effect.promise(() => Promise.all(workers.map((w) => w.exited)))
      expect(codes).toEqual(workers.map(() => 0))
    }).pipe(Effect.scoped), { timeout: 1_200_000 })
})
