/**
 * The four call stages as `makeCallStages` builds them, without a database: each stage's own concurrency,
 * timeout, lease, attempts, limits and retry policy, the tuning options that replace them, and the job builders
 * the hand-offs use writing the same stage name and attempts as the stage that runs the job.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Schedule } from "effect"
import * as JobError from "../../../packages/pgfiber/src/JobError.js"
import * as Limits from "../../../packages/pgfiber/src/queue/Limits.js"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import {
  Analyze,
  ExtractAudio,
  makeCallStages,
  Settings,
  TranscribePoll,
  TranscribeStart
} from "../../../packages/media/src/stages/calls/index.js"

const callId = "0b6f5c1e-3d7a-4a55-9a53-6c1f2a0e8d41"
const orgId = "org-stages"

const declared = (stage: Stage.Any) => ({
  name: stage.name,
  visibility: stage.visibility,
  concurrency: stage.concurrency,
  timeoutMs: Duration.toMillis(stage.timeout),
  leaseForMs: Duration.toMillis(stage.leaseFor),
  maxAttempts: stage.maxAttempts,
  shares: stage.shares,
  marksTheCallFailed: stage.onDeadLetter !== undefined
})

const notReady = { _tag: "NotReady", error: new JobError.NotReady({ message: "still running" }) } as const

describe("call stages", () => {
  it("each stage's own settings when no option names it", () => {
    expect(makeCallStages().map(declared)).toEqual([
      {
        name: "extract_audio", visibility: "internal", concurrency: 2, timeoutMs: 30 * 60_000, leaseForMs: 30_000,
        maxAttempts: 5, shares: Limits.defaultShares, marksTheCallFailed: true
      },
      {
        name: "transcribe_start", visibility: "internal", concurrency: 4, timeoutMs: 2 * 60_000, leaseForMs: 30_000,
        maxAttempts: 8, shares: Limits.fromStage(Settings.speechKitQuotas.transcribe_start), marksTheCallFailed: true
      },
      {
        name: "transcribe_poll", visibility: "internal", concurrency: 16, timeoutMs: 2 * 60_000, leaseForMs: 30_000,
        maxAttempts: 20, shares: Limits.fromStage(Settings.speechKitQuotas.transcribe_poll), marksTheCallFailed: true
      },
      {
        name: "analyze", visibility: "internal", concurrency: 4, timeoutMs: 5 * 60_000,
        leaseForMs: Duration.toMillis(Stage.defaultLease), maxAttempts: 5, shares: Limits.defaultShares, marksTheCallFailed: true
      }
    ])
  })

  it("options replace the settings of the stage they name, and only of that stage", () => {
    const [extract, start, poll, analyze] = makeCallStages({
      concurrency: { analyze: 7 },
      timeout: { extract_audio: "1 minute" },
      leaseFor: { analyze: "5 seconds" },
      limits: { transcribe_poll: { maxRunning: 3 }, extract_audio: { maxRunningPerOrg: 1 } }
    }).map(declared)
    // a stage with no limits of its own takes those the options give it
    expect(extract).toMatchObject({ concurrency: 2, timeoutMs: 60_000, leaseForMs: 30_000, shares: { ...Limits.defaultShares, maxRunningPerOrg: 1 } })
    expect(start).toMatchObject({ concurrency: 4, timeoutMs: 2 * 60_000, shares: Limits.fromStage(Settings.speechKitQuotas.transcribe_start) })
    expect(poll).toMatchObject({ concurrency: 16, shares: { ...Limits.defaultShares, maxRunning: 3 } })
    expect(analyze).toMatchObject({ concurrency: 7, timeoutMs: 5 * 60_000, leaseForMs: 5_000 })
  })

  it.effect("a hand-off job carries its stage's name, attempts and dedupe key", () =>
    Effect.gen(function*() {
      const handOff = { callId, orgId }
      const jobs = [
        yield* ExtractAudio.job({ callId }, handOff),
        yield* TranscribeStart.job({ callId }, handOff),
        yield* TranscribePoll.job({ callId, operationId: "op-1", startedAt: new Date(0), audioDurationMs: 1_000 }, handOff),
        yield* Analyze.job({ callId }, handOff)
      ]
      const stages = makeCallStages()
      expect(jobs).toEqual(stages.map((stage) => expect.objectContaining({
        stage: stage.name,
        maxAttempts: stage.maxAttempts,
        orgId,
        subjectId: callId,
        dedupeKey: `${stage.name}:${callId}`
      })))
      expect([ExtractAudio, TranscribeStart, TranscribePoll, Analyze].map((m) => [m.name, m.maxAttempts, m.Payload]))
        .toEqual(stages.map((s) => [s.name, s.maxAttempts, s.payload]))
    }))

  it.effect("only transcribe_poll waits on NotReady; every stage backs off Transient on options.backoff", () =>
    Effect.gen(function*() {
      const backoff = Schedule.spaced("7 seconds")
      const stages = makeCallStages({ backoff, pollCap: "9 seconds" })
      const onNotReady = yield* Effect.forEach(stages, (s) => RetryPolicy.decide(s.policy, notReady, 1, 0))
      expect(onNotReady).toEqual([
        { _tag: "DeadLetter", reason: "still running" },
        { _tag: "DeadLetter", reason: "still running" },
        { _tag: "Reschedule", delay: Duration.seconds(9) },
        { _tag: "DeadLetter", reason: "still running" }
      ])
      const onTransient = yield* Effect.forEach(stages, (s) => RetryPolicy.decide(s.policy, { _tag: "Transient", message: "blip" }, 1, 0))
      expect(onTransient).toEqual(stages.map(() => ({ _tag: "Retry", delay: Duration.seconds(7) })))
      expect([ExtractAudio, TranscribeStart, TranscribePoll, Analyze].map((m) => m.policy({ backoff }).Transient))
        .toEqual(stages.map(() => backoff))
    }))
})
