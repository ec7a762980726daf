/**
 * The transcribe_start job, apart from the stage: extract_audio hands off to it, and transcribe_poll hands
 * back to it when a recognition must be started again, so both build it from here (no import cycle).
 */
import { Schema } from "effect"
import * as CallStore from "./CallStore.js"

export const name = "transcribe_start"

export const Payload = Schema.Struct({
  callId: CallStore.CallId,
  /** How many recognitions of this call ended with a code worth another (4, 13, 14) and were started again. */
  resubmits: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
})
export type Payload = typeof Payload.Type

export const maxAttempts = 8

export const job = CallStore.jobBuilder(name, Payload, maxAttempts)
