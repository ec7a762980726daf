/**
 * The documents pipeline: the stages for `Worker.layer`, the layers they need from configuration, and the
 * safety sweep's schedule for `Scheduler.layer`. See docs/documents.md.
 *
 * ```ts
 * Scheduler.layer([DocumentsSweep.schedule(settings)]).pipe(
 *   Layer.provideMerge(Worker.layer([...documentStages, ...otherStages], options)),
 *   Layer.provide(documentLayers), Layer.provide(PgSchedules.layer), Layer.provideMerge(PgQueue.layer()), …)
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

export const documentStages = [TranscribeDocument.transcribeDocument, DocumentsSweep.documentsSweep] as const

/** The transcription client (TRANSCRIBE_URL, TRANSCRIBE_TOKEN, TRANSCRIBE_TIMEOUT_MS) and the sweep's settings. */
export const documentLayers = Layer.mergeAll(Transcription.layer, DocumentsSweep.layer)
