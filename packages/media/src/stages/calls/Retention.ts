/**
 * Storage retention for a call: once its transcript is stored, the inputs that made it are obsolete. The OGG
 * audio (our own intermediate file) is removed by default; the source recording is kept unless told otherwise
 * (`CALLS_REMOVE_SOURCE=true`), because we never lose a customer's recording by default. Idempotent: removing
 * an object that is already gone succeeds, and the artifact row is stamped `removed_at` once, so a
 * redelivered stage knows the object went on purpose. Run by transcribe_poll after the transcript commits,
 * and again by any rerun that finds the transcript present.
 */
import { Config, Effect } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Storage from "../../layers/Storage.js"
import * as CallsSql from "./CallsSql.js"
import * as CallStore from "./CallStore.js"
import type { RetentionOptions } from "./Settings.js"

/** Defined in Settings.ts beside `CallStageOptions`, which extends it (one way: Settings imports nothing here). */
export type { RetentionOptions } from "./Settings.js"

export interface Retention {
  readonly removeSource: boolean
  readonly removeAudio: boolean
}

/** `CALLS_REMOVE_SOURCE` (default false) and `CALLS_REMOVE_AUDIO` (default true). */
export const config = Config.all({
  removeSource: Config.boolean("CALLS_REMOVE_SOURCE").pipe(Config.withDefault(false)),
  removeAudio: Config.boolean("CALLS_REMOVE_AUDIO").pipe(Config.withDefault(true))
})

export const resolve = (options: RetentionOptions): Effect.Effect<Retention, JobError.Permanent> =>
  Effect.map(config, (env) => ({
    removeSource: options.removeSource ?? env.removeSource,
    removeAudio: options.removeAudio ?? env.removeAudio
  })).pipe(Effect.mapError((error) => new JobError.Permanent({ message: `call retention configuration: ${String(error)}` })))

/**
 * Removes what retention says of a call whose transcript is stored. A source given as a URI to an object the
 * caller already had is theirs as much as ours: it is removed only when `removeSource` is on, like an upload.
 */
export const removeObsoleteInputs = (callId: string, retention: Retention) =>
  Effect.gen(function*() {
    const kinds = [...(retention.removeAudio ? ["audio"] : []), ...(retention.removeSource ? ["source"] : [])]
    if (kinds.length === 0) return
    const storage = yield* Storage.Storage
    for (const kind of kinds) {
      const artifact = yield* CallStore.artifact(callId, kind)
      if (artifact === undefined || artifact.removed_at !== null) continue
      yield* storage.remove(artifact.storage_key)
      yield* CallStore.run((sql) => CallsSql.markArtifactRemoved(sql, callId, kind))
      yield* Effect.logInfo(`retention: removed the ${kind} object ${artifact.storage_key}`)
    }
  })
