/**
 * The rows' schemas (Rows.ts): the claim's hand-written check answers as the Tuple's Schema does, and the table
 * rows decode to the model or fail (never a cast).
 */
import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import * as Rows from "../../packages/pgfiber/src/queue/Rows.js"

const now = Date.UTC(2026, 10, 27, 12)
const claimed = (): Array<unknown> => [
  "42", "calls.transcribe", "org-1", "call-7", { callId: "call-7" }, 50, "running", 1, 5, 0,
  now - 1000, "worker-1", now + 30_000, 2, null,
  [{ attempt: 1, at: "2026-11-27T11:59:00.000Z", tag: "Transient", message: "timeout", worker: "worker-1" }],
  "timeout", now - 60_000, now, now - 5000, 812.5, null, null, null
]

const schemaAnswer = (a: unknown) => Either.isRight(Schema.decodeUnknownEither(Rows.ClaimedRow)(a))
const handAnswer = (a: unknown) => Either.isRight(Rows.decodeClaimed(a))

describe("Rows.decodeClaimed", () => {
  it("decodes a claimed job as the Tuple's Schema does, to the same Job", () => {
    const a = claimed()
    const bySchema = Schema.decodeUnknownSync(Rows.JobFromClaimed)(a)
    const byHand = Rows.jobFromClaimed(Either.getOrThrow(Rows.decodeClaimed(a)))
    expect(byHand).toEqual(bySchema)
    expect(byHand.availableAt).toEqual(new Date(now - 1000))
    expect(byHand.errors).toEqual([{ attempt: 1, at: "2026-11-27T11:59:00.000Z", tag: "Transient", message: "timeout", worker: "worker-1" }])
  })

  it("reads an error entry's null worker (the reaper's, for a lease no worker held) as absent, as the Schema does", () => {
    const a = claimed()
    a[15] = [{ attempt: 1, at: "2026-11-27T11:59:00.000Z", tag: "LeaseExpired", message: "lease expired", worker: null }]
    const byHand = Rows.jobFromClaimed(Either.getOrThrow(Rows.decodeClaimed(a)))
    expect(byHand.errors).toEqual([{ attempt: 1, at: "2026-11-27T11:59:00.000Z", tag: "LeaseExpired", message: "lease expired" }])
    expect(byHand).toEqual(Schema.decodeUnknownSync(Rows.JobFromClaimed)(a))
  })

  it("refuses what the Schema refuses, field by field", () => {
    const wrong: ReadonlyArray<readonly [number, unknown]> = [
      [0, 42], [0, "x1"], [1, null], [2, 7], [5, "50"], [6, "completed"], [7, null], [10, null], [10, "2026-11-27"],
      [12, "soon"], [13, null], [15, "[]"], [15, [{ attempt: "1", at: "", tag: "", message: "" }]], [15, [null]],
      [15, [{ attempt: 1, at: "", tag: "", message: "", worker: 3 }]], [17, null], [19, "x"], [20, "1"], [23, "1"]
    ]
    for (const [i, value] of wrong) {
      const a = claimed()
      a[i] = value
      expect([i, handAnswer(a)]).toEqual([i, false])
      expect([i, schemaAnswer(a)]).toEqual([i, false])
    }
    expect(handAnswer(claimed().slice(0, 23))).toBe(false)
    expect(schemaAnswer(claimed().slice(0, 23))).toBe(false)
    expect(handAnswer({})).toBe(false)
    // what may be null is accepted by both
    const a = claimed()
    for (const i of [2, 3, 11, 12, 14, 15, 16, 19, 20, 21, 22, 23]) a[i] = null
    expect(handAnswer(a)).toBe(true)
    expect(schemaAnswer(a)).toBe(true)
  })
})

describe("Rows' table schemas", () => {
  const liveRow = {
    id: "7", stage: "s", org_id: null, subject_id: null, payload: {}, priority: 50, status: "waiting", attempts: 0,
    max_attempts: 5, polls: 0, available_at: new Date(now), locked_by: null, locked_until: null, lease: 0, dedupe_key: null,
    errors: [], last_error: null, created_at: new Date(now), updated_at: new Date(now), started_at: null, last_run_ms: null,
    progress: null, progress_message: null, timeout_ms: null, waiting_on: 2, batch_id: "3", has_dependents: null
  }

  it("decodes a jobs row to a live Job; its waiting count only while it waits", () => {
    const job = Schema.decodeUnknownSync(Rows.JobFromLiveRow)(liveRow)
    expect(job).toMatchObject({ id: "7", status: "waiting", waitingOn: 2, batchId: "3", finishedAt: null, output: null })
    expect(Schema.decodeUnknownSync(Rows.JobFromLiveRow)({ ...liveRow, status: "queued", waiting_on: 0 }).waitingOn).toBe(null)
  })

  it("refuses a row whose column is not of its kind", () => {
    expect(Either.isLeft(Schema.decodeUnknownEither(Rows.JobFromLiveRow)({ ...liveRow, status: "completed" }))).toBe(true)
    expect(Either.isLeft(Schema.decodeUnknownEither(Rows.JobFromLiveRow)({ ...liveRow, created_at: "2026-11-27" }))).toBe(true)
    expect(Either.isLeft(Schema.decodeUnknownEither(Rows.JobFromLiveRow)({ ...liveRow, id: 7 }))).toBe(true)
  })

  it("decodes a history row: its finishing instant stands in for its run time and last change", () => {
    const finished = new Date(now + 1000)
    const job = Schema.decodeUnknownSync(Rows.JobFromArchivedRow)({
      id: "8", stage: "s", org_id: "o", subject_id: null, payload: { a: 1 }, priority: 10, status: "completed", attempts: 0,
      max_attempts: 5, polls: 0, dedupe_key: null, errors: [], last_error: null, output: { ok: true }, progress: null,
      progress_message: null, timeout_ms: null, created_at: new Date(now), started_at: new Date(now), finished_at: finished,
      last_run_ms: 3.5, keep_until: new Date(now + 1e6)
    })
    expect(job).toMatchObject({ status: "completed", availableAt: finished, updatedAt: finished, finishedAt: finished, output: { ok: true }, lease: 0 })
  })

  it("reads a limits override's bigint column (text) as a number", () => {
    expect(Schema.decodeUnknownSync(Rows.OverrideFromRow)({
      stage: "s", fair: null, max_running: 3, max_running_per_org: null, rate_limit: 10, rate_per_ms: "60000", rate_burst: 10,
      rate_per_org: false, updated_at: new Date(now)
    })).toEqual({ fair: null, maxRunning: 3, maxRunningPerOrg: null, rateLimit: 10, ratePerMs: 60000, rateBurst: 10, ratePerOrg: false })
  })
})
