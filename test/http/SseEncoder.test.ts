/**
 * The SSE encoder writes each event exactly as `sseMessage` (JSON.stringify of the event) does, whatever the
 * events and however they share their instant, stage, org and data (a log row's events share those objects; the
 * encoder serializes each once per row): any string a stage, org, subject or data may hold, any instant.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { sseEncoder, sseMessage } from "../../packages/service/src/http/Events.js"
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
    id: fc.bigInt({ min: 0n, max: 2n ** 62n }).map(String),
    jobId: fc.bigInt({ min: 1n, max: 2n ** 62n }).map(String),
    subjectId: fc.option(text, { nil: null }),
    attempt: fc.nat(1000),
    own: fc.option(fc.dictionary(text, fc.jsonValue()), { nil: undefined })
  }), { minLength: 1, maxLength: 5 })
})

describe("sseEncoder", () => {
  it("writes every event as JSON.stringify does, rows sharing their objects or not", () =>
    fc.assert(fc.property(fc.array(row, { maxLength: 6 }), (rows) => {
      const encode = sseEncoder()
      for (const r of rows) {
        for (const e of r.events) {
          const event: EventLog.LoggedEvent = {
            id: e.id, kind: r.kind, jobId: e.jobId, stage: r.stage, orgId: r.org, subjectId: e.subjectId,
            attempt: e.attempt, data: e.own === undefined ? r.shared : e.own, at: r.at
          }
          expect(encode(event)).toBe(sseMessage(event))
        }
      }
    }), { numRuns: 500 }))
})
