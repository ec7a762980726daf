/**
 * The event log's reader on real Postgres: a cursor never passes an event that a slower transaction commits
 * later (ids are handed out at write time, not at commit), events are read once each, tenants' filters keep to
 * their org, and pruning removes only what is past the retention.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Fiber, Layer } from "effect"
import * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { readAll, readPages } from "../support/eventLog.js"
import { deadline, waitFor } from "../support/waitFor.js"
import { completeAll } from "../support/settle.js"

const schema = freshSchemaName("eventlog")
const services = EventLog.layer.pipe(Layer.provideMerge(PgQueue.layer()), Layer.provideMerge(layerDb({ schema, poolMax: 4 })))

describe("the event log", () => {
  it.layer(services, { timeout: 60_000 })((it) => {
    it.scoped("an event written early by a transaction that commits late is read once, after the cursor has moved on", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const sql = rawSql(schema)
        yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
        const start = yield* log.now
        // a producer's transaction inserts a job (its event takes the lower id) and stays open
        const slow = yield* Effect.promise(() => sql.reserve())
        yield* Effect.addFinalizer(() => Effect.sync(() => slow.release()))
        yield* Effect.promise(() => slow`begin`)
        const [slowJob] = yield* Effect.promise(() => slow<Array<{ id: string }>>`insert into jobs (stage) values ('slow') returning id::text`)
        // another enqueue commits meanwhile (a higher id)
        const [fast] = yield* (yield* Queue.Queue).enqueue([{ stage: "fast" }])
        const first = yield* readPages(log, start)
        // read up to the oldest running transaction: neither yet, and the reader knows events wait
        expect(first.events).toEqual([])
        expect(first.held).toBe(true)
        yield* Effect.promise(() => slow`commit`)
        const second = yield* readAll(log, first.next)
        expect(second.events.map((e) => [e.jobId, e.kind])).toEqual([[slowJob!.id, "enqueued"], [fast!.id, "enqueued"]])
        expect((yield* readAll(log, second.next)).events).toEqual([])
      }))

    it.scoped("many writers at once: every event read exactly once, each job's in order", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const queue = yield* Queue.Queue
        let cursor = yield* log.now
        const seen: Array<EventLog.LoggedEvent> = []
        const writers = Effect.forEach(Array.from({ length: 8 }, (_, i) => i), (i) =>
          Effect.gen(function*() {
            for (let n = 0; n < 10; n++) {
              yield* queue.enqueue([{ stage: `w${i}` }, { stage: `w${i}` }])
              const claimed = yield* queue.claim(`w${i}`, 2, { workerId: `w${i}`, leaseFor: Duration.seconds(30) })
              yield* completeAll(queue, claimed.map((j) => ({ id: j.id, lease: j.lease })))
            }
          }), { concurrency: "unbounded", discard: true })
        const reader = Effect.gen(function*() {
          const r = yield* readPages(log, cursor)
          seen.push(...r.events)
          cursor = r.next
        })
        // one reader at a time (it owns the cursor): while the writers write, then the rest once they are done
        const reading = yield* Effect.fork(Effect.forever(reader))
        yield* writers
        yield* Fiber.interrupt(reading)
        yield* waitFor("every event read", Effect.map(reader, () => seen.length >= 8 * 10 * 2 * 3), deadline, Duration.millis(20))
        yield* reader
        expect(seen.length).toBe(8 * 10 * 2 * 3)
        expect(new Set(seen.map((e) => e.id)).size).toBe(seen.length)
        const byJob = new Map<string, Array<string>>()
        for (const e of seen) byJob.set(e.jobId, [...(byJob.get(e.jobId) ?? []), e.kind])
        expect([...byJob.values()].every((kinds) => kinds.join() === "enqueued,started,completed")).toBe(true)
      }))

    it.effect("an org's filter reads only its own events; resuming after another org's event id starts from now", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const queue = yield* Queue.Queue
        const start = yield* log.now
        const [a] = yield* queue.enqueue([{ stage: "tenancy", orgId: "org-a" }])
        const [b] = yield* queue.enqueue([{ stage: "tenancy", orgId: "org-b" }])
        const ofA = yield* readAll(log, start, { org: "org-a", stages: ["tenancy"] })
        expect(ofA.events.map((e) => e.jobId)).toEqual([a!.id])
        const bEvent = (yield* readAll(log, start, { org: "org-b", stages: ["tenancy"] })).events[0]!
        expect(bEvent.jobId).toBe(b!.id)
        // org A naming org B's event: nothing of B's, nothing before it either
        const resumed = yield* log.after(bEvent.id, { org: "org-a" })
        expect((yield* readAll(log, resumed, { org: "org-a", stages: ["tenancy"] })).events).toEqual([])
      }))

    it.effect("a bulk cancel logs each queued job it removes as cancelled, like a single cancel", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const queue = yield* Queue.Queue
        const stage = "bulk_cancel_logged"
        const start = yield* log.now
        const jobs = yield* queue.enqueue(Array.from({ length: 5 }, (_, n) => ({ stage, payload: { n, pick: n % 2 === 0 } })))
        const picked = jobs.filter((_, n) => n % 2 === 0).map((j) => j.id)
        const result = yield* queue.bulk.apply({ stage, payload: { pick: true } }, { kind: "cancel" }, { actor: "test", batch: 2 })
        expect(result.affected).toBe(picked.length)
        const cancelled = (yield* readAll(log, start, { stages: [stage], kinds: ["cancelled"] })).events
        expect(cancelled.map((e) => e.jobId).sort()).toEqual([...picked].sort())
      }))

    it.effect("pruning removes events past the retention and keeps the rest", () =>
      Effect.gen(function*() {
        const log = yield* EventLog.EventLog
        const queue = yield* Queue.Queue
        yield* queue.enqueue([{ stage: "pruned" }])
        expect(yield* log.prune(Duration.hours(1))).toBe(0)
        const before = (yield* readAll(log, EventLog.beginning)).events.length
        expect(before).toBeGreaterThan(0)
        expect(yield* log.prune(Duration.zero, { batch: 7 })).toBe(before)
        expect((yield* readAll(log, EventLog.beginning)).events).toEqual([])
      }))
  })
})
