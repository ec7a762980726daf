/**
 * The process's shared reader of the event log (runtime/EventReader.ts) on real Postgres: several followers in one
 * process, with different filters and starting points, are fed by one read per wake-up (the statements the
 * process sends are the reader's reads, not one per follower), and each still gets every event it asked for,
 * once, each job's in order.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Redacted, Stream } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as EventFeed from "../../packages/pgfiber/src/runtime/EventFeed.js"
import { databaseUrl, freshSchemaName } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { freshSchema } from "../support/workerProcess.js"
import { completeAll } from "../support/settle.js"

/** The event log's reads (every one names the snapshot's horizon). */
const isRead = (query: string) => query.includes("with horizon as")
/** A follower taking its cursor "from now" (EventsSql.horizon). */
const isNow = (query: string) => !isRead(query) && query.includes("pg_snapshot_xmin")

describe("the shared event reader", () => {
  it.scopedLive("several followers in one process share one reader, and each gets every event it asked for once, in order per job", () =>
    Effect.gen(function*() {
      const { schema } = yield* freshSchema(freshSchemaName("evreader"), "select 1")
      let reads = 0
      let nows = 0
      const onStatement = (q: string) => {
        if (isRead(q)) reads++
        if (isNow(q)) nows++
      }
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4, onStatement }))
      const services = yield* Layer.build(
        EventFeed.layer.pipe(Layer.provideMerge(Layer.mergeAll(PgQueue.layer(), EventLog.layer)), Layer.provideMerge(dbLayer))
      )
      const feed = Context.get(services, EventFeed.EventFeed)
      const queue = Context.get(services, Queue.Queue)

      // some history, for the follower that starts from the beginning
      const [early] = yield* queue.enqueue([{ stage: "early" }])
      // "now" is the oldest transaction still running on the server (EventsSql.horizon): another test's open
      // transaction on a shared server holds it back, and a follower "from now" would rightly get the early job
      // too. Start the followers once the early job's row is behind the horizon.
      const db = Context.get(services, Db.Db)
      yield* waitFor("the early job's event behind the horizon", Effect.promise(() =>
        db.pool<Array<{ behind: boolean }>>`
          select not exists (select 1 from job_events e where e.tx >= pg_snapshot_xmin(pg_current_snapshot())) as behind`
      ).pipe(Effect.map(([r]) => r!.behind)))
      const follow = (filter: EventLog.Filter, from: EventFeed.FollowOptions["from"]) =>
        Effect.gen(function*() {
          const seen: Array<EventLog.LoggedEvent> = []
          yield* feed.follow(filter, { from }).pipe(
            Stream.runForEach((e) => Effect.sync(() => seen.push(e))),
            Effect.forkScoped
          )
          return seen
        })
      const all = yield* follow({}, "now")
      yield* waitFor("the first follower to be fed", Effect.sync(() => feed.fed() === 1))
      const ownReads = feed.ownReads
      // a follower "from now" that comes while another is fed starts at the reader's place: no statement of its own
      const [ownBefore, nowsBefore] = [ownReads(), nows]
      const fromNow = yield* follow({}, "now")
      yield* waitFor("the second follower to be fed", Effect.sync(() => feed.fed() === 2))
      expect([ownReads(), nows]).toEqual([ownBefore, nowsBefore])
      const someStages = yield* follow({ stages: ["s0", "s2"] }, "now")
      const fromBeginning = yield* follow({}, "beginning")
      // the one from the beginning catches up by itself first
      yield* waitFor("all four to be fed", Effect.sync(() => feed.fed() === 4))
      const [ownBeforeWork, sharedBefore] = [ownReads(), feed.reads()]

      const writers = Effect.forEach([0, 1, 2, 3], (i) =>
        Effect.gen(function*() {
          // a stage each: a writer's claim takes the jobs it enqueued
          const stage = `s${i}`
          for (let n = 0; n < 8; n++) {
            yield* queue.enqueue([{ stage }, { stage }, { stage }])
            const claimed = yield* queue.claim(stage, 3, { workerId: `w${i}`, leaseFor: Duration.seconds(30) })
            yield* completeAll(queue, claimed.map((j) => ({ id: j.id, lease: j.lease })))
          }
        }), { concurrency: "unbounded", discard: true })
      yield* writers
      const completedIn = (seen: ReadonlyArray<EventLog.LoggedEvent>) => new Set(seen.filter((e) => e.kind === "completed").map((e) => e.jobId))
      // 4 writers × 8 rounds × 3 jobs, half of them in s0 and s2
      yield* waitFor("every follower to see every job completed", Effect.sync(() =>
        completedIn(all).size === 96 && completedIn(fromNow).size === 96 && completedIn(fromBeginning).size === 96 &&
        completedIn(someStages).size === 48
      ))

      // every read while they followed was the shared reader's: one per wake-up for the four of them
      expect(feed.reads() - sharedBefore).toBeGreaterThan(0)
      expect(ownReads()).toBe(ownBeforeWork)
      // and the statements the process sent are those reads, none besides (counted as they are sent, so waited for)
      yield* waitFor("every read counted as sent", Effect.sync(() => reads === feed.reads() + ownReads()))

      const lives = (seen: ReadonlyArray<EventLog.LoggedEvent>) => {
        const byJob = new Map<string, Array<string>>()
        for (const e of seen) byJob.set(e.jobId, [...(byJob.get(e.jobId) ?? []), e.kind])
        return byJob
      }
      for (const seen of [all, fromNow, fromBeginning, someStages]) {
        // once each (the log's order is by transaction, then id: ids need not rise), each job's in order
        expect(new Set(seen.map((e) => e.id)).size).toBe(seen.length)
        for (const [jobId, kinds] of lives(seen)) {
          if (jobId === early!.id) continue
          expect(kinds).toEqual(["enqueued", "started", "completed"])
        }
      }
      expect(someStages.every((e) => e.stage === "s0" || e.stage === "s2")).toBe(true)
      // the one from the beginning also has what came before it started
      expect(fromBeginning.filter((e) => e.jobId === early!.id).map((e) => e.kind)).toEqual(["enqueued"])
      expect(all.some((e) => e.jobId === early!.id)).toBe(false)
    }), { timeout: 120_000 })
})
