/**
 * Operator keys and the dashboard's data: `keys create --admin` makes a key of admin scope that signs in to
 * the dashboard for every org but acts on the HTTP API only for an org it names; the per-minute counts are
 * written from the job-events bus in one upsert; twenty live viewers share the snapshots of one.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Chunk, Duration, Effect, Fiber, Layer, Option, Redacted, Stream } from "effect"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Live from "../../packages/service/src/dashboard/Live.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Reads from "../../packages/pgfiber/src/queue/Reads.js"
import * as Events from "../../packages/pgfiber/src/runtime/Events.js"
import * as MinuteStats from "../../packages/pgfiber/src/runtime/MinuteStats.js"
import { pgfiber, query } from "../http/support.js"
import { layerDb } from "../support/pg.js"

const services = Layer.mergeAll(ApiKeys.layer, Reads.layer, PgQueue.layer({ knownStages: ["echo"] })).pipe(
  Layer.provideMerge(Layer.merge(layerDb(), Events.layer()))
)

describe("operator keys and the dashboard's data", () => {
  layer(services, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("an admin key signs in for every org; on the API it acts only for the org it names", () =>
      Effect.gen(function*() {
        const keys = yield* ApiKeys.ApiKeys
        const bare = yield* keys.create({ admin: true, name: "ops" })
        expect(bare.key).toMatchObject({ scope: "admin", orgId: null })
        expect(yield* keys.verify(bare.token)).toEqual(Option.none())
        expect(yield* keys.verifyViewer(bare.token)).toEqual(Option.some({ keyId: bare.key.id, orgId: null, admin: true }))

        const named = yield* keys.create({ admin: true, orgId: "acme" })
        expect(yield* keys.verify(named.token)).toEqual(Option.some({ keyId: named.key.id, orgId: "acme" }))
        const org = yield* keys.create({ orgId: "globex" })
        expect(yield* keys.verifyViewer(org.token)).toEqual(Option.some({ keyId: org.key.id, orgId: "globex", admin: false }))
        expect((yield* Effect.flip(keys.create({}))).message).toContain("needs an org")

        expect(yield* keys.isLive(bare.key.id)).toBe(true)
        yield* keys.revoke(bare.key.prefix)
        expect(yield* keys.isLive(bare.key.id)).toBe(false)
        expect(yield* keys.verifyViewer(Redacted.make(Redacted.value(bare.token)))).toEqual(Option.none())
      }))

    it.effect("keys create --admin on the command line; without --org or --admin it refuses", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [admin, none] = yield* Effect.all([
          pgfiber(schema, ["keys", "create", "--admin", "--json"]),
          pgfiber(schema, ["keys", "create"])
        ], { concurrency: 2 })
        expect(admin.code).toBe(0)
        expect(JSON.parse(admin.stdout)).toMatchObject({ scope: "admin", orgId: null })
        expect(none.code).not.toBe(0)
        expect(none.stderr).toContain("needs an org")
        const list = yield* pgfiber(schema, ["keys", "list"])
        expect(list.stdout).toMatch(/SCOPE/)
        expect(list.stdout).toMatch(/\badmin\b/)
      }))

    it.scoped("the per-minute counts come from the job events and are written in one upsert that adds up", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const bus = yield* Events.JobEvents
        const stats = yield* MinuteStats.make({ flushInterval: Duration.hours(1), keep: Duration.hours(24) })
        while (!bus.active()) yield* Effect.sleep("10 millis")
        const at = new Date()
        const base = { stage: "echo", attempt: 1, at }
        const counts = query<Record<string, unknown>>(schema,
          "select org_key, completed, retried, dead_lettered, runs, round(run_ms_sum)::int as run_ms_sum, round(run_ms_max)::int as run_ms_max from job_stats_minute order by org_key")
        /** Flushes until the table shows `expected` (the subscriber counts the events on its own fiber). */
        const flushedTo = (expected: ReadonlyArray<Record<string, unknown>>) =>
          Effect.gen(function*() {
            for (let i = 0; i < 300; i++) {
              yield* stats.flush
              const rows = yield* counts
              if (JSON.stringify(rows) === JSON.stringify(expected)) return rows
              yield* Effect.sleep("100 millis")
            }
            return yield* counts
          })
        bus.publish([
          { ...base, _tag: "Completed", jobId: "1", orgId: "acme", seconds: 0.01 },
          { ...base, _tag: "Completed", jobId: "2", orgId: "acme", seconds: 0.03 },
          { ...base, _tag: "Retried", jobId: "3", orgId: null, seconds: 0.02, delayMs: 10, error: { tag: "Transient", message: "x" } },
          { ...base, _tag: "Started", jobId: "4", orgId: "acme", workerId: "w" }
        ])
        const first = [
          { org_key: "", completed: 0, retried: 1, dead_lettered: 0, runs: 1, run_ms_sum: 20, run_ms_max: 20 },
          { org_key: "acme", completed: 2, retried: 0, dead_lettered: 0, runs: 2, run_ms_sum: 40, run_ms_max: 30 }
        ]
        expect(yield* flushedTo(first)).toEqual(first)
        // a second flush in the same minute adds to the row
        bus.publish([{ ...base, _tag: "DeadLettered", jobId: "5", orgId: "acme", seconds: null, error: { tag: "Permanent", message: "y" } }])
        const second = [first[0]!, { ...first[1]!, dead_lettered: 1 }]
        expect(yield* flushedTo(second)).toEqual(second)
      }))

    it.scoped("twenty live viewers share the snapshots one statement takes for all of them", () =>
      Effect.gen(function*() {
        const live = yield* Live.make({ minInterval: Duration.millis(500), idleInterval: Duration.seconds(30), minutes: 60 })
        const fibers = yield* Effect.forEach(Array.from({ length: 20 }), () =>
          Effect.fork(Stream.runCollect(Stream.take(live.changes(), 1))), { concurrency: "unbounded" })
        const firsts = yield* Effect.forEach(fibers, Fiber.join)
        expect(firsts.map((c) => Chunk.size(c))).toEqual(Array.from({ length: 20 }, () => 1))
        // the first snapshot served every viewer; later joins are coalesced into at most one more per interval
        expect(yield* live.statements).toBeLessThanOrEqual(3)
      }))
  })
})
