/**
 * transcribe_start: makes sure the call's audio is in object storage, starts a SpeechKit async recognition of
 * it, records the operation on the call, and completes by enqueueing transcribe_poll (same transaction as the
 * completion; the first poll is delayed by the audio's expected recognition time). A rerun that finds an
 * operation recorded starts nothing: it hands off the recorded one, so a redelivery never pays twice.
 */
import { Clock, Duration, Effect } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as SpeechKit from "../../layers/SpeechKit.js"
import * as Storage from "../../layers/Storage.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStage from "./CallStage.js"
import * as CallStore from "./CallStore.js"
import * as Settings from "./Settings.js"
import * as TranscribePoll from "./TranscribePoll.js"
import { maxAttempts, name, Payload } from "./TranscribeStartJob.js"

export { job, maxAttempts, name, Payload } from "./TranscribeStartJob.js"
export type { Payload as PayloadType } from "./TranscribeStartJob.js"

/**
 * SpeechKit is a slow outside service: the 30 s…10 min curve (30 s doubling, capped at 10 minutes, jittered), so
 * eight attempts ride out about half an hour of outage; a 429 waits the server's (capped) Retry-After instead.
 */
export const defaultBackoff = RetryPolicy.slowBackoff

/**
 * SpeechKit downloads its input itself, so the audio must sit where it can reach: an S3-compatible bucket's
 * https URL. `file://` is only for a recognizer on this machine (the simulator), and only when allowed.
 */
const recognizerUri = (uri: string, settings: Settings.Settings): Effect.Effect<string, JobError.Permanent> => {
  const scheme = uri.slice(0, uri.indexOf(":") + 1)
  if (scheme === "http:" || scheme === "https:") return Effect.succeed(uri)
  if (scheme === "file:" && settings.allowFileUris) return Effect.succeed(uri)
  return Effect.fail(
    new JobError.Permanent({
      message: `the storage is not S3-compatible (its URIs are ${scheme}//…), and SpeechKit can only download audio ` +
        `from object storage: set STORAGE_DRIVER=s3` +
        (scheme === "file:" ? `, or SPEECHKIT_ALLOW_FILE_URIS=true when the recognizer is a local simulator` : "")
    })
  )
}

/**
 * SpeechKit refuses audio over 4 hours (every channel counts: a 3 h stereo call is 6 h of recognition) or over
 * 1 GB, after it has been paid for and waited on; refusing here says why at once.
 */
const withinLimits = (audio: CallsSql.ArtifactRow, settings: Settings.Settings): Effect.Effect<void, JobError.Permanent> => {
  const channels = Math.max(1, audio.channels ?? 1)
  const recognitionMs = (audio.duration_ms ?? 0) * channels
  const bytes = Number(audio.bytes ?? 0)
  if (recognitionMs > Duration.toMillis(settings.maxAudioDuration)) {
    return Effect.fail(new JobError.Permanent({
      message: `the audio is too long for SpeechKit: ${Duration.format(Duration.millis(audio.duration_ms ?? 0))} × ${channels} ` +
        `channel(s) = ${Duration.format(Duration.millis(recognitionMs))} of recognition, over the ` +
        `${Duration.format(settings.maxAudioDuration)} limit (split the recording)`
    }))
  }
  if (bytes > settings.maxAudioBytes) {
    return Effect.fail(new JobError.Permanent({
      message: `the audio is too large for SpeechKit: ${bytes} bytes, over the ${settings.maxAudioBytes}-byte limit`
    }))
  }
  return Effect.void
}

// name, payload and attempts are TranscribeStartJob.ts's: the stages that hand off here build their jobs from it
// without importing this handler (transcribe_poll, which this one hands off to, hands back to it)
export const { make, policy } = CallStage.define({
  name,
  payload: Payload,
  maxAttempts,
  defaults: { concurrency: 4, timeout: "2 minutes", leaseFor: "30 seconds" },
  limits: Settings.speechKitQuotas.transcribe_start,
  policy: (options) => CallStore.retryPolicy(options, defaultBackoff),
  handler: ({ callId, resubmits = 0 }, info, options) =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const speechKit = yield* SpeechKit.SpeechKit
      const settings = yield* Settings.resolve(options)
      const call = yield* CallStore.load(callId, info)
      const audio = yield* CallStore.artifact(callId, "audio")
      if (audio === undefined) {
        return yield* new JobError.Permanent({ message: `call ${callId} has no audio artifact: extract_audio has not run` })
      }
      const audioDurationMs = audio.duration_ms ?? 0
      const handOff = (operationId: string, startedAt: Date) =>
        Effect.map(
          TranscribePoll.job(
            { callId, operationId, startedAt, audioDurationMs, resubmits },
            { callId, orgId: call.org_id, delay: Settings.firstPollAfter(settings, audioDurationMs) }
          ),
          (next) => Stage.complete([next])
        )

      if (call.operation_id !== null && call.operation_started_at !== null) {
        yield* Effect.logInfo(`recognition ${call.operation_id} already started; handing off`)
        return yield* handOff(call.operation_id, call.operation_started_at)
      }

      yield* withinLimits(audio, settings)
      if (!(yield* storage.exists(audio.storage_key))) {
        return yield* new JobError.Permanent({
          message: `the audio artifact ${audio.storage_key} of call ${callId} is missing from storage`
        })
      }
      const uri = yield* Effect.flatMap(storage.uri(audio.storage_key), (uri) => recognizerUri(uri, settings))
      const operationId = yield* speechKit.startRecognition({ uri })
      const startedAt = new Date(yield* Clock.currentTimeMillis)
      const [recorded] = yield* CallStore.run((sql) => CallsSql.recordOperation(sql, callId, operationId, startedAt))
      if (recorded !== undefined) return yield* handOff(recorded.operation_id, recorded.operation_started_at)
      // another run recorded its operation first: poll that one (ours is left to expire)
      const winner = yield* CallStore.load(callId, info)
      yield* Effect.logWarning(`recognition ${operationId} lost the race to ${winner.operation_id}; polling the latter`)
      return yield* handOff(winner.operation_id ?? operationId, winner.operation_started_at ?? startedAt)
    })
})
