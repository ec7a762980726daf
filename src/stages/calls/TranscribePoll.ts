/**
 * transcribe_poll: one look at the SpeechKit operation. Still running → `NotReady` with the next wait of the
 * backoff schedule (the runtime reschedules this same job; `job.polls` counts the looks), until the deadline
 * measured from the recognition's start (`startedAt` in the payload), past which the job dead-letters. Done →
 * the transcript is stored (once per call) and the job completes by enqueueing analyze.
 */
import { Clock, Duration, Effect, Schema } from "effect"
import * as JobError from "../../JobError.js"
import * as SpeechKit from "../../layers/SpeechKit.js"
import * as RetryPolicy from "../../runtime/RetryPolicy.js"
import * as Stage from "../../runtime/Stage.js"
import * as Analyze from "./Analyze.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStore from "./CallStore.js"
import * as Settings from "./Settings.js"

export const name = "transcribe_poll"

export const Payload = Schema.Struct({
  callId: CallStore.CallId,
  operationId: Schema.NonEmptyString,
  /** When the recognition started: the deadline counts from here, not from this job's creation. */
  startedAt: Schema.Date,
  audioDurationMs: Schema.Number.pipe(Schema.nonNegative())
})
export type Payload = typeof Payload.Type

/** Polls spend no attempts, but transient failures over a long recognition do: more room than other stages. */
export const maxAttempts = 20

export const job = CallStore.jobBuilder(name, Payload, maxAttempts)

export const defaultBackoff = RetryPolicy.exponential({ base: "5 seconds", cap: "5 minutes" })

export const policy = (options: Settings.CallStageOptions) =>
  RetryPolicy.make({
    Transient: options.backoff ?? defaultBackoff,
    RateLimited: (e) => e.retryAfter,
    // The handler always says when to look again and enforces the deadline itself; the budget is only a backstop.
    NotReady: { interval: options.pollCap ?? Settings.defaults.pollCap, budget: 100_000 },
    Permanent: RetryPolicy.deadLetter
  })

export const make = (options: Settings.CallStageOptions = {}) =>
  Stage.make({
    name,
    // a pipeline step: only the pipeline (and operators) enqueue it
    visibility: "internal",
    payload: Payload,
    concurrency: options.concurrency?.transcribe_poll ?? 16,
    leaseFor: "30 seconds",
    timeout: "2 minutes",
    maxAttempts,
    policy: policy(options),
    handler: ({ audioDurationMs, callId, operationId, startedAt }, info) =>
      Effect.gen(function*() {
        const speechKit = yield* SpeechKit.SpeechKit
        const settings = yield* Settings.resolve(options)
        const call = yield* CallStore.load(callId, info)
        const handOff = Effect.map(Analyze.job({ callId }, { callId, orgId: call.org_id }), (next) => Stage.complete([next]))

        if ((yield* CallStore.transcript(callId)) !== undefined) {
          yield* Effect.logInfo(`call ${callId} already has its transcript; handing off`)
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
        return yield* handOff
      }).pipe(CallStore.recordFailure(name, callId, info))
  })
