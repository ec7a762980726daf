/**
 * The dashboard's events page over HTTP, on a real server, worker and PostgreSQL: an org key sees its own org's
 * newest events from the event log, newest last, narrowed by stage and kind, and never another org's; an unknown
 * kind is a 400 that names the known ones; an operator sees every org's, or one org's.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { call, freshService } from "../http/support.js"
import { waitFor } from "../support/waitFor.js"
import { signIn } from "./signIn.js"

/** The rows of the events table, in page order: [event id, kind, job id]. */
const rows = (text: string) =>
  [...text.matchAll(/<tr data-event="(\d+)">\s*<td>\d+<\/td><td>[^<]*<\/td><td><span class="badge \w+">(\w+)<\/span><\/td>.*?href="\/dashboard\/jobs\/(\d+)"/gs)]
    .map((m) => ({ id: m[1]!, kind: m[2]!, jobId: m[3]! }))

describe("dashboard: events page", () => {
  it.scopedLive("an org's newest events, newest last, by stage and kind; never another org's; an operator's every org", () =>
    Effect.gen(function*() {
      const service = yield* freshService("dashevents")
      const keyA = yield* service.key({ orgId: "org-a" })
      const keyB = yield* service.key({ orgId: "org-b" })
      const keyOps = yield* service.key({ admin: true, name: "ops" })
      const base = yield* service.start()
      const a = yield* signIn(base, keyA, "/events")
      const b = yield* signIn(base, keyB, "/events")
      const ops = yield* signIn(base, keyOps, "/events")

      const empty = yield* a.get("/events")
      expect(empty.status).toBe(200)
      expect(empty.text).toContain(`<a href="/dashboard/events" aria-current="page">Events</a>`)
      expect(empty.text).toContain("no events match")

      const jobA = (yield* call(base, "POST", "/jobs", { key: keyA, body: { stage: "echo", payload: { n: 1 } } })).json.id as string
      const jobB = (yield* call(base, "POST", "/jobs", { key: keyB, body: { stage: "echo", payload: { n: 2 } } })).json.id as string
      // `manual` runs nowhere: its job is enqueued and stays so
      const parked = (yield* call(base, "POST", "/jobs", { key: keyA, body: { stage: "manual", payload: { n: 3 } } })).json.id as string

      const page = yield* waitFor("org A's echo job to have completed on the events page", Effect.map(a.get("/events"), (p) =>
        rows(p.text).some((r) => r.jobId === jobA && r.kind === "completed") ? p : undefined))
      const seen = rows(page.text)
      // only org A's jobs; its echo job's life in order, newest last
      expect(new Set(seen.map((r) => r.jobId))).toEqual(new Set([jobA, parked]))
      expect(seen.filter((r) => r.jobId === jobA).map((r) => r.kind)).toEqual(["enqueued", "started", "completed"])
      const ids = seen.map((r) => BigInt(r.id))
      expect(ids).toEqual([...ids].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0)))

      // narrowed by kind and by stage
      expect(rows((yield* a.get("/events?kind=completed")).text).map((r) => [r.jobId, r.kind])).toEqual([[jobA, "completed"]])
      expect(rows((yield* a.get("/events?stage=manual")).text).map((r) => [r.jobId, r.kind])).toEqual([[parked, "enqueued"]])
      const unknown = yield* a.get("/events?kind=exploded")
      expect(unknown.status).toBe(400)
      expect(unknown.text).toContain("unknown event kind exploded; known: enqueued, started")

      // org B sees its own; an operator every org's, or one
      yield* waitFor("org B's echo job to have completed", Effect.map(b.get("/events?kind=completed"), (p) =>
        rows(p.text).some((r) => r.jobId === jobB)))
      expect(new Set(rows((yield* b.get("/events")).text).map((r) => r.jobId))).toEqual(new Set([jobB]))
      expect(new Set(rows((yield* ops.get("/events")).text).map((r) => r.jobId))).toEqual(new Set([jobA, jobB, parked]))
      expect(new Set(rows((yield* ops.get("/events?org=org-b")).text).map((r) => r.jobId))).toEqual(new Set([jobB]))
    }), { timeout: 180_000 })
})
