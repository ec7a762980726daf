/**
 * A change of a stage's run-time limits reaches every worker by NOTIFY (migration 0026), not by each claiming
 * process reading the overrides every second: on a real Postgres, an operator's process (a queue of its own, as
 * the CLI or the service is) lifts a rate limit, and a worker whose pool that limit held back, its next token an
 * hour away and its safety sweep an hour away, runs the waiting jobs at once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { freshSchema } from "../support/workerProcess.js"

const hourMs = 3_600_000

describe("run-time limits, changed in another process", () => {
  it.scopedLive("lifting a rate limit lets the pool it held back claim at once, not at its next token", () =>
    Effect.gen(function*() {
      const { schema } = yield* freshSchema("limn", "select 1")
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
      // the operator's process: its own Db and queue, as `pgfiber limits` or the service has
      const operator = yield* Layer.build(PgQueue.layer().pipe(Layer.provide(dbLayer)))
      const asOperator = <A, E>(effect: Effect.Effect<A, E, Queue.Queue>) => Effect.provide(effect, operator)
      const ran: Array<number> = []
      const stage = Stage.make({
        name: "lim_rated",
        payload: Schema.Struct({ n: Schema.Number }),
        handler: ({ n }) => Effect.sync(() => void ran.push(n))
      })
      // one job an hour, one token to start with
      yield* asOperator(Effect.flatMap(Queue.Queue, (q) => q.limits.set("lim_rated", { rateLimit: 1, ratePerMs: hourMs, rateBurst: 1 })))
      yield* Layer.build(
        Worker.layer([stage], {
          ...Worker.defaults(),
          workerId: "w-limits",
          sweepInterval: Duration.hours(1),
          shutdownGrace: Duration.seconds(5)
        }).pipe(Layer.provide(PgQueue.layer()), Layer.provide(dbLayer))
      )
      yield* asOperator(Effect.flatMap(Queue.Queue, (q) => q.enqueue([1, 2, 3].map((n) => ({ stage: "lim_rated", payload: { n } })))))
      yield* waitFor("the first job (the bucket's one token) to run", Effect.sync(() => ran.length >= 1))
      // the other two wait for a token an hour away: the pool is held back, its timer set for then
      const { stats } = yield* asOperator(Effect.map(Queue.Queue, (q) => ({ stats: q.stats })))
      yield* waitFor(
        "the stage to be rate limited",
        asOperator(stats).pipe(Effect.map((rows) => rows.find((r) => r.stage === "lim_rated")?.rateLimited === true), Effect.orDie)
      )
      expect(ran.length).toBe(1)
      yield* asOperator(Effect.flatMap(Queue.Queue, (q) => q.limits.clear("lim_rated")))
      // heard by NOTIFY: well within the deadline, where before the worker waited for its next token (an hour)
      yield* waitFor("the two held-back jobs to run once the limit is lifted", Effect.sync(() => ran.length === 3), Duration.minutes(2))
      expect([...ran].sort()).toEqual([1, 2, 3])
    }), { timeout: 300_000 })
})
