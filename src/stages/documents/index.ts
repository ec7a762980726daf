/**
 * The documents pipeline (issue 5, seed 003): the stages for `Worker.layer`, the layers they need from
 * configuration, and the start-up call that keeps the safety sweep scheduled. See docs/documents.md.
 *
 * ```ts
 * Worker.layer([...documentStages, ...otherStages], options)
 *   .pipe(Layer.provide(documentLayers), Layer.provide(PgQueue.layer()), Layer.provide(Db.layer))
 * // once the queue is up:
 * yield* ensureSweepScheduled
 * ```
 * The stages also need `Db` (they read and write the documents tables) and `Queue` (as every stage does).
 */
import { Layer } from "effect"
import * as Transcription from "../../layers/Transcription.js"
import * as DocumentsSweep from "./DocumentsSweep.js"
import * as TranscribeDocument from "./TranscribeDocument.js"

export * as Documents from "./Documents.js"
export * as DocumentsSweep from "./DocumentsSweep.js"
export * as TranscribeDocument from "./TranscribeDocument.js"
export { ensureSweepScheduled } from "./DocumentsSweep.js"

export const documentStages = [TranscribeDocument.transcribeDocument, DocumentsSweep.documentsSweep] as const

/** The transcription client (TRANSCRIBE_URL, TRANSCRIBE_TOKEN, TRANSCRIBE_TIMEOUT_MS) and the sweep's settings. */
export const documentLayers = Layer.mergeAll(Transcription.layer, DocumentsSweep.layer)
