/**
 * No fault of a database connection kills the process. A real worker process (test/fixtures/recordingWorker.ts)
 * runs while a producer enqueues jobs one at a time, and every backend of this test's processes — the worker's
 * pool, its LISTEN connection, the producer's pool — is terminated twice a second for 30 s. Only this test's
 * connections are killed (they carry this test's application_name), since other test files share the server.
 * Then: the worker is still alive, every job the producer was told was enqueued ran, nothing is left queued,
 * running or dead-lettered, and a fresh batch drains (throughput returns).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Duration, Effect, Exit, Fiber, Redacted, Schedule, Scope } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import { waitFor } from "../support/waitFor.js"
import { databaseUrl, dropSchema, freshSchemaName, rawSql } from "../support/pg.js"
import { fixture, spawnWorkerProcess } from "../support/workerProcess.js"

const killFor = Duration.seconds(30)
const killEvery = Duration.millis(500)

describe("backend kills", () => {
  it.live("a transaction whose backend is killed fails with an unavailable error; its connection is not reused, the pool goes on (porsager/postgres#1208)", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("bk1208")
      const app = `pgfiber-test-bk1208-${process.pid}-${Date.now().toString(36)}`
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const killer = rawSql()
      yield* Effect.addFinalizer(() => Effect.promise(() => killer.end({ timeout: 5 })))
      // a pool of one: were the dead connection handed back, the next statement would get it
      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 1, applicationName: app })
      for (let round = 0; round < 5; round++) {
        const result = yield* Effect.exit(db.transaction(Effect.gen(function*() {
          const [{ pid }] = yield* db.run((sql) => sql<Array<{ pid: number }>>`select pg_backend_pid() as pid`)
          yield* Effect.promise(() => killer`select pg_terminate_backend(${pid}) where ${pid} in (select pid from pg_stat_activity where application_name = ${app})`)
          // the next statements go to a connection whose backend is gone
          yield* db.run((sql) => sql`select 1`)
          return yield* db.run((sql) => sql`select 2`)
        })))
        expect(Exit.isFailure(result)).toBe(true)
        if (Exit.isFailure(result)) {
          const error = Cause.failureOption(result.cause)
          expect(error._tag === "Some" && error.value.unavailable, String(result.cause)).toBe(true)
        }
        // the pool goes on, on a fresh connection
        const [{ n }] = yield* db.run((sql) => sql<Array<{ n: number }>>`select 42 as n`).pipe(
          Effect.retry({ times: 20, schedule: Schedule.spaced("100 millis"), while: (e) => e.unavailable })
        )
        expect(n).toBe(42)
      }
    }).pipe(Effect.scoped), 180_000)


  it.live("a Db whose statement's backend was killed mid-statement closes within its bound (porsager keeps the failed statement as the connection's current one, and its `end` waits for it)", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("bkclose")
      const app = `pgfiber-test-bkclose-${process.pid}-${Date.now().toString(36)}`
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const killer = rawSql()
      yield* Effect.addFinalizer(() => Effect.promise(() => killer.end({ timeout: 5 })))
      const scope = yield* Scope.make()
      yield* Effect.addFinalizer(() => Scope.close(scope, Exit.void))
      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2, applicationName: app }).pipe(Scope.extend(scope))
      const sleeping = yield* Effect.fork(Effect.exit(db.run((sql) => sql`select pg_sleep(600)`)))
      yield* waitFor("the statement to run", Effect.promise(() =>
        killer`select 1 from pg_stat_activity where application_name = ${app} and state = 'active' and query like '%pg_sleep(600)%'`
      ).pipe(Effect.map((rows) => rows.length > 0)))
      yield* Effect.promise(() => killer`select pg_terminate_backend(pid) from pg_stat_activity where application_name = ${app}`)
      const failed = yield* Fiber.join(sleeping)
      expect(Exit.isFailure(failed)).toBe(true)

      const closingAt = Date.now()
      yield* Scope.close(scope, Exit.void)
      const took = Date.now() - closingAt
      console.log(`a Db closed ${took} ms after its statement's backend was killed (bound ${Duration.format(Db.closeWithin)})`)
      // porsager's own 5 s timeout held every such close; the bound plus a margin for a loaded machine
      expect(took).toBeLessThan(Duration.toMillis(Db.closeWithin) + 2500)
    }).pipe(Effect.scoped), 180_000)

  it.live("every backend of the worker and the producer killed twice a second for 30 s: the process lives, nothing is lost or stuck, throughput returns", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("bk")
      // the worker's connections are `pgfiber-test-<WORKER_ID>`, the producer's the same prefix: one pattern for both
      const tag = `bk${process.pid}x${Date.now().toString(36)}`
      const appPrefix = `pgfiber-test-${tag}`
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const sql = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))

      const db = yield* Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4, applicationName: `${appPrefix}-producer` })
      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
      yield* Effect.promise(() =>
        sql`create table executions (job_id bigint, worker_id text, attempt int, at timestamptz default clock_timestamp())`
      )
      const queue = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))

      const child = yield* spawnWorkerProcess(fixture("recordingWorker.ts"), {
        PGFIBER_SCHEMA: schema,
        WORKER_ID: `${tag}-w`,
        LOG_LEVEL: "warn"
      })
      const executed = (ids: ReadonlyArray<string>) =>
        Effect.promise(() => sql<Array<{ n: number }>>`select count(distinct job_id)::int as n from executions where job_id = any(${ids}::bigint[])`).pipe(
          Effect.map((r) => r[0]!.n)
        )
      const enqueue = (n: number) =>
        queue.enqueue(Array.from({ length: n }, () => ({ stage: "record", payload: { sleepMs: 0 }, maxAttempts: 1000 }))).pipe(
          Effect.map((results) => results.map((r) => String(r.id)))
        )

      // the worker is up when it has run a first job
      const first = yield* enqueue(1).pipe(Effect.orDie)
      yield* waitFor("the worker to run a first job", Effect.map(executed(first), (n) => n === 1))

      // load: single-job enqueues, as fast as they go, failures (the kills) counted and retried by the next round
      const enqueued: Array<string> = [...first]
      let enqueueFailures = 0
      let stop = false
      const producer = yield* Effect.fork(
        Effect.gen(function*() {
          while (!stop) {
            const result = yield* Effect.exit(enqueue(1))
            if (Exit.isSuccess(result)) enqueued.push(...result.value)
            else enqueueFailures++
            yield* Effect.sleep("5 millis")
          }
        })
      )
      // the killer: a connection of its own (not matched by the pattern), every backend of this test's processes
      let rounds = 0
      let terminated = 0
      const killUntil = Date.now() + Duration.toMillis(killFor)
      while (Date.now() < killUntil) {
        const rows = yield* Effect.promise(() =>
          sql<Array<{ ok: boolean }>>`
            select pg_terminate_backend(pid) as ok from pg_stat_activity
            where application_name like ${appPrefix + "%"} and pid <> pg_backend_pid()`
        )
        rounds++
        terminated += rows.filter((r) => r.ok).length
        expect(child.child.exitCode, `the worker died:\n${child.output()}`).toBeNull()
        yield* Effect.sleep(killEvery)
      }
      stop = true
      yield* producer.await
      expect(child.child.exitCode, `the worker died:\n${child.output()}`).toBeNull()

      // nothing lost or stuck: the queue drains, every acknowledged job ran, nothing is dead-lettered
      yield* waitFor("the queue to drain after the kills", Effect.promise(() => sql<Array<{ n: number }>>`select count(*)::int as n from jobs`).pipe(
        Effect.map((r) => r[0]!.n === 0)
      ), Duration.minutes(3)).pipe(
        Effect.tapDefect(() =>
          Effect.promise(async () => {
            const left = await sql`select status, count(*)::int as n, min(locked_until) as until, max(attempts) as attempts, min(available_at) as due, now() as now
                                   from jobs group by status`
            const backends = await sql`select application_name, state, query from pg_stat_activity where application_name like ${appPrefix + "%"}`
            console.log("left in the queue:", JSON.stringify(left), "\nbackends:", JSON.stringify(backends), "\nworker output:\n", child.output().slice(-6000))
          })
        )
      )
      expect(yield* executed(enqueued)).toBe(enqueued.length)
      const dead = yield* Effect.promise(() => sql<Array<{ n: number }>>`select count(*)::int as n from dead_letters`)
      expect(dead[0]!.n).toBe(0)

      // throughput returns: a fresh batch all runs
      const after = yield* enqueue(300).pipe(Effect.retry({ times: 20, schedule: Schedule.spaced("250 millis") }), Effect.orDie)
      yield* waitFor("a fresh batch to run after the kills", Effect.map(executed(after), (n) => n === after.length))
      expect(child.child.exitCode, `the worker died:\n${child.output()}`).toBeNull()

      const stats = yield* Effect.promise(() => sql<Array<{ runs: number; jobs: number }>>`select count(*)::int as runs, count(distinct job_id)::int as jobs from executions`)
      const faults = (child.output().match(/PGFIBER_CONNECTION_FAULT/g) ?? []).length
      console.log(
        `backend kills: ${rounds} rounds, ${terminated} backends terminated; ${enqueued.length} jobs acknowledged ` +
          `(${enqueueFailures} enqueues failed and were not acknowledged); ${stats[0]!.runs} runs of ${stats[0]!.jobs} jobs; ` +
          `${faults} porsager fault(s) caught by the guard in the worker`
      )
    }).pipe(Effect.scoped), 360_000)
})
