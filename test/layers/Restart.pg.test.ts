/**
 * Through a real PostgreSQL restart under steady single-job enqueues: the worker's listener says `down` from
 * the moment its connection drops and `listening` once LISTEN is back, completions resume, and nothing is lost
 * or stuck. This file runs its own embedded server (a restart of the shared one would disturb other files),
 * so it restarts a real PostgreSQL in both test passes; on the machine's shared server the fault is simulated
 * by test/layers/BackendKills.pg.test.ts (every backend terminated), which a test may not restart.
 * The completion rates before and after are printed, not asserted: speed belongs to `npm run chaos`.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Exit, Layer, Schema } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Waker from "../../packages/pgfiber/src/runtime/Waker.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { waitFor } from "../support/waitFor.js"

const recorded = Stage.make({
  name: "restart_echo",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 8,
  handler: (_, job) =>
    Effect.flatMap(Db.Db, (db) => db.run((sql) => sql`insert into executions (job_id) values (${job.id})`)).pipe(Effect.asVoid, Effect.orDie)
})

describe("PostgreSQL restart", () => {
  it.live("under steady enqueues: the listener is down while the server is, back after; completions resume; nothing lost or stuck", () =>
    Effect.gen(function*() {
      const dataDir = Path.join(Os.tmpdir(), `pgfiber-restart-${process.pid}-${Date.now().toString(36)}`)
      yield* Effect.addFinalizer(() => Effect.sync(() => Fs.rmSync(dataDir, { recursive: true, force: true })))
      const server = yield* EmbeddedPg.start({ dataDir, port: 0 })
      const schema = "restart"

      // the producer's and the checker's Db, on the same server
      const db = yield* Db.make({ url: server.url, schema, poolMax: 2, applicationName: "restart-producer" })
      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
      yield* db.run((sql) => sql`create table executions (job_id bigint, at timestamptz default clock_timestamp())`)
      const queue = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))
      const count = (query: (sql: Db.Sql) => PromiseLike<ReadonlyArray<{ n: number }>>) =>
        db.run(query).pipe(Effect.map((r) => r[0]!.n), Effect.retry({ times: 50, while: (e) => e.unavailable }), Effect.orDie)
      const executions = count((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from executions`)

      // the worker, in this process so its Waker can be asked
      const scope = yield* Effect.scope
      const workerDb = Layer.scoped(Db.Db, Db.make({ url: server.url, schema, poolMax: 6, applicationName: "restart-worker" }))
      const context = yield* Layer.buildWithScope(
        Worker.layer([recorded], {
          workerId: "restart-w",
          shutdownGrace: Duration.seconds(5),
          sweepInterval: Duration.seconds(60),
          pollInterval: Duration.seconds(1),
          concurrency: {}
        }).pipe(Layer.provideMerge(PgQueue.layer()), Layer.provideMerge(workerDb)),
        scope
      ).pipe(Effect.orDie)
      const waker = Context.get(context, Waker.Waker)

      const acknowledged: Array<string> = []
      let failures = 0
      let stop = false
      const producer = yield* Effect.fork(Effect.gen(function*() {
        for (let n = 0; !stop; n++) {
          const result = yield* Effect.exit(queue.enqueue([{ stage: "restart_echo", payload: { n }, maxAttempts: 100 }]))
          if (Exit.isSuccess(result)) acknowledged.push(...result.value.map((r) => String(r.id)))
          else failures++
          yield* Effect.sleep("5 millis")
        }
      }))

      const rateOver = (seconds: number) =>
        Effect.gen(function*() {
          const from = yield* executions
          yield* Effect.sleep(Duration.seconds(seconds))
          return ((yield* executions) - from) / seconds
        })

      yield* waitFor("the first 100 completions", Effect.map(executions, (n) => n >= 100))
      const before = yield* rateOver(5)

      yield* server.stop
      const down = yield* waitFor("the listener to report down", Effect.map(waker.health, (h) => h.listener === "down" ? h : null))
      expect(down.listenerDownSince).not.toBeNull()
      const reconnects = down.listenerReconnects
      yield* Effect.sleep("2 seconds") // the outage
      yield* server.start
      const backAt = Date.now()
      yield* waitFor("LISTEN to be back", Effect.map(waker.health, (h) => h.listener === "listening" && h.listenerReconnects > reconnects))
      const listenBackMs = Date.now() - backAt
      const after = yield* rateOver(10)

      stop = true
      yield* producer.await
      yield* waitFor("the queue to drain", Effect.map(count((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from jobs`), (n) => n === 0))
      const ran = yield* count((sql) => sql<Array<{ n: number }>>`select count(distinct job_id)::int as n from executions where job_id = any(${acknowledged}::bigint[])`)
      expect(ran).toBe(acknowledged.length)
      expect(yield* count((sql) => sql<Array<{ n: number }>>`select count(*)::int as n from dead_letters`)).toBe(0)
      console.log(
        `restart: ${before.toFixed(0)} completions/s before, ${after.toFixed(0)}/s in the 10 s after the server was back ` +
          `(${((after / Math.max(before, 1)) * 100).toFixed(0)} %); LISTEN back ${listenBackMs} ms after the server; ` +
          `${acknowledged.length} jobs acknowledged, ${failures} enqueues refused while it was down`
      )
    }).pipe(Effect.scoped), 300_000)
})
