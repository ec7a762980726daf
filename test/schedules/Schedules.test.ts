/**
 * Schedules: the timing rules (cron in a time zone, DST gaps and overlaps, intervals), and one scenario run
 * against both stores with time passed as a parameter (Postgres: `at` in the SQL; memory: the same), then
 * the whole runtime on the in-memory queue under TestClock: the Scheduler firing ticks as Waker due times.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Duration, Effect, Either, Exit, Layer, Scope, TestClock } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as MemorySchedules from "../../packages/pgfiber/src/queue/MemorySchedules.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Schedules from "../../packages/pgfiber/src/queue/Schedules.js"
import * as Scheduler from "../../packages/pgfiber/src/runtime/Scheduler.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { layerDb } from "../support/pg.js"
import { settle } from "../support/memoryRuntime.js"

const iso = (d: Date | null | undefined) => d?.toISOString() ?? null
const at = (text: string) => new Date(text)

const ticksBetween = (spec: { cron?: string; everyMs?: number; timeZone?: string }, from: string, to: string) => {
  const t = Either.getOrThrow(Schedules.timing({ cron: spec.cron ?? null, everyMs: spec.everyMs ?? null, timeZone: spec.timeZone ?? "UTC" }))
  const out: Array<string> = []
  for (let d = t.next(at(from)); d !== null && d.getTime() <= at(to).getTime(); d = t.next(d)) out.push(d.toISOString())
  return out
}

describe("schedule timing", () => {
  it("a 02:30 daily schedule in Europe/Berlin runs once on the spring-forward day, at 03:00 local (01:00 UTC)", () => {
    expect(ticksBetween({ cron: "30 2 * * *", timeZone: "Europe/Berlin" }, "2026-03-28T00:00:00Z", "2026-03-31T00:00:00Z")).toEqual([
      "2026-03-28T01:30:00.000Z", // 02:30 CET
      "2026-03-29T01:00:00.000Z", // 02:30 does not exist: once, when the clock has jumped to 03:00 CEST
      "2026-03-30T00:30:00.000Z" // 02:30 CEST
    ])
  })

  it("a 02:30 daily schedule runs once on the fall-back day, at the first of the two 02:30s", () => {
    expect(ticksBetween({ cron: "30 2 * * *", timeZone: "Europe/Berlin" }, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z")).toEqual([
      "2026-10-25T00:30:00.000Z", // 02:30 CEST; the second 02:30 (CET, 01:30 UTC) does not run
      "2026-10-26T01:30:00.000Z"
    ])
  })

  it("an every-30-minutes expression skips the gap and runs on both passes of the repeated hour", () => {
    expect(ticksBetween({ cron: "*/30 * * * *", timeZone: "America/New_York" }, "2026-03-08T06:00:00Z", "2026-03-08T08:00:00Z")).toEqual([
      "2026-03-08T06:30:00.000Z", // 01:30 EST
      "2026-03-08T07:00:00.000Z", // 03:00 EDT: 02:00 and 02:30 do not exist
      "2026-03-08T07:30:00.000Z",
      "2026-03-08T08:00:00.000Z"
    ])
    expect(ticksBetween({ cron: "*/30 * * * *", timeZone: "America/New_York" }, "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z")).toEqual([
      "2026-11-01T05:30:00.000Z", // 01:30 EDT
      "2026-11-01T06:00:00.000Z", // 01:00 EST
      "2026-11-01T06:30:00.000Z", // 01:30 EST, again
      "2026-11-01T07:00:00.000Z"
    ])
  })

  it("the same expression in two zones ticks at different instants; 6 fields have seconds first; intervals align to the epoch", () => {
    expect(ticksBetween({ cron: "0 9 * * 1", timeZone: "Asia/Tokyo" }, "2026-06-01T00:00:00Z", "2026-06-09T00:00:00Z"))
      .toEqual(["2026-06-08T00:00:00.000Z"])
    expect(ticksBetween({ cron: "0 9 * * 1", timeZone: "America/Los_Angeles" }, "2026-06-01T00:00:00Z", "2026-06-09T00:00:00Z"))
      .toEqual(["2026-06-01T16:00:00.000Z", "2026-06-08T16:00:00.000Z"])
    expect(ticksBetween({ cron: "*/20 * * * * *" }, "2026-06-01T00:00:00Z", "2026-06-01T00:01:00Z"))
      .toEqual(["2026-06-01T00:00:20.000Z", "2026-06-01T00:00:40.000Z", "2026-06-01T00:01:00.000Z"])
    expect(ticksBetween({ everyMs: 90_000 }, "2026-06-01T00:00:10Z", "2026-06-01T00:04:00Z"))
      .toEqual(["2026-06-01T00:01:30.000Z", "2026-06-01T00:03:00.000Z"])
  })

  it("refuses a bad expression, a bad zone, both or neither of cron and interval, with the field named", () => {
    const now = at("2026-06-01T00:00:00Z")
    const field = (spec: Partial<Schedules.ScheduleSpec>) =>
      Either.match(Schedules.validate({ name: "s", stage: "st", ...spec }, now), { onLeft: (e) => e.field, onRight: () => "ok" })
    expect(field({ cron: "* * *" })).toBe("cron")
    expect(field({ cron: "61 * * * *" })).toBe("cron")
    expect(field({ cron: "* * * * * * *" })).toBe("cron")
    expect(field({ cron: "* * * * *", timeZone: "Mars/Olympus" })).toBe("timeZone")
    expect(field({ cron: "* * * * *", everyMs: 5000 })).toBe("cron")
    expect(field({})).toBe("cron")
    expect(field({ everyMs: 10 })).toBe("every")
    expect(field({ cron: "* * * * *", name: "bad name" })).toBe("name")
    expect(field({ cron: "* * * * *", catchUp: "backfill", backfillLimit: 0 })).toBe("backfillLimit")
    expect(field({ cron: "* * * * *" })).toBe("ok")
  })

  it("catch-up: skip fires only the latest missed tick, backfill the latest N; a long outage is counted, not walked", () => {
    const base = { cron: "* * * * *", everyMs: null, timeZone: "UTC", nextTickAt: at("2026-06-01T00:00:00Z") }
    const skip = Either.getOrThrow(Schedules.firing({ ...base, backfillLimit: 1 }, at("2026-06-01T00:05:30Z")))
    expect(skip.ticks.map(iso)).toEqual(["2026-06-01T00:05:00.000Z"])
    expect([skip.skipped, iso(skip.nextTickAt)]).toEqual([5, "2026-06-01T00:06:00.000Z"])
    const backfill = Either.getOrThrow(Schedules.firing({ ...base, backfillLimit: 3 }, at("2026-06-01T00:05:30Z")))
    expect(backfill.ticks.map(iso)).toEqual(["2026-06-01T00:03:00.000Z", "2026-06-01T00:04:00.000Z", "2026-06-01T00:05:00.000Z"])
    const year = Either.getOrThrow(Schedules.firing({ ...base, cron: "* * * * * *", backfillLimit: 2 }, at("2027-06-01T00:00:00.5Z")))
    expect(year.ticks.map(iso)).toEqual(["2027-05-31T23:59:59.000Z", "2027-06-01T00:00:00.000Z"])
    expect(iso(year.nextTickAt)).toBe("2027-06-01T00:00:01.000Z")
  })
})

// ---------------------------------------------------------------------------------------------------------
// one scenario, two stores, time passed in

const scenario = (name: string, layer_: Layer.Layer<Schedules.Schedules | Queue.Queue>) =>
  layer(layer_, { timeout: 180_000 })(name, (it) => {
    it.effect("fires each tick once at the time given, across DST, and never twice for concurrent callers", () =>
      Effect.gen(function*() {
        const schedules = yield* Schedules.Schedules
        const queue = yield* Queue.Queue
        const stage = `dst_${name.toLowerCase()}`
        yield* schedules.put({
          name: "nightly",
          stage,
          cron: "30 2 * * *",
          timeZone: "Europe/Berlin",
          payload: { report: "daily" },
          startAfter: at("2026-03-28T12:00:00Z")
        })
        const fire = (text: string) =>
          Effect.map(schedules.fireDue(at(text)), (r) => r.fired.filter((f) => f.name === "nightly").flatMap((f) => f.ticks.map(iso)))
        expect(yield* fire("2026-03-29T00:59:59Z")).toEqual([])
        // eight callers at the same instant: one job
        const all = yield* Effect.all(Array.from({ length: 8 }, () => fire("2026-03-29T01:00:00Z")), { concurrency: "unbounded" })
        expect(all.flat()).toEqual(["2026-03-29T01:00:00.000Z"])
        expect(yield* fire("2026-03-29T02:00:00Z")).toEqual([]) // 03:30 local: nothing more that day
        const jobs = yield* queue.list({ stage })
        expect(jobs.map((j) => [j.dedupeKey, j.payload])).toEqual([
          ["schedule::nightly:2026-03-29T01:00:00.000Z", { report: "daily" }]
        ])
        const s = (yield* schedules.get({ name: "nightly" }))!
        expect([iso(s.nextTickAt), iso(s.lastTickAt)]).toEqual(["2026-03-30T00:30:00.000Z", "2026-03-29T01:00:00.000Z"])
        // three days down with `skip`: the latest tick only
        expect(yield* fire("2026-04-02T06:00:00Z")).toEqual(["2026-04-02T00:30:00.000Z"])
      }))

    it.effect("disable stops the ticks; enable resumes from the next tick after now; run-now makes one job; remove", () =>
      Effect.gen(function*() {
        const schedules = yield* Schedules.Schedules
        const queue = yield* Queue.Queue
        const stage = `toggle_${name.toLowerCase()}`
        yield* schedules.put({ name: "toggle", stage, everyMs: 60_000, orgId: "org-a", catchUp: "backfill", backfillLimit: 5 })
        const disabled = yield* schedules.setEnabled({ name: "toggle", orgId: "org-a" }, false)
        expect(disabled.enabled).toBe(false)
        const far = new Date(disabled.nextTickAt.getTime() + 10 * 60_000)
        expect((yield* schedules.fireDue(far)).fired.filter((f) => f.name === "toggle")).toEqual([])
        const enabled = yield* schedules.setEnabled({ name: "toggle", orgId: "org-a" }, true)
        expect(enabled.enabled).toBe(true)
        const ran = yield* schedules.runNow({ name: "toggle", orgId: "org-a" })
        const job = (yield* queue.get(ran.id))!
        expect([job.stage, job.orgId]).toEqual([stage, "org-a"])
        expect(yield* Effect.either(schedules.runNow({ name: "toggle" }))).toMatchObject({ left: { _tag: "ScheduleNotFound" } })
        expect((yield* schedules.list({ orgId: "org-a" })).map((s) => s.name)).toEqual(["toggle"])
        yield* schedules.remove({ name: "toggle", orgId: "org-a" })
        expect(yield* schedules.get({ name: "toggle", orgId: "org-a" })).toBeNull()
        expect(yield* Effect.either(schedules.remove({ name: "toggle", orgId: "org-a" }))).toMatchObject({ left: { _tag: "ScheduleNotFound" } })
      }))

    it.effect("a code declaration is inserted once; an operator's change survives an unchanged declaration; a changed one wins", () =>
      Effect.gen(function*() {
        const schedules = yield* Schedules.Schedules
        const spec = { name: "declared", stage: "housekeeping_x", cron: "*/5 * * * *" } as const
        yield* schedules.declare([spec])
        yield* schedules.setEnabled({ name: "declared" }, false)
        yield* schedules.declare([spec]) // a restart
        const kept = (yield* schedules.get({ name: "declared" }))!
        expect([kept.enabled, kept.cron, kept.source]).toEqual([false, "*/5 * * * *", "code"])
        yield* schedules.declare([{ ...spec, cron: "*/10 * * * *" }]) // a deploy that changes it
        const changed = (yield* schedules.get({ name: "declared" }))!
        expect([changed.enabled, changed.cron]).toEqual([false, "*/10 * * * *"])
      }))
  })

scenario("Memory", MemorySchedules.layer.pipe(Layer.provideMerge(MemoryQueue.layer())))
scenario("Postgres", PgSchedules.layer.pipe(Layer.provideMerge(PgQueue.layer()), Layer.provide(layerDb({ poolMax: 10 }))))

// ---------------------------------------------------------------------------------------------------------
// the runtime under TestClock


describe("the Scheduler in a worker, on the in-memory queue and TestClock", () => {
  // no stage pools run here (their heartbeat and watchdog loops would make days of TestClock slow): the jobs
  // stay queued, and each one's createdAt is the TestClock instant the Waker's timer fired its tick
  it.effect("a daily 02:30 Europe/Berlin schedule makes one job a day through the spring-forward night, each at its tick", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(at("2026-03-27T12:00:00Z").getTime())
      const scope = yield* Scope.make()
      const options: Worker.WorkerOptions = { ...Worker.defaults(), workerId: "clock", sweepInterval: Duration.hours(1) }
      const context = yield* Layer.buildWithScope(
        Scheduler.layer([{ name: "nightly", stage: "report", cron: "30 2 * * *", timeZone: "Europe/Berlin" }]).pipe(
          Layer.provide(MemorySchedules.layer),
          Layer.provideMerge(Worker.layer([], options)),
          Layer.provideMerge(MemoryQueue.layer())
        ),
        scope
      )
      const queue = Context.get(context, Queue.Queue)
      yield* settle
      for (let hour = 0; hour < 4 * 24; hour++) {
        yield* TestClock.adjust("1 hour")
        yield* settle
      }
      const jobs = yield* queue.list({ stage: "report" })
      expect(jobs.map((j) => [iso(j.createdAt), j.dedupeKey])).toEqual([
        ["2026-03-28T01:30:00.000Z", "schedule::nightly:2026-03-28T01:30:00.000Z"],
        ["2026-03-29T01:00:00.000Z", "schedule::nightly:2026-03-29T01:00:00.000Z"], // 03:00 CEST, once
        ["2026-03-30T00:30:00.000Z", "schedule::nightly:2026-03-30T00:30:00.000Z"],
        ["2026-03-31T00:30:00.000Z", "schedule::nightly:2026-03-31T00:30:00.000Z"]
      ])
      yield* Scope.close(scope, Exit.void)
    }))
})
