/**
 * Object storage for pipeline artifacts (raw recordings, extracted audio, transcripts).
 *
 * Three implementations behind one tag: `layerFs` (a directory, the default for local runs),
 * `layerS3` (any S3-compatible service; Yandex Object Storage in production, because SpeechKit
 * downloads its input from there) and `layerMemory` (unit tests, in `pgfiber/testing`). `layerFromConfig` picks
 * one from env. Each lives in a file of its own under `storage/`; this module is the face the pipelines import.
 *
 * Keys are relative, `/`-separated paths (`calls/<id>/audio.ogg`); the same validation runs in
 * every implementation so the twins cannot drift. Failures speak the JobError vocabulary, plus
 * `ObjectNotFound` for a missing object, which a stage decides about (often: "not yet" or Permanent).
 */
import { Config, ConfigError, Effect, Layer } from "effect"
import { defaultRootDir, layerFs } from "./storage/Fs.js"
import { layerS3, s3Config } from "./storage/S3.js"
import type { Storage, WriteError } from "./storage/Service.js"

export { defaultRootDir, layerFs, makeFs } from "./storage/Fs.js"
export { defaultPartSizeBytes, layerS3, makeS3, type S3Config, s3Config } from "./storage/S3.js"
export {
  type Body,
  fromFile,
  type FromFile,
  type Location,
  ObjectNotFound,
  parseLocation,
  type ReadError,
  Storage,
  validateKey,
  type WriteError
} from "./storage/Service.js"

export const storageConfig = Config.all({
  driver: Config.literal("fs", "s3")("STORAGE_DRIVER").pipe(Config.withDefault("fs" as const)),
  dir: Config.nonEmptyString("STORAGE_DIR").pipe(Config.withDefault(defaultRootDir))
})

/** `STORAGE_DRIVER=fs` (default) uses `STORAGE_DIR`; `s3` uses the `S3_*` variables. */
export const layerFromConfig: Layer.Layer<Storage, ConfigError.ConfigError | WriteError> = Layer.unwrapEffect(
  Effect.gen(function*() {
    const { dir, driver } = yield* storageConfig
    return driver === "s3" ? layerS3(yield* s3Config) : layerFs(dir)
  })
)
