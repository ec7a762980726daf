/**
 * The SSE writer writes each event exactly as `sseMessage` (JSON.stringify of the event, as UTF-8) does, whatever
 * the events, however they share their instant, stage, org and data (a log row's events share those objects; the
 * writer encodes each once per row) and however they are cut into batches: any string a stage, org, subject or
 * data may hold, any instant, any id and attempt.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { sseMessage } from "../../packages/service/src/http/Events.js"
import { sseWriter } from "../../packages/service/src/http/SseWriter.js"
import * as EventLog from "../../packages/pgfiber/src/queue/EventLog.js"

const text = fc.string({ unit: "binary", maxLength: 12 })

/** A row's shared parts, and events made from them (some with their own data, as completed events have). */
const row = fc.record({
  at: fc.date({ noInvalidDate: true }),
  stage: text,
  org: fc.option(text, { nil: null }),
  kind: fc.constantFrom(...EventLog.kinds),
  shared: fc.option(fc.dictionary(text, fc.jsonValue()), { nil: null }),
  events: fc.array(fc.record({
    // ids are digits as the log makes them; anything else must come out as JSON.stringify writes it too
    id: fc.oneof(fc.bigInt({ min: 0n, max: 2n ** 62n }).map(String), text),
    jobId: fc.oneof(fc.bigInt({ min: 1n, max: 2n ** 62n }).map(String), text),
    subjectId: fc.option(text, { nil: null }),
    // mostly small, as the log's are (the writer keeps a row's bytes per attempt), and any number
    attempt: fc.oneof({ arbitrary: fc.nat(9), weight: 4 }, fc.nat(1000), fc.double(), fc.integer()),
    // its own data, none (null), or the row's shared data (undefined)
    own: fc.option(fc.option(fc.dictionary(text, fc.jsonValue()), { nil: null }), { nil: undefined })
  }), { minLength: 1, maxLength: 5 })
})

describe("sseWriter", () => {
  it("writes every event as sseMessage does, rows sharing their objects or not, in any batches", () =>
    fc.assert(fc.property(fc.array(row, { maxLength: 6 }), fc.array(fc.nat(8), { maxLength: 8 }), (rows, cuts) => {
      const events = rows.flatMap((r) =>
        r.events.map((e): EventLog.LoggedEvent => ({
          id: e.id, kind: r.kind, jobId: e.jobId, stage: r.stage, orgId: r.org, subjectId: e.subjectId,
          attempt: e.attempt, data: e.own === undefined ? r.shared : e.own, at: r.at
        }))
      )
      // the batches the feed hands over: `cuts` are their sizes, the rest is one last batch
      const write = sseWriter()
      const written: Array<Uint8Array> = []
      let at = 0
      for (const n of [...cuts, events.length]) {
        written.push(write(events.slice(at, at + n)))
        at = Math.min(events.length, at + n)
      }
      const expected = events.map(sseMessage).join("")
      const actual = Buffer.concat(written)
      // the text for a readable failure, then the bytes themselves (what TextEncoder made of the text before)
      expect(actual.toString("utf8")).toBe(expected)
      expect(actual.equals(new TextEncoder().encode(expected))).toBe(true)
    }), { numRuns: 500 }))

  it("grows its buffer for events larger than it guessed, keeping what it wrote before", () => {
    const at = new Date("2026-11-28T01:00:00.000Z")
    const event = (n: number, message: string): EventLog.LoggedEvent => ({
      id: String(41_000 * 1024 + n), kind: "dead", jobId: String(7_000_000 + n), stage: "s", orgId: "o", subjectId: null,
      attempt: 3, data: { tag: "Failed", message }, at
    })
    // past the guess of 256 bytes an event, more than once, and not ASCII (3 bytes a character in UTF-8)
    const events = [event(0, "short"), event(1, "€".repeat(3000)), event(2, "x".repeat(20_000)), event(3, "end")]
    const written = sseWriter()(events)
    expect(Buffer.from(written).equals(new TextEncoder().encode(events.map(sseMessage).join("")))).toBe(true)
  })
})
