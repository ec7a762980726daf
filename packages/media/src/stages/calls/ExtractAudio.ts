/**
 * extract_audio: the call's source media → OGG Opus audio at `orgs/{org}/calls/{call}/audio.ogg`, recorded as
 * the call's `audio` artifact, then hands off to transcribe_start. The source is downloaded into a temporary
 * directory that a finalizer removes whatever the outcome. A rerun that finds the artifact (row and object)
 * returns early and only repeats the hand-off, so a job redelivered after a crash still moves the call on.
 */
import { Effect, Schema } from "effect"
import * as NodeFs from "node:fs/promises"
import * as NodePath from "node:path"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Media from "../../layers/Media.js"
import * as Storage from "../../layers/Storage.js"
import * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as CallStage from "./CallStage.js"
import * as CallStore from "./CallStore.js"
import * as Settings from "./Settings.js"
import * as TranscribeStart from "./TranscribeStart.js"

/** A private directory for one run's temporaries, removed when the run's scope closes. */
const temporaryDirectory = (root: string, callId: string) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () => NodeFs.mkdtemp(NodePath.join(root, `pgfiber-extract-${callId}-`)),
      catch: (error) => new JobError.Transient({ message: `cannot create a temporary directory in ${root}: ${String(error)}` })
    }),
    (dir) => Effect.promise(() => NodeFs.rm(dir, { recursive: true, force: true })).pipe(Effect.ignore)
  )

/** The source's extension, kept so ffprobe's format guess has the usual hint; anything odd becomes none. */
const extensionOf = (key: string) => {
  const ext = NodePath.posix.extname(key)
  return /^\.[A-Za-z0-9]{1,10}$/.test(ext) ? ext : ""
}

export const { job, make, maxAttempts, name, Payload, policy } = CallStage.define({
  name: "extract_audio",
  payload: Schema.Struct({ callId: CallStore.CallId }),
  maxAttempts: 5,
  defaults: { concurrency: 2, timeout: "30 minutes", leaseFor: "30 seconds" },
  // this stage never polls: a NotReady here is a bug, not a reason to wait
  policy: (options) => CallStore.retryPolicy(options, RetryPolicy.defaultBackoff),
  handler: ({ callId }, info, options) =>
    Effect.gen(function*() {
      const storage = yield* Storage.Storage
      const media = yield* Media.Media
      const settings = yield* Settings.resolve(options)
      const call = yield* CallStore.load(callId, info)
      const handOff = Effect.map(
        TranscribeStart.job({ callId }, { callId, orgId: call.org_id }),
        (next) => Stage.complete([next])
      )
      const key = CallStore.audioKey(call.org_id, call.id)

      const existing = yield* CallStore.artifact(callId, "audio")
      // removed by retention (the transcript is stored): done long ago, the source may be gone too
      if (existing !== undefined && (existing.removed_at !== null || (yield* storage.exists(key)))) {
        yield* Effect.logInfo(`audio artifact ${key} already made; handing off`)
        return yield* handOff
      }

      yield* CallStore.advance(callId, "extracting")
      const dir = yield* temporaryDirectory(settings.tempDir, callId)
      const source = NodePath.join(dir, `source${extensionOf(call.source_key)}`)
      const audio = NodePath.join(dir, "audio.ogg")
      // Messages name the source by its storage key, not by a temporary path nobody can look at later.
      const aboutSource = (error: JobError.Transient | JobError.Permanent) =>
        error._tag === "Permanent"
          ? new JobError.Permanent({
            message: `cannot extract audio from ${call.source_key}: ${error.message.replaceAll(source, call.source_key)}`
          })
          : error

      yield* storage.download(call.source_key, source).pipe(
        Effect.catchTag("ObjectNotFound", () =>
          Effect.fail(new JobError.Permanent({ message: `source media ${call.source_key} is not in storage` })))
      )
      yield* media.toOggOpus(source, audio).pipe(Effect.mapError(aboutSource))
      const probed = yield* media.probe(audio)
      const bytes = yield* Effect.tryPromise({
        try: () => NodeFs.stat(audio).then((s) => s.size),
        catch: (error) => new JobError.Transient({ message: `cannot stat ${audio}: ${String(error)}` })
      })
      yield* storage.put(key, Storage.fromFile(audio))
      yield* CallStore.transaction(
        Effect.zipRight(
          CallStore.insertArtifact({
            callId,
            orgId: call.org_id,
            kind: "audio",
            storageKey: key,
            contentType: CallStore.audioContentType,
            bytes,
            durationMs: Math.round(probed.durationSeconds * 1000),
            channels: probed.audio?.channels ?? null
          }),
          CallStore.advance(callId, "transcribing")
        )
      )
      return yield* handOff
    }).pipe(Effect.scoped)
})

export type Payload = typeof Payload.Type
