/**
 * analyze: the stored transcript → the Analyzer's CallAnalysis, upserted (a recomputation with the same result
 * writes nothing), and the call marked done, in one transaction. The last stage: no hand-off.
 */
import { Effect, ParseResult, Schema } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Analyzer from "../../layers/Analyzer.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStage from "./CallStage.js"
import * as CallStore from "./CallStore.js"

const decodeSegments = Schema.decodeUnknown(Schema.Array(Analyzer.Segment))

export const { job, make, maxAttempts, name, Payload, policy } = CallStage.define({
  name: "analyze",
  payload: Schema.Struct({ callId: CallStore.CallId }),
  maxAttempts: 5,
  defaults: { concurrency: 4, timeout: "5 minutes" },
  // an analyzer backed by a rate-limited model says when to come back (RateLimited); it never polls
  policy: (options) => CallStore.retryPolicy(options, RetryPolicy.defaultBackoff),
  handler: ({ callId }, info) =>
    Effect.gen(function*() {
      const analyzer = yield* Analyzer.Analyzer
      const call = yield* CallStore.load(callId, info)
      const stored = yield* CallStore.transcript(callId)
      if (stored === undefined) {
        return yield* new JobError.Permanent({ message: `call ${callId} has no transcript: transcribe_poll has not finished` })
      }
      const segments = yield* decodeSegments(stored.segments).pipe(
        Effect.mapError((e) =>
          new JobError.Permanent({
            message: `the stored transcript of call ${callId} is malformed: ${ParseResult.TreeFormatter.formatErrorSync(e)}`
          })
        )
      )
      const analysis = yield* analyzer.analyze({
        segments,
        ...(stored.language === null ? {} : { language: stored.language }),
        ...(stored.duration_ms === null ? {} : { durationMs: stored.duration_ms })
      })
      yield* CallStore.transaction(
        Effect.zipRight(
          CallStore.run((sql) =>
            CallsSql.upsertAnalysis(sql, { callId, orgId: call.org_id, analyzer: analysis.analyzer, analysis })
          ),
          CallStore.advance(callId, "done")
        )
      )
    })
})

export type Payload = typeof Payload.Type
