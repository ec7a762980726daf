/**
 * The event log's NOTIFY has a channel of its own (migration 0027): a worker that follows no events hears one
 * notification per job (its stage's), not four (the stage's, and the log's for the enqueue, the claim and the
 * settle); a subscription hears the log's only while it follows them.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Layer, Redacted, Scope } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { freshSchema } from "../support/workerProcess.js"

const stage = "evch"

describe("the event log's notifications", () => {
  it.scopedLive("are heard only while a subscription follows them; a job's life is otherwise one notification", () =>
    Effect.gen(function*() {
      const { schema } = yield* freshSchema("evch", "select 1")
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
      const queue = yield* Effect.provide(Queue.Queue, yield* Layer.build(PgQueue.layer().pipe(Layer.provide(dbLayer))))
      const heard: Array<string> = []
      const listening = yield* queue.listen({ onWake: (topic) => void heard.push(topic), onListening: () => undefined })

      /** Enqueues, claims and completes one job; returns what was heard until its stage's NOTIFY and after. */
      const lifeOfAJob = Effect.gen(function*() {
        heard.length = 0
        yield* queue.enqueue([{ stage, payload: { n: 1 } }])
        // the stage's NOTIFY is sent after the log's for the same insert (its trigger logs first)
        yield* waitFor("the stage's NOTIFY", Effect.sync(() => heard.includes(stage)), Duration.seconds(60))
        const [job] = yield* queue.claim(stage, 1, { workerId: "evch-w", leaseFor: Duration.minutes(1) })
        expect(job).toBeDefined()
        yield* queue.settle([Queue.Outcome.complete(job!)])
        // a marker after the claim's and the settle's commits: what they NOTIFY arrives before it
        yield* listening.notify("evch:marker")
        yield* waitFor("the marker", Effect.sync(() => heard.includes("evch:marker")), Duration.seconds(60))
        return heard.filter((t) => t !== "evch:marker")
      })

      // a worker that follows nothing: one notification for the job's whole life
      expect(yield* lifeOfAJob).toEqual([stage])

      // following: the log's notification for the enqueue, the claim and the settle as well
      const following = yield* Scope.make()
      yield* Scope.extend(listening.followEvents, following)
      const whileFollowing = yield* lifeOfAJob
      expect(whileFollowing.filter((t) => t === Queue.eventsTopic)).toHaveLength(3)
      expect(whileFollowing.filter((t) => t !== Queue.eventsTopic)).toEqual([stage])

      // no longer following: back to one
      yield* Scope.close(following, Exit.void)
      expect(yield* lifeOfAJob).toEqual([stage])
    }), { timeout: 300_000 })
})
