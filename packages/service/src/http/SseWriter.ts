/**
 * The bytes of `GET /events`: a batch of logged events as one buffer of SSE messages, each byte for byte what
 * `sseMessage` (Events.ts: `JSON.stringify` of the event, UTF-8) writes. It exists for its cost: a follower of a
 * busy queue gets ~3 events a job, and building each message as a string (about twenty pieces), joining them and
 * encoding the text again as UTF-8 cost the serving process ~1 µs an event plus the garbage of every piece.
 *
 * What the events of one log row share (kind, stage, org, instant, a claim's worker: the same objects, see
 * EventLog.unnestRow) is encoded once per row, as bytes; per event only the ids, subject, attempt and its own data
 * are written, digits straight into the buffer. Anything else (an id that is not digits, an attempt past 9, any
 * string) goes through `JSON.stringify`, so the bytes stay exact for any event.
 */
import type * as EventLog from "pgfiber/internal/queue/EventLog.js"

const bytes = (text: string) => Buffer.from(text, "utf8")

const idLine = bytes("id: ")
const attemptField = bytes(",\"attempt\":")
const dataField = bytes(",\"data\":")
const nullText = bytes("null")

/** The parts of a message that an event's kind, stage, org and instant decide (one log row's, usually). */
interface RowParts {
  readonly kind: string
  readonly stage: string
  readonly orgId: string | null
  readonly at: Date
  readonly atMs: number
  /** The bytes of every fixed part of a message: what is left to write is the event's own. */
  readonly size: number
  /** `\nevent: <kind>\ndata: {"id":` */
  readonly afterId: Buffer
  /** `,"kind":<kind>,"jobId":` */
  readonly afterEventId: Buffer
  /** `,"stage":<stage>,"orgId":<org>,"subjectId":` */
  readonly afterJobId: Buffer
  /** `,"at":<instant>}\n\n` */
  readonly end: Buffer
}

const rowParts = (e: EventLog.LoggedEvent): RowParts => {
  const afterId = bytes(`\nevent: ${e.kind}\ndata: {"id":`)
  const afterEventId = bytes(`,"kind":${JSON.stringify(e.kind)},"jobId":`)
  const afterJobId = bytes(`,"stage":${JSON.stringify(e.stage)},"orgId":${JSON.stringify(e.orgId)},"subjectId":`)
  const end = bytes(`,"at":${JSON.stringify(e.at)}}\n\n`)
  const size = idLine.length + afterId.length + afterEventId.length + afterJobId.length + attemptField.length +
    dataField.length + end.length
  return { kind: e.kind, stage: e.stage, orgId: e.orgId, at: e.at, atMs: e.at.getTime(), size, afterId, afterEventId, afterJobId, end }
}

const sameRow = (p: RowParts, e: EventLog.LoggedEvent) =>
  p.at === e.at && p.atMs === e.at.getTime() && p.kind === e.kind && p.stage === e.stage && p.orgId === e.orgId

/**
 * Copies `part` into `out` at `at`; the place after it. Short parts by a loop: `Buffer.copy`'s checks and the
 * call cost more than a few bytes (on this machine the writer spent a third of its time there).
 */
const copy = (out: Uint8Array, at: number, part: Uint8Array) => {
  if (part.length > 24) out.set(part, at)
  else for (let i = 0; i < part.length; i++) out[at + i] = part[i]!
  return at + part.length
}

/** Whether `s` is all ASCII digits: its JSON is itself in quotes, and its UTF-8 a byte a character. */
const isDigits = (s: string) => {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c < 48 || c > 57) return false
  }
  return true
}

/** `s`, ASCII, a byte a character at `at`; the place after it. */
const ascii = (out: Uint8Array, at: number, s: string) => {
  for (let i = 0; i < s.length; i++) out[at + i] = s.charCodeAt(i)
  return at + s.length
}

/**
 * Any text at `at` as UTF-8 (what TextEncoder writes: a lone surrogate becomes U+FFFD either way); the place
 * after it. ASCII by a loop, which is what JSON text mostly is; the rest from the first other character by the
 * native encoder, whose call cost more than a short text's bytes.
 */
const utf8 = (out: Buffer, at: number, s: string) => {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c >= 128) return at + i + out.write(s.slice(i), at + i, "utf8")
    out[at + i] = c
  }
  return at + s.length
}

/** A string as JSON at `at` (digits in quotes as they are, anything else through JSON.stringify); the place after. */
const jsonString = (out: Buffer, at: number, s: string, digits: boolean) => {
  if (!digits) return utf8(out, at, JSON.stringify(s))
  out[at] = 34
  at = ascii(out, at + 1, s)
  out[at] = 34
  return at + 1
}

/** The most bytes `s` takes as UTF-8 (JSON-escaped or not: an escape is 6 ASCII bytes for a character). */
const most = (s: string) => s.length * 6 + 2

/**
 * A stream's writer: each call encodes a batch of events into one buffer. It keeps the last row's parts and the
 * last shared data's bytes between calls (a row may span two batches).
 */
export const sseWriter = (): (events: ReadonlyArray<EventLog.LoggedEvent>) => Uint8Array => {
  let row: RowParts | undefined
  let data: unknown = undefined
  let dataJson = ""
  let dataBytes: Buffer | undefined
  // most of a message is the same for a row's events: what follows the job id up to the data (for the last row
  // and attempt that had it, with no subject), and the data with the message's end (for the last row and kept
  // data): one copy each
  let tail = Buffer.alloc(0), tailParts: RowParts | undefined, tailAttempt = -1
  let end = Buffer.alloc(0), endParts: RowParts | undefined, endData: Buffer | undefined

  /** The event's data as bytes when kept (a row's shared data, seen twice), else as JSON text. */
  const dataOf = (e: EventLog.LoggedEvent): Buffer | string => {
    if (e.data === null) return nullText
    if (e.data !== data) {
      data = e.data
      dataJson = JSON.stringify(e.data)
      dataBytes = undefined
      return dataJson
    }
    // a row's shared data (a claim's worker) is one object for all its events: its bytes are kept once seen twice
    return dataBytes ??= bytes(dataJson)
  }

  /** Writes `e` at `at` of `out` (which has room for it: see the caller); the place after it. */
  const event = (out: Buffer, at: number, e: EventLog.LoggedEvent, parts: RowParts, d: Buffer | string) => {
    const idDigits = isDigits(e.id)
    at = copy(out, at, idLine)
    at = idDigits ? ascii(out, at, e.id) : utf8(out, at, e.id)
    at = copy(out, at, parts.afterId)
    at = jsonString(out, at, e.id, idDigits)
    at = copy(out, at, parts.afterEventId)
    at = jsonString(out, at, e.jobId, isDigits(e.jobId))
    // an attempt is a small whole number: one digit, as JSON writes it
    const digit = Number.isInteger(e.attempt) && e.attempt >= 0 && e.attempt < 10
    if (e.subjectId === null && digit) {
      if (tailParts !== parts || tailAttempt !== e.attempt) {
        tail = Buffer.concat([parts.afterJobId, nullText, attemptField, Buffer.of(48 + e.attempt), dataField])
        tailParts = parts
        tailAttempt = e.attempt
      }
      at = copy(out, at, tail)
    } else {
      at = copy(out, at, parts.afterJobId)
      at = e.subjectId === null ? copy(out, at, nullText) : utf8(out, at, JSON.stringify(e.subjectId))
      at = copy(out, at, attemptField)
      if (digit) out[at++] = 48 + e.attempt
      else at = utf8(out, at, JSON.stringify(e.attempt))
      at = copy(out, at, dataField)
    }
    if (typeof d === "string") return copy(out, utf8(out, at, d), parts.end)
    if (endParts !== parts || endData !== d) {
      end = Buffer.concat([d, parts.end])
      endParts = parts
      endData = d
    }
    return copy(out, at, end)
  }

  return (events) => {
    // a guess of the batch's size (a drain's events are ~220 bytes): one allocation, grown if short
    let out = Buffer.allocUnsafe(events.length * 256 + 1024)
    let at = 0
    for (const e of events) {
      if (row === undefined || !sameRow(row, e)) row = rowParts(e)
      const d = dataOf(e)
      // the ids twice (the id line and the JSON), the subject ("null" or JSON), an attempt's JSON (a number's
      // text is at most 24 characters), the data: at most 3 bytes a UTF-16 unit
      const need = row.size + 3 * (most(e.id) * 2 + most(e.jobId) + (e.subjectId === null ? 4 : most(e.subjectId)) + 24) + d.length * 3
      if (at + need > out.length) {
        const bigger = Buffer.allocUnsafe(Math.max(out.length * 2, at + need))
        out.copy(bigger, 0, 0, at)
        out = bigger
      }
      at = event(out, at, e, row, d)
    }
    return out.subarray(0, at)
  }
}
