/**
 * transcribe_poll: one look at the SpeechKit operation. Still running → `NotReady` with the next wait of the
 * backoff schedule (the runtime reschedules this same job; `job.polls` counts the looks), until the deadline
 * measured from the recognition's start (`startedAt` in the payload), past which the job dead-letters. Done →
 * the transcript is stored (once per call) and the job completes by enqueueing analyze.
 */
import { Clock, Duration, Effect, Schema } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as SpeechKit from "../../layers/SpeechKit.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as Analyze from "./Analyze.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStage from "./CallStage.js"
import * as CallStore from "./CallStore.js"
import * as Retention from "./Retention.js"
import * as Settings from "./Settings.js"
import * as TranscribeStart from "./TranscribeStartJob.js"

/** Failed looks (5xx, timeouts) back off on the 30 s…10 min curve, like transcribe_start; polls spend no attempts. */
export const defaultBackoff = RetryPolicy.slowBackoff

export const { job, make, maxAttempts, name, Payload, policy } = CallStage.define({
  name: "transcribe_poll",
  payload: Schema.Struct({
    callId: CallStore.CallId,
    operationId: Schema.NonEmptyString,
    /** When the recognition started: the deadline counts from here, not from this job's creation. */
    startedAt: Schema.Date,
    audioDurationMs: Schema.Number.pipe(Schema.nonNegative()),
    /** Recognitions of this call already started again after a code 4/13/14 (see transcribe_start). */
    resubmits: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
  }),
  // polls spend no attempts, but transient failures over a long recognition do: more room than other stages
  maxAttempts: 20,
  defaults: { concurrency: 16, timeout: "2 minutes", leaseFor: "30 seconds" },
  limits: Settings.speechKitQuotas.transcribe_poll,
  policy: (options) =>
    RetryPolicy.make({
      Transient: options.backoff ?? defaultBackoff,
      RateLimited: (e) => e.retryAfter,
      // The handler always says when to look again and enforces the deadline itself; the budget is only a backstop.
      NotReady: { interval: options.pollCap ?? Settings.defaults.pollCap, budget: 100_000 },
      Permanent: RetryPolicy.deadLetter
    }),
  handler: ({ audioDurationMs, callId, operationId, resubmits = 0, startedAt }, info, options) =>
    Effect.gen(function*() {
      const speechKit = yield* SpeechKit.SpeechKit
      const settings = yield* Settings.resolve(options)
      const call = yield* CallStore.load(callId, info)
      const handOff = Effect.map(Analyze.job({ callId }, { callId, orgId: call.org_id }), (next) => Stage.complete([next]))

      const retention = yield* Retention.resolve(options)
      if ((yield* CallStore.transcript(callId)) !== undefined) {
        yield* Effect.logInfo(`call ${callId} already has its transcript; handing off`)
        yield* Retention.removeObsoleteInputs(callId, retention)
        return yield* handOff
      }

      const status = yield* speechKit.getOperation(operationId)
      if (!status.done) {
        const elapsed = Duration.millis((yield* Clock.currentTimeMillis) - startedAt.getTime())
        if (Duration.greaterThanOrEqualTo(elapsed, settings.pollDeadline)) {
          return yield* new JobError.Permanent({
            message: `recognition ${operationId} not done ${Duration.format(elapsed)} after it started ` +
              `(deadline ${Duration.format(settings.pollDeadline)}, ${info.polls + 1} polls)`
          })
        }
        // never sleep past the deadline: the last look happens at it
        const wait = Duration.min(
          Settings.nextPollAfter(settings, audioDurationMs, info.polls),
          Duration.subtract(settings.pollDeadline, elapsed)
        )
        return yield* new JobError.NotReady({
          message: `recognition ${operationId} still running (poll ${info.polls + 1})`,
          pollAfter: wait
        })
      }

      if ("retryable" in status) {
        const { code, message } = status.retryable
        if (resubmits >= settings.maxResubmits) {
          return yield* new JobError.Permanent({
            message: `SpeechKit operation ${operationId} failed (gRPC code ${code}): ${message}; ` +
              `given up after ${resubmits} re-submission(s)`
          })
        }
        // a fresh recognition may succeed where this one ended: forget it, and let transcribe_start begin another
        yield* CallStore.run((sql) => CallsSql.clearOperation(sql, callId, operationId))
        yield* Effect.logWarning(`recognition ${operationId} ended with gRPC code ${code} (${message}); starting another`)
        return yield* Effect.map(
          TranscribeStart.job({ callId, resubmits: resubmits + 1 }, { callId, orgId: call.org_id }),
          (next) => Stage.complete([next])
        )
      }

      const recognition = yield* speechKit.getRecognition(operationId)
      yield* CallStore.transaction(
        Effect.zipRight(
          CallStore.run((sql) =>
            CallsSql.insertTranscript(sql, {
              callId,
              orgId: call.org_id,
              operationId,
              language: recognition.language ?? null,
              segments: recognition.segments,
              durationMs: audioDurationMs > 0 ? Math.round(audioDurationMs) : null
            })
          ),
          CallStore.advance(callId, "analyzing")
        )
      )
      // only now, with the transcript committed, are the inputs that made it obsolete
      yield* Retention.removeObsoleteInputs(callId, retention)
      return yield* handOff
    })
})

export type Payload = typeof Payload.Type
