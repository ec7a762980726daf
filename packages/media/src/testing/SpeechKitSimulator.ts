/**
 * A local SIMULATOR of Yandex SpeechKit's async recognition REST API v3 — not the real service, and it
 * says so: every response carries `x-pgfiber-simulator: 1`, operations are created by
 * "pgfiber-simulator", log lines start with "[SpeechKit simulator]". It lets the SpeechKit client and
 * the transcription stages be tested over real HTTP on loopback, without contacting Yandex.
 *
 * Routes (one server serves both the stt and the operation host):
 * - `POST /stt/v3/recognizeFileAsync` → Operation `{ id, done: false, … }`
 * - `GET  /operations/{id}` → Operation; `done` after `pollsUntilDone` polls answered `done: false`
 * - `GET  /stt/v3/getRecognition?operationId=…` → `{"result": StreamingResponse}` objects, one per line
 *
 * It checks what SpeechKit checks, in this order, each answered with a google.rpc.Status body:
 * 1. `Authorization: Api-Key <key>` / `Bearer <token>` equal to the configured one (scheme case-insensitive) → else 401
 * 2. on the stt routes, `x-folder-id` equal to `folderId` when one is configured → 401 when missing, 403 when different
 *    (the real codes for these are not documented; this is our guess)
 * 3. the request itself: a JSON body with camelCase or snake_case keys (protojson accepts both), no unknown
 *    fields (stricter than the real service, which drops them: a typo here should fail a test), exactly one of
 *    `uri`/`content`, `containerAudio.containerAudioType` `OGG_OPUS` (the only format the pipeline sends),
 *    a `languageRestriction` with a restrictionType and plausible `languageCode`s (`ll-CC` or `auto`), a known
 *    model, documented enum values → else 400
 * 4. the route's scripted faults (`faults`, `scriptFaults`): a status to answer, `"hang"`, or `"pass"`
 * 5. the work: the uri is downloaded (http/https; `file:` only with `allowFileUris`; the query string is
 *    dropped, as SpeechKit ignores it) and must be OGG Opus (`OggS` + `OpusHead`), else the operation ends
 *    `done: true` with `error { code: 3 }`. The transcript is `transcript` when given, or derived from the
 *    audio's duration and channel count: one utterance per `utteranceMs` per channel.
 *
 * getRecognition before the operation is done answers 404, after it failed the operation's error (the docs
 * do not say what the real service answers; both are `Permanent` to the client).
 *
 * Quirks it can play, for fault tests: `operationErrors` (the first operations end with given gRPC codes, e.g.
 * 14 then success), `resultsNotFoundAfterDone` (getRecognition 404s for a while after `done`), `maxDurationMs` /
 * `maxBytes` (SpeechKit's 4 h, all channels counted, and 1 GB limits, ending the operation with code 3), and via
 * `faults` any status with headers (a 429 with an outsized `Retry-After`, a malformed 2xx body). A
 * multi-channel OGG is recognised per channel: utterances carry `channelTag` "0", "1", …. When done, it sends, per
 * utterance: a `partial`, a `final` (with `audioCursors.finalIndex`, counted per
 * channel), a `finalRefinement.normalizedText` when the request enabled text normalization, an `eouUpdate`.
 * int64 fields are JSON strings, as proto3 JSON writes them.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { Clock, Context, Duration, Effect, Either, Layer, Option, ParseResult, Ref, Schema, type Scope, Stream, SubscriptionRef } from "effect"
import * as Fs from "node:fs/promises"
import * as Http from "node:http"
import * as Url from "node:url"

export type Route = "recognizeFileAsync" | "getOperation" | "getRecognition"

/**
 * A scripted answer for one request on a route, consumed in order: `{ status }` answers that status
 * (a google.rpc.Status body unless `body` is given: a string is sent raw, anything else as JSON),
 * `"hang"` never answers, `"pass"` lets the request through.
 */
export type Fault =
  | "pass"
  | "hang"
  | {
    readonly status: number
    readonly headers?: Readonly<Record<string, string>> | undefined
    readonly body?: unknown
  }

/** One utterance of a scripted transcript. */
export interface Utterance {
  readonly channel: string
  readonly startMs: number
  readonly endMs: number
  readonly text: string
  /** Sent as finalRefinement when the request enabled normalization; default: `text`. */
  readonly normalizedText?: string | undefined
}

export interface Options {
  /** Default 127.0.0.1. */
  readonly host?: string | undefined
  /** Default 0: a free port. */
  readonly port?: number | undefined
  /** The accepted `Api-Key`; with neither this nor `iamToken`, every request is 401. */
  readonly apiKey?: string | undefined
  /** The accepted `Bearer` IAM token. */
  readonly iamToken?: string | undefined
  /** When set, the stt routes require `x-folder-id` equal to it. */
  readonly folderId?: string | undefined
  /** How many polls of an operation answer `done: false` before it is done. Default 1. */
  readonly pollsUntilDone?: number | undefined
  /** Accept `file:` uris (local development). Default false. */
  readonly allowFileUris?: boolean | undefined
  /** Accepted `recognitionModel.model` values. Default the documented ones. */
  readonly models?: ReadonlyArray<string> | undefined
  /** The transcript of every operation; default derived from the audio. */
  readonly transcript?: ReadonlyArray<Utterance> | undefined
  /** Utterance length of the derived transcript. Default 5000 ms. */
  readonly utteranceMs?: number | undefined
  /** Ends every operation with this error, whatever the audio. */
  readonly operationError?: { readonly code: number; readonly message: string } | undefined
  /**
   * The fates of the first operations started, one each in order: an error ends it the way a recognizer that
   * crashed or timed out does, `null` lets it work (e.g. `[{ code: 14, … }, null]`); later operations work.
   */
  readonly operationErrors?: ReadonlyArray<{ readonly code: number; readonly message: string } | null> | undefined
  /**
   * getRecognition answers 404 this many times per operation after the operation is done (results not yet
   * readable: seen on the real service shortly after `done`). Default 0.
   */
  readonly resultsNotFoundAfterDone?: number | undefined
  /**
   * SpeechKit's async limits: audio longer than this, all channels counted, or larger, ends the operation with
   * `error { code: 3 }`. Default 4 hours and 1 GB.
   */
  readonly maxDurationMs?: number | undefined
  readonly maxBytes?: number | undefined
  readonly faults?: { readonly [R in Route]?: ReadonlyArray<Fault> } | undefined
}

export interface RecordedRequest {
  readonly method: string
  /** Path and query, as received. */
  readonly url: string
  /** Lower-cased names, as received (the credentials included: this stays in memory, never in a log). */
  readonly headers: Readonly<Record<string, string>>
  /** The parsed JSON body, the raw text when it is not JSON, undefined when empty. */
  readonly body: unknown
}

/** What a test holds: the base url (for both the stt and the operation host) and the traffic seen. */
export interface Handle {
  readonly url: string
  readonly count: (route: Route) => Effect.Effect<number>
  readonly requests: (route: Route) => Effect.Effect<ReadonlyArray<RecordedRequest>>
  readonly lastRequest: (route: Route) => Effect.Effect<Option.Option<RecordedRequest>>
  /** Replaces the route's remaining fault script. */
  readonly scriptFaults: (route: Route, faults: ReadonlyArray<Fault>) => Effect.Effect<void>
  /** Waits until the route has seen `n` requests (a hung request counts on arrival). */
  readonly awaitRequests: (route: Route, n: number) => Effect.Effect<void>
}

export class SpeechKitSimulator extends Context.Tag("pgfiber/SpeechKitSimulator")<SpeechKitSimulator, Handle>() {}

export const defaultModels: ReadonlyArray<string> = ["general", "general:rc", "general:deprecated", "deferred-general"]

// ---------------------------------------------------------------------------------------------
// Request schema (what RecognizeFileRequest may hold: en/speechkit/stt-v3/api-ref/AsyncRecognizer/recognizeFile.md)
// ---------------------------------------------------------------------------------------------

const optional = Schema.optional
const Int64Input = Schema.Union(Schema.String, Schema.Number)

const RecognizeFileRequest = Schema.Struct({
  uri: optional(Schema.String),
  content: optional(Schema.String),
  recognitionModel: optional(Schema.Struct({
    model: optional(Schema.String),
    audioFormat: optional(Schema.Struct({
      rawAudio: optional(Schema.Struct({
        audioEncoding: optional(Schema.Literal("AUDIO_ENCODING_UNSPECIFIED", "LINEAR16_PCM")),
        sampleRateHertz: optional(Int64Input),
        audioChannelCount: optional(Int64Input)
      })),
      containerAudio: optional(Schema.Struct({
        containerAudioType: optional(Schema.Literal("CONTAINER_AUDIO_TYPE_UNSPECIFIED", "WAV", "OGG_OPUS", "MP3"))
      }))
    })),
    textNormalization: optional(Schema.Struct({
      textNormalization: optional(
        Schema.Literal("TEXT_NORMALIZATION_UNSPECIFIED", "TEXT_NORMALIZATION_ENABLED", "TEXT_NORMALIZATION_DISABLED")
      ),
      profanityFilter: optional(Schema.Boolean),
      literatureText: optional(Schema.Boolean),
      phoneFormattingMode: optional(Schema.Literal("PHONE_FORMATTING_MODE_UNSPECIFIED", "PHONE_FORMATTING_MODE_DISABLED"))
    })),
    languageRestriction: optional(Schema.Struct({
      restrictionType: optional(Schema.Literal("LANGUAGE_RESTRICTION_TYPE_UNSPECIFIED", "WHITELIST", "BLACKLIST")),
      languageCode: optional(Schema.Array(Schema.String))
    })),
    audioProcessingType: optional(Schema.Literal("AUDIO_PROCESSING_TYPE_UNSPECIFIED", "REAL_TIME", "FULL_DATA"))
  })),
  recognitionClassifier: optional(Schema.Unknown),
  speechAnalysis: optional(Schema.Unknown),
  speakerLabeling: optional(Schema.Unknown),
  summarization: optional(Schema.Unknown)
})
type RecognizeFileRequest = typeof RecognizeFileRequest.Type

const decodeRequest = Schema.decodeUnknownEither(RecognizeFileRequest, { onExcessProperty: "error", errors: "all" })

/** protojson accepts proto field names (`recognition_model`) as well as JSON names; fold to the latter. */
const camelCaseKeys = (value: unknown): unknown =>
  Array.isArray(value)
    ? value.map(camelCaseKeys)
    : typeof value === "object" && value !== null
    ? Object.fromEntries(
      Object.entries(value).map(([key, v]) => [key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase()), camelCaseKeys(v)])
    )
    : value

/** SpeechKit's codes are `ll-CC` (`ru-RU`, and the odd `kk-KK`) or `auto`, case-insensitive (stt/models.md). */
const plausibleLanguage = (code: string) => /^[a-z]{2,3}-[a-z]{2}$/i.test(code) || code.toLowerCase() === "auto"

// ---------------------------------------------------------------------------------------------
// google.rpc.Status answers (en/_includes/errors-handling.md: HTTP ↔ gRPC code table)
// ---------------------------------------------------------------------------------------------

const grpcCodeOf = (httpStatus: number): number =>
  ({ 400: 3, 401: 16, 403: 7, 404: 5, 409: 10, 429: 8, 499: 1, 500: 13, 501: 12, 503: 14, 504: 4 } as Record<number, number>)[
    httpStatus
  ] ?? (httpStatus >= 500 ? 13 : 2)

const httpStatusOf = (grpcCode: number): number =>
  ({ 1: 499, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409, 11: 400, 12: 501, 13: 500, 14: 503, 16: 401 } as Record<number, number>)[
    grpcCode
  ] ?? 500

interface Answer {
  readonly status: number
  readonly body: string
  readonly headers?: Readonly<Record<string, string>> | undefined
}

const statusAnswer = (status: number, message: string, headers?: Readonly<Record<string, string>>): Answer => ({
  status,
  headers,
  body: JSON.stringify({
    code: grpcCodeOf(status),
    message,
    details: [{ "@type": "type.googleapis.com/google.rpc.RequestInfo", requestId: "pgfiber-simulator" }]
  })
})

const jsonAnswer = (body: unknown): Answer => ({ status: 200, body: JSON.stringify(body) })

const faultAnswer = (fault: Exclude<Fault, "pass" | "hang">): Answer => ({
  status: fault.status,
  headers: fault.headers,
  body: fault.body === undefined
    ? statusAnswer(fault.status, `simulated fault: HTTP ${fault.status}`).body
    : typeof fault.body === "string"
    ? fault.body
    : JSON.stringify(fault.body)
})

// ---------------------------------------------------------------------------------------------
// Audio
// ---------------------------------------------------------------------------------------------

export interface OggOpusInfo {
  readonly channels: number
  readonly durationMs: number
}

const ascii = (text: string) => Buffer.from(text, "latin1")

/**
 * Checks OGG Opus the way a decoder starts: an `OggS` capture pattern, an `OpusHead` in the first page.
 * Duration: the last page's granule position (always 48 kHz for Opus) less the header's pre-skip.
 */
export const inspectOggOpus = (bytes: Uint8Array): Either.Either<OggOpusInfo, string> => {
  const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (buffer.length < 4 || !buffer.subarray(0, 4).equals(ascii("OggS"))) {
    return Either.left("audio is not an OGG stream (no OggS capture pattern)")
  }
  const head = buffer.subarray(0, Math.min(buffer.length, 4096)).indexOf(ascii("OpusHead"))
  if (head < 0 || head + 19 > buffer.length) return Either.left("audio is OGG but not Opus (no OpusHead)")
  const channels = buffer.readUInt8(head + 9)
  const preSkip = buffer.readUInt16LE(head + 10)
  let durationMs = 0
  const last = buffer.lastIndexOf(ascii("OggS"))
  if (last >= 0 && last + 14 <= buffer.length) {
    const granule = buffer.readBigInt64LE(last + 6)
    if (granule > 0n) durationMs = Math.max(0, Math.floor((Number(granule) - preSkip) / 48))
  }
  return Either.right({ channels: Math.max(1, channels), durationMs })
}

/** The deterministic transcript of audio the simulator did not hear: one numbered utterance per window. */
export const derivedTranscript = (info: OggOpusInfo, utteranceMs: number): ReadonlyArray<Utterance> => {
  const utterances: Array<Utterance> = []
  for (let channel = 0; channel < info.channels; channel++) {
    for (let startMs = 0, n = 1; startMs < info.durationMs; startMs += utteranceMs, n++) {
      utterances.push({
        channel: String(channel),
        startMs,
        endMs: Math.min(startMs + utteranceMs, info.durationMs),
        text: `simulated utterance ${n} on channel ${channel}`,
        normalizedText: `Simulated utterance ${n} on channel ${channel}.`
      })
    }
  }
  return utterances
}

/** getRecognition's lines for a transcript, in the shape of the docs' example. */
const recognitionLines = (
  operationId: string,
  utterances: ReadonlyArray<Utterance>,
  normalize: boolean,
  language: string
): ReadonlyArray<string> => {
  const ordered = [...utterances].sort((a, b) => a.startMs - b.startMs || a.channel.localeCompare(b.channel))
  const finalIndex = new Map<string, number>()
  const lines: Array<unknown> = []
  const sessionUuid = { uuid: `pgfiber-simulator-${operationId}`, userRequestId: operationId }
  const alternative = (text: string, startMs: number, endMs: number) => {
    const words = text.split(/\s+/).filter((word) => word !== "")
    const step = words.length > 0 ? (endMs - startMs) / words.length : 0
    return {
      words: words.map((word, i) => ({
        text: word,
        startTimeMs: String(Math.round(startMs + i * step)),
        endTimeMs: String(Math.round(startMs + (i + 1) * step))
      })),
      text,
      startTimeMs: String(startMs),
      endTimeMs: String(endMs),
      confidence: 0,
      languages: [{ languageCode: language, probability: 1 }]
    }
  }
  for (const u of ordered) {
    const index = finalIndex.get(u.channel) ?? 0
    finalIndex.set(u.channel, index + 1)
    const cursors = (eouTimeMs: number) => ({
      receivedDataMs: String(u.endMs),
      resetTimeMs: "0",
      partialTimeMs: String(u.endMs),
      finalTimeMs: String(u.endMs),
      finalIndex: String(index),
      eouTimeMs: String(eouTimeMs)
    })
    const common = (eouTimeMs: number) => ({ sessionUuid, audioCursors: cursors(eouTimeMs), responseWallTimeMs: "1" })
    const words = u.text.split(/\s+/)
    lines.push({
      ...common(0),
      partial: { alternatives: [alternative(words.slice(0, Math.ceil(words.length / 2)).join(" "), u.startMs, u.endMs)], channelTag: u.channel },
      channelTag: u.channel
    })
    lines.push({ ...common(0), final: { alternatives: [alternative(u.text, u.startMs, u.endMs)], channelTag: u.channel }, channelTag: u.channel })
    if (normalize) {
      lines.push({
        ...common(0),
        finalRefinement: {
          finalIndex: String(index),
          normalizedText: { alternatives: [alternative(u.normalizedText ?? u.text, u.startMs, u.endMs)], channelTag: u.channel }
        },
        channelTag: u.channel
      })
    }
    lines.push({ ...common(u.endMs), eouUpdate: { timeMs: String(u.endMs) }, channelTag: u.channel })
  }
  return lines.map((result) => JSON.stringify({ result }))
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

interface OperationState {
  readonly id: string
  readonly createdAt: string
  readonly polls: number
  /** getRecognition calls answered so far (the 404s after done count). */
  readonly reads: number
  readonly outcome:
    | { readonly _tag: "Recognized"; readonly lines: ReadonlyArray<string> }
    | { readonly _tag: "Failed"; readonly code: number; readonly message: string }
}

interface Traffic {
  readonly counts: Readonly<Record<Route, number>>
  readonly requests: Readonly<Record<Route, ReadonlyArray<RecordedRequest>>>
}

const log = (message: string) => Effect.logInfo(`[SpeechKit simulator] ${message}`)

/** The options with their defaults applied. */
interface Settings {
  readonly options: Options
  readonly pollsUntilDone: number
  readonly utteranceMs: number
  readonly models: ReadonlyArray<string>
  readonly maxDurationMs: number
  readonly maxBytes: number
}

const resolveSettings = (options: Options): Settings => ({
  options,
  pollsUntilDone: options.pollsUntilDone ?? 1,
  utteranceMs: options.utteranceMs ?? 5000,
  models: options.models ?? defaultModels,
  maxDurationMs: options.maxDurationMs ?? 4 * 3600 * 1000,
  maxBytes: options.maxBytes ?? 1024 ** 3
})

type OperationError = { readonly code: number; readonly message: string } | null

/**
 * Everything the simulator remembers, one value: the traffic a test reads, the fault scripts still to play,
 * the operations started, the counter their ids come from, the scripted fates of the next operations.
 */
interface SimulatorState {
  readonly traffic: SubscriptionRef.SubscriptionRef<Traffic>
  readonly faults: Ref.Ref<Record<Route, ReadonlyArray<Fault>>>
  readonly operations: Ref.Ref<Map<string, OperationState>>
  readonly counter: Ref.Ref<number>
  readonly scriptedErrors: Ref.Ref<ReadonlyArray<OperationError>>
}

const makeState = (options: Options): Effect.Effect<SimulatorState> =>
  Effect.gen(function*() {
    const traffic = yield* SubscriptionRef.make<Traffic>({
      counts: { recognizeFileAsync: 0, getOperation: 0, getRecognition: 0 },
      requests: { recognizeFileAsync: [], getOperation: [], getRecognition: [] }
    })
    const faults = yield* Ref.make<Record<Route, ReadonlyArray<Fault>>>({
      recognizeFileAsync: options.faults?.recognizeFileAsync ?? [],
      getOperation: options.faults?.getOperation ?? [],
      getRecognition: options.faults?.getRecognition ?? []
    })
    const operations = yield* Ref.make(new Map<string, OperationState>())
    const counter = yield* Ref.make(0)
    const scriptedErrors = yield* Ref.make<ReadonlyArray<OperationError>>(options.operationErrors ?? [])
    return { traffic, faults, operations, counter, scriptedErrors }
  })

/** Counts and keeps a request on its route. */
const record = (state: SimulatorState, route: Route, request: RecordedRequest) =>
  SubscriptionRef.update(state.traffic, (t) => ({
    counts: { ...t.counts, [route]: t.counts[route] + 1 },
    requests: { ...t.requests, [route]: [...t.requests[route], request] }
  }))

/** Takes the route's next scripted fault; `"pass"` when the script is empty. */
const nextFault = (state: SimulatorState, route: Route) =>
  Ref.modify(state.faults, (all): [Fault, Record<Route, ReadonlyArray<Fault>>] => {
    const [first, ...rest] = all[route]
    return first === undefined ? ["pass", all] : [first, { ...all, [route]: rest }]
  })

// --- auth ------------------------------------------------------------------------------------

/** Check 1: the Authorization header against the configured key or token. */
const checkAuth = (options: Options, headers: Readonly<Record<string, string>>): Option.Option<Answer> => {
  if (options.apiKey === undefined && options.iamToken === undefined) {
    return Option.some(statusAnswer(401, "the simulator has no credentials configured (apiKey or iamToken)"))
  }
  const header = headers["authorization"]
  if (!header) return Option.some(statusAnswer(401, "the Authorization header is missing"))
  const match = /^(\S+)\s+(\S+)$/.exec(header.trim())
  if (!match) return Option.some(statusAnswer(401, "malformed Authorization header: expected 'Api-Key <key>' or 'Bearer <IAM token>'"))
  const [, scheme, credential] = match
  switch (scheme!.toLowerCase()) {
    case "api-key":
      return options.apiKey !== undefined && credential === options.apiKey
        ? Option.none()
        : Option.some(statusAnswer(401, "Unknown api key"))
    case "bearer":
      return options.iamToken !== undefined && credential === options.iamToken
        ? Option.none()
        : Option.some(statusAnswer(401, "The token is invalid or has expired"))
    default:
      return Option.some(statusAnswer(401, `unsupported authorization scheme '${scheme}'`))
  }
}

/** Check 2 (stt routes): `x-folder-id` against the configured folder. */
const checkFolder = (options: Options, headers: Readonly<Record<string, string>>): Option.Option<Answer> => {
  if (options.folderId === undefined) return Option.none()
  const folder = headers["x-folder-id"]
  if (!folder) return Option.some(statusAnswer(401, "the x-folder-id header is required for this account"))
  if (folder !== options.folderId) return Option.some(statusAnswer(403, `Permission denied to folder ${folder}`))
  return Option.none()
}

// --- recognizeFileAsync --------------------------------------------------------------------

/** Check 3 for recognizeFileAsync: the body is a RecognizeFileRequest the pipeline may send. */
const validateRecognize = (settings: Settings, body: unknown): Either.Either<RecognizeFileRequest, Answer> => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return Either.left(statusAnswer(400, "the request body must be a JSON object"))
  }
  const decoded = decodeRequest(camelCaseKeys(body))
  if (Either.isLeft(decoded)) {
    return Either.left(statusAnswer(400, `invalid RecognizeFileRequest: ${ParseResult.TreeFormatter.formatErrorSync(decoded.left)}`))
  }
  const request = decoded.right
  const bad = (message: string) => Either.left(statusAnswer(400, message))
  if ((request.uri === undefined) === (request.content === undefined)) {
    return bad("exactly one of uri or content must be set")
  }
  if (request.uri !== undefined) {
    const url = URL.canParse(request.uri) ? new URL(request.uri) : undefined
    const schemes = settings.options.allowFileUris ? ["http:", "https:", "file:"] : ["http:", "https:"]
    if (!url || !schemes.includes(url.protocol)) return bad("uri must be an http(s) url of the audio file")
  }
  if (request.content !== undefined && !/^[A-Za-z0-9+/_-]*={0,2}$/.test(request.content)) {
    return bad("content must be base64")
  }
  const model = request.recognitionModel?.model ?? "general"
  if (!settings.models.includes(model)) return bad(`unknown recognition model '${model}'`)
  const format = request.recognitionModel?.audioFormat
  if (format?.rawAudio !== undefined) return bad("rawAudio is not supported by the simulator: send containerAudio OGG_OPUS")
  const containerType = format?.containerAudio?.containerAudioType
  if (containerType !== "OGG_OPUS") {
    return bad(`audioFormat.containerAudio.containerAudioType must be OGG_OPUS, got ${containerType ?? "nothing"}`)
  }
  const restriction = request.recognitionModel?.languageRestriction
  if (restriction !== undefined) {
    const codes = restriction.languageCode ?? []
    if (restriction.restrictionType === undefined || restriction.restrictionType === "LANGUAGE_RESTRICTION_TYPE_UNSPECIFIED") {
      return bad("languageRestriction.restrictionType must be WHITELIST or BLACKLIST")
    }
    if (codes.length === 0) return bad("languageRestriction.languageCode must list at least one language")
    const implausible = codes.filter((code) => !plausibleLanguage(code))
    if (implausible.length > 0) return bad(`unsupported language code(s): ${implausible.join(", ")}`)
  }
  return Either.right(request)
}

/** The audio bytes, or why the operation will fail. The uri's query is dropped, as SpeechKit ignores it. */
const fetchAudio = (http: HttpClient.HttpClient, request: RecognizeFileRequest): Effect.Effect<Either.Either<Uint8Array, string>> => {
  if (request.content !== undefined) return Effect.succeed(Either.right(Buffer.from(request.content, "base64")))
  const url = new URL(request.uri!)
  url.search = ""
  url.hash = ""
  if (url.protocol === "file:") {
    return Effect.tryPromise(() => Fs.readFile(Url.fileURLToPath(url))).pipe(
      Effect.map((bytes): Either.Either<Uint8Array, string> => Either.right(bytes)),
      Effect.orElseSucceed(() => Either.left(`cannot read audio file ${url.pathname}`))
    )
  }
  return http.get(url).pipe(
    Effect.flatMap((response) =>
      response.status === 200
        ? Effect.map(response.arrayBuffer, (buffer): Either.Either<Uint8Array, string> => Either.right(new Uint8Array(buffer)))
        : Effect.succeed(Either.left(`cannot download audio ${url.pathname}: HTTP ${response.status}`))
    ),
    Effect.timeout(Duration.seconds(60)),
    Effect.orElseSucceed(() => Either.left(`cannot download audio ${url.pathname}: network error`))
  )
}

/** recognizeFileAsync's work: decides the operation's fate now, stores it, answers the new operation. */
const recognize = (state: SimulatorState, settings: Settings, http: HttpClient.HttpClient) => (request: RecognizeFileRequest) =>
  Effect.gen(function*() {
    const { options, maxDurationMs, maxBytes } = settings
    const n = yield* Ref.updateAndGet(state.counter, (n) => n + 1)
    const id = `sim${String(n).padStart(17, "0")}`
    const audio = yield* fetchAudio(http, request)
    const info = Either.flatMap(audio, inspectOggOpus)
    const codes = request.recognitionModel?.languageRestriction?.languageCode ?? []
    const language = codes.find((code) => code.toLowerCase() !== "auto") ?? "ru-RU"
    const normalize = request.recognitionModel?.textNormalization?.textNormalization === "TEXT_NORMALIZATION_ENABLED"
    const scripted = yield* Ref.modify(state.scriptedErrors, (all) => [all[0] ?? undefined, all.slice(1)] as const)
    // every channel is recognised separately and counts toward the limit (stt/limits)
    const overLimit = Either.isRight(info) && Either.isRight(audio)
      ? info.right.durationMs * info.right.channels > maxDurationMs
        ? `audio too long: ${info.right.durationMs} ms × ${info.right.channels} channel(s) is over ${maxDurationMs} ms`
        : audio.right.byteLength > maxBytes
        ? `audio too large: ${audio.right.byteLength} bytes is over ${maxBytes}`
        : undefined
      : undefined
    const outcome: OperationState["outcome"] = options.operationError
      ? { _tag: "Failed", ...options.operationError }
      : scripted
      ? { _tag: "Failed", ...scripted }
      : Either.isLeft(info)
      ? { _tag: "Failed", code: 3, message: info.left }
      : overLimit
      ? { _tag: "Failed", code: 3, message: overLimit }
      : {
        _tag: "Recognized",
        lines: recognitionLines(id, options.transcript ?? derivedTranscript(info.right, settings.utteranceMs), normalize, language)
      }
    const createdAt = new Date(yield* Clock.currentTimeMillis).toISOString()
    yield* Ref.update(state.operations, (map) => new Map(map).set(id, { id, createdAt, polls: 0, reads: 0, outcome }))
    yield* log(`operation ${id} started (${outcome._tag === "Failed" ? `will fail: ${outcome.message}` : "audio OK"})`)
    return jsonAnswer(operationJson({ id, createdAt, polls: 0, reads: 0, outcome }, false))
  })

/** An Operation as the operation service writes it. */
const operationJson = (operation: OperationState, done: boolean) => ({
  id: operation.id,
  description: "STT v3 async recognition (pgfiber SpeechKit simulator)",
  createdAt: operation.createdAt,
  createdBy: "pgfiber-simulator",
  modifiedAt: operation.createdAt,
  done,
  metadata: null,
  ...(done && operation.outcome._tag === "Failed"
    ? { error: { code: operation.outcome.code, message: operation.outcome.message, details: [] } }
    : {})
})

const isDone = (settings: Settings, operation: OperationState) => operation.polls > settings.pollsUntilDone

// --- getOperation / getRecognition ---------------------------------------------------------

const notFound = (id: string) => statusAnswer(404, `Operation ${id} not found`)

/** getOperation's work: counts the poll and answers the operation. */
const poll = (state: SimulatorState, settings: Settings) => (id: string) =>
  Effect.gen(function*() {
    const operation = yield* Ref.modify(state.operations, (map): [OperationState | undefined, Map<string, OperationState>] => {
      const found = map.get(id)
      if (!found) return [undefined, map]
      const next = { ...found, polls: found.polls + 1 }
      return [next, new Map(map).set(id, next)]
    })
    if (!operation) return notFound(id)
    return jsonAnswer(operationJson(operation, isDone(settings, operation)))
  })

/** getRecognition's work: the result lines of a done operation, counting the read. */
const recognition = (state: SimulatorState, settings: Settings) => (id: string) =>
  Effect.gen(function*() {
    const operation = yield* Ref.modify(state.operations, (map): [OperationState | undefined, Map<string, OperationState>] => {
      const found = map.get(id)
      if (!found || !isDone(settings, found)) return [found, map]
      const next = { ...found, reads: found.reads + 1 }
      return [next, new Map(map).set(id, next)]
    })
    if (!operation) return notFound(id)
    // The docs do not say what an unfinished or failed operation answers here; NOT_FOUND is our guess.
    if (!isDone(settings, operation)) return statusAnswer(404, `results of operation ${id} are not ready`)
    if (operation.reads <= (settings.options.resultsNotFoundAfterDone ?? 0)) {
      return statusAnswer(404, `results of operation ${id} not found`)
    }
    if (operation.outcome._tag === "Failed") {
      return statusAnswer(httpStatusOf(operation.outcome.code), operation.outcome.message)
    }
    return { status: 200, body: operation.outcome.lines.join("\n") + "\n" } satisfies Answer
  })

// --- plumbing --------------------------------------------------------------------------------

const respond = (answer: Answer) =>
  HttpServerResponse.text(answer.body, {
    status: answer.status,
    contentType: "application/json",
    headers: { ...answer.headers, "x-pgfiber-simulator": "1" }
  })

/** auth → folder → request checks → scripted fault → work; every request recorded on arrival. */
const serve = <A>(
  state: SimulatorState,
  settings: Settings,
  route: Route,
  validate: (request: RecordedRequest, params: Readonly<Record<string, string | undefined>>) => Either.Either<A, Answer>,
  work: (input: A) => Effect.Effect<Answer>
) =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const params = yield* HttpRouter.params
    const text = yield* request.text.pipe(Effect.orElseSucceed(() => ""))
    const recorded: RecordedRequest = {
      method: request.method,
      url: request.url,
      headers: { ...request.headers },
      body: text === "" ? undefined : Either.getOrElse(parseJson(text), () => text)
    }
    yield* record(state, route, recorded)
    const answer = yield* Effect.gen(function*() {
      const denied = Option.orElse(checkAuth(settings.options, recorded.headers), () =>
        route === "getOperation" ? Option.none() : checkFolder(settings.options, recorded.headers))
      if (Option.isSome(denied)) return denied.value
      const input = validate(recorded, params)
      if (Either.isLeft(input)) return input.left
      const fault = yield* nextFault(state, route)
      if (fault === "hang") {
        yield* log(`${route}: scripted hang`)
        return yield* Effect.never
      }
      if (fault !== "pass") return faultAnswer(fault)
      return yield* work(input.right)
    })
    yield* log(`${request.method} ${request.url.split("?")[0]} (${route}) → ${answer.status}`)
    return respond(answer)
  })

/** The three routes, and a google.rpc.Status 404 for any other. */
const makeApp = (state: SimulatorState, settings: Settings, http: HttpClient.HttpClient) =>
  HttpRouter.empty.pipe(
    HttpRouter.post(
      "/stt/v3/recognizeFileAsync",
      serve(
        state,
        settings,
        "recognizeFileAsync",
        (request) =>
          request.body === undefined || typeof request.body === "string"
            ? Either.left(statusAnswer(400, "the request body must be JSON"))
            : validateRecognize(settings, request.body),
        recognize(state, settings, http)
      )
    ),
    HttpRouter.get(
      "/operations/:id",
      serve(
        state,
        settings,
        "getOperation",
        (_, params) => Either.right(params.id ?? ""),
        poll(state, settings)
      )
    ),
    HttpRouter.get(
      "/stt/v3/getRecognition",
      serve(
        state,
        settings,
        "getRecognition",
        (request) => {
          const params = new URL(request.url, "http://simulator").searchParams
          const id = params.get("operationId") ?? params.get("operation_id")
          return id ? Either.right(id) : Either.left(statusAnswer(400, "operationId is required"))
        },
        recognition(state, settings)
      )
    ),
    Effect.catchTag("RouteNotFound", (error) =>
      Effect.succeed(respond(statusAnswer(404, `the simulator has no route ${error.request.method} ${error.request.url.split("?")[0]}`)))),
    Effect.annotateLogs({ simulator: "speechkit" })
  )

/** Serves `app` on the configured host and port for the life of the scope; succeeds with the base url. */
const listen = (options: Options, app: ReturnType<typeof makeApp>) =>
  Effect.gen(function*() {
    const nodeServer = Http.createServer()
    const server = yield* NodeHttpServer.make(() => nodeServer, {
      host: options.host ?? "127.0.0.1",
      port: options.port ?? 0
    }).pipe(Effect.orDie)
    // Runs before the server's own close, which would otherwise wait out clients' keep-alive on a hung request.
    yield* Effect.addFinalizer(() => Effect.sync(() => nodeServer.closeAllConnections()))
    yield* server.serve(app)
    const address = server.address
    return address._tag === "TcpAddress"
      ? `http://${address.hostname.includes(":") ? `[${address.hostname}]` : address.hostname}:${address.port}`
      : `unix:${address.path}`
  })

/** What a test holds, reading the simulator's state. */
const makeHandle = (state: SimulatorState, url: string): Handle => ({
  url,
  count: (route) => Effect.map(SubscriptionRef.get(state.traffic), (t) => t.counts[route]),
  requests: (route) => Effect.map(SubscriptionRef.get(state.traffic), (t) => t.requests[route]),
  lastRequest: (route) => Effect.map(SubscriptionRef.get(state.traffic), (t) => Option.fromNullable(t.requests[route].at(-1))),
  scriptFaults: (route, script) => Ref.update(state.faults, (all) => ({ ...all, [route]: script })),
  awaitRequests: (route, n) =>
    state.traffic.changes.pipe(Stream.filter((t) => t.counts[route] >= n), Stream.take(1), Stream.runDrain)
})

/** Starts the simulator on loopback for the life of the scope. */
export const make = (options: Options = {}): Effect.Effect<Handle, never, HttpClient.HttpClient | Scope.Scope> =>
  Effect.gen(function*() {
    const http = yield* HttpClient.HttpClient
    const settings = resolveSettings(options)
    const state = yield* makeState(options)
    const url = yield* listen(options, makeApp(state, settings, http))
    yield* log(`listening on ${url} (a simulator, not Yandex SpeechKit)`)
    return makeHandle(state, url)
  })

const parseJson = (text: string): Either.Either<unknown, unknown> => Either.try(() => JSON.parse(text) as unknown)

/** The simulator as a layer, downloads over the global fetch. */
export const layer = (options: Options = {}): Layer.Layer<SpeechKitSimulator> =>
  Layer.scoped(SpeechKitSimulator, make(options)).pipe(Layer.provide(FetchHttpClient.layer))

/**
 * Runs the simulator until interrupted, for local development, e.g.
 * `NodeRuntime.runMain(SpeechKitSimulator.run({ port: 8787, apiKey: "dev", allowFileUris: true }))`,
 * then point SPEECHKIT_STT_URL and SPEECHKIT_OPERATION_URL at it.
 */
export const run = (options: Options = {}): Effect.Effect<never> =>
  Effect.gen(function*() {
    yield* make(options)
    return yield* Effect.never
  }).pipe(Effect.scoped, Effect.provide(FetchHttpClient.layer))

