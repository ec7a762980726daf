/**
 * The call pipeline: extract_audio → transcribe_start → transcribe_poll (reschedules itself) →
 * analyze, each stage a job, each idempotent. `callStages` are the four with production settings,
 * `makeCallStages` the same with overrides (tests shorten the polls); `callLayers` is what they need besides
 * Db, built from the environment. `Calls` creates and reads calls.
 */
import { Layer } from "effect"
import * as Analyzer from "../../layers/Analyzer.js"
import type * as Db from "pgfiber/internal/layers/Db.js"
import * as Media from "../../layers/Media.js"
import * as SpeechKit from "../../layers/SpeechKit.js"
import * as Storage from "../../layers/Storage.js"
import * as AnalyzeStage from "./Analyze.js"
import * as ExtractAudioStage from "./ExtractAudio.js"
import type { CallStageOptions } from "./Settings.js"
import * as TranscribePollStage from "./TranscribePoll.js"
import * as TranscribeStartStage from "./TranscribeStart.js"

export * as Analyze from "./Analyze.js"
export * as Retention from "./Retention.js"
export * as Calls from "./Calls.js"
export * as CallsSql from "./CallsSql.js"
export * as CallStore from "./CallStore.js"
export * as ExtractAudio from "./ExtractAudio.js"
export * as Settings from "./Settings.js"
export * as TranscribePoll from "./TranscribePoll.js"
export * as TranscribeStart from "./TranscribeStart.js"
export type { CallStageOptions } from "./Settings.js"

/** What the call stages' handlers need: `callLayers` plus the service's Db. */
export type CallRequirements = Db.Db | Storage.Storage | Media.Media | SpeechKit.SpeechKit | Analyzer.Analyzer

/** The four stages, in pipeline order. */
export const makeCallStages = (options: CallStageOptions = {}) =>
  [
    ExtractAudioStage.make(options),
    TranscribeStartStage.make(options),
    TranscribePollStage.make(options),
    AnalyzeStage.make(options)
  ] as const

/** Production settings; handler-time settings still read `TRANSCRIBE_POLL_*`, `SPEECHKIT_ALLOW_FILE_URIS`, `MEDIA_TEMP_DIR`. */
export const callStages = makeCallStages()

/**
 * Storage (`STORAGE_DRIVER`, `STORAGE_DIR`, `S3_*`), Media (`FFMPEG_PATH`, `FFPROBE_PATH`), SpeechKit
 * (`SPEECHKIT_*`) and the deterministic Analyzer. The stages also need `Db.Db`, which the service provides.
 */
export const callLayers = Layer.mergeAll(
  Storage.layerFromConfig,
  Media.layer,
  SpeechKit.layer,
  Analyzer.layerDeterministic
)
