/**
 * pgfiber behind a real PgBouncer in transaction mode: the pool's statements go through PgBouncer (with
 * `prepare: false`, which a transaction pooler before 1.21 needs, and `pooler: "transaction"`: one statement in
 * flight per connection, or PgBouncer 1.18 loses answers), LISTEN goes to the database directly
 * (`listenUrl`, DATABASE_LISTEN_URL), and jobs enqueued through PgBouncer wake the worker by NOTIFY and complete,
 * with the safety sweep and the polling fallback set to an hour so that nothing else could have woken it.
 *
 * The PgBouncer and its login role: test/support/pgbouncer.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Redacted, Ref, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Waker from "../../packages/pgfiber/src/runtime/Waker.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { databaseUrl, dropSchema, freshSchemaName } from "../support/pg.js"
import { pgbouncerBin, pgbouncerRequired, roleFor, startPgBouncer } from "../support/pgbouncer.js"
import { waitFor } from "../support/waitFor.js"

const Payload = Schema.Struct({ n: Schema.Number })

describe.skipIf(pgbouncerBin === undefined && !pgbouncerRequired)("behind PgBouncer in transaction mode", () => {
  it.live("jobs enqueued through PgBouncer wake the worker by NOTIFY (LISTEN on DATABASE_LISTEN_URL) and complete", () =>
    Effect.gen(function*() {
      if (pgbouncerBin === undefined) return yield* Effect.dieMessage("pgbouncer is not installed (apt-get install pgbouncer)")
      const schema = freshSchemaName("bouncer")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      yield* Migrations.migrate().pipe(
        Effect.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 }))),
        Effect.orDie
      )
      const { admin, password, role } = yield* roleFor(schema)
      const direct = new URL(databaseUrl())
      const bouncer = yield* startPgBouncer(direct, role, password)

      const viaBouncer = Redacted.make(`postgres://${role}:${password}@127.0.0.1:${bouncer.port}/pgfiber`)
      const listenUrl = new URL(direct)
      listenUrl.username = role
      listenUrl.password = password

      const handled = yield* Ref.make(new Set<number>())
      const stage = Stage.make({
        name: "bounced",
        payload: Payload,
        concurrency: 8,
        handler: ({ n }) => Ref.update(handled, (s) => new Set(s).add(n))
      })
      const dbLayer = Layer.scoped(
        Db.Db,
        Db.make({ url: viaBouncer, listenUrl: Redacted.make(listenUrl.href), prepare: false, pooler: "transaction", schema, poolMax: 6 })
      )
      const context = yield* Layer.build(
        Worker.layer([stage], {
          workerId: "bouncer-test",
          shutdownGrace: Duration.seconds(5),
          // nothing polls: only a NOTIFY can wake the pool
          sweepInterval: Duration.hours(1),
          pollInterval: Duration.hours(1),
          concurrency: {}
        }).pipe(Layer.provideMerge(PgQueue.layer()), Layer.provideMerge(dbLayer))
      ).pipe(Effect.orDie)
      const waker = Context.get(context, Waker.Waker)
      yield* waitFor("the listener", Effect.map(waker.health, (h) => h.listener === "listening"))
      // and the pool's start-up claim done: the jobs below are for the NOTIFY to wake it, not the first claim
      const info = Context.get(context, Worker.WorkerInfo)
      yield* waitFor("the pool's first claim", Effect.map(info.pools, (pools) => pools.some((p) => p.lastClaimAt !== null)))

      // enqueued through PgBouncer, one statement each, while the worker is idle and listening
      const total = 40
      yield* Effect.forEach(
        Array.from({ length: total }, (_, n) => n),
        (n) => Stage.enqueue(stage, { n }),
        { concurrency: 4, discard: true }
      ).pipe(Effect.provide(context), Effect.orDie)

      yield* waitFor("every job to run", Effect.map(Ref.get(handled), (s) => s.size === total))
      const left = yield* waitFor(
        "the queue to empty",
        Effect.promise(() => admin.unsafe(`select count(*)::int as n from ${schema}.jobs`)).pipe(
          Effect.map((rows) => (rows[0]!.n === 0 ? "empty" : undefined))
        )
      )
      expect(left).toBe("empty")
      expect((yield* Ref.get(handled)).size).toBe(total)

      // the pool really went through PgBouncer, and the one LISTEN went to the database directly
      expect(bouncer.log()).toMatch(/login attempt: db=pgfiber/)
      const listeners = yield* Effect.promise(() =>
        admin`select count(*)::int as n from pg_stat_activity where usename = ${role} and (query ilike 'listen%' or query like '%pg_try_advisory_lock%')`
      )
      expect(listeners[0]!.n).toBe(1)
      expect((yield* waker.health).listener).toBe("listening")
    }).pipe(Effect.scoped), { timeout: 120_000 })
})
