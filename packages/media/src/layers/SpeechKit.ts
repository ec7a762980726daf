/**
 * Yandex SpeechKit asynchronous recognition (REST API v3) as a service: start a recognition of an
 * audio file by uri, poll its Operation, read the result stream. It speaks the real API, read from
 * yandex-cloud/docs (`en/speechkit/stt-v3/api-ref/AsyncRecognizer/{recognizeFile,getRecognition}.md`,
 * `en/_includes/speechkit/async-recognition-v3.md`, `en/api-design-guide/concepts/operation.md`):
 *
 * - `POST {sttUrl}/stt/v3/recognizeFileAsync` with a RecognizeFileRequest → an Operation `{ id, done }`
 * - `GET {operationUrl}/operations/{id}` → an Operation; `done: true` carries `error` (google.rpc.Status) or not
 * - `GET {sttUrl}/stt/v3/getRecognition?operationId=…` → a stream of JSON objects, each `{ "result": StreamingResponse }`
 *
 * Auth is `Authorization: Api-Key <key>` or `Authorization: Bearer <IAM token>`, plus `x-folder-id`
 * when a folder is configured (needed for user accounts; a service account uses its own folder).
 *
 * It fails only with the shared JobError vocabulary, so the stage's retry policy acts on the tag:
 *
 * | outcome                                                  | error                                                     |
 * | -------------------------------------------------------- | --------------------------------------------------------- |
 * | HTTP 429                                                 | `RateLimited` after `Retry-After` (seconds or HTTP-date), else `defaultRetryAfter` (60 s: the async quotas are per hour); capped at `maxRetryAfter` (10 min) |
 * | HTTP 5xx, 408, 409, network error, per-request timeout   | `Transient`                                               |
 * | getRecognition 404 (results not readable yet after done) | asked again `resultNotFoundRetries` times (1 s, 2 s, 4 s), then `Permanent` |
 * | any other 4xx (400, 401, 403, 404, …)                    | `Permanent` with the server's `message` and gRPC `code`   |
 * | 2xx whose body is not JSON or not the contract           | `Permanent`: the server answered, and a retry gets the same answer (a mismatch of contract, or a proxy page); a body cut short on the wire fails the read first, as `Transient`. The documents client follows the same rule |
 * | Operation with `error` code 4, 13 or 14                  | success `{ done: true, retryable }`: the caller re-submits (bounded) |
 * | Operation with any other `error`                         | `Permanent` with its `code` and `message`                 |
 * | an `{ "error": Status }` line inside the result stream   | by gRPC code: 8 → `RateLimited`, 2/4/10/13/14 → `Transient`, else `Permanent` |
 *
 * Secrets are `Redacted` and never logged: the platform's span attributes redact `authorization`, and
 * no message carries the audio uri (a presigned uri holds a signature).
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import type * as HttpClientResponse from "@effect/platform/HttpClientResponse"
import { Clock, Config, ConfigError, Context, Duration, Effect, Either, Layer, Option, ParseResult, Redacted, Ref, Schedule, Schema } from "effect"
import * as JobError from "pgfiber/internal/JobError.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as RetryAfter from "pgfiber/internal/layers/RetryAfter.js"

export const defaultSttUrl = "https://stt.api.cloud.yandex.net"
export const defaultOperationUrl = "https://operation.api.cloud.yandex.net"

/** What a transcription needs; `languageCodes` empty or absent means the configured language. */
export interface StartRecognition {
  readonly uri: string
  readonly languageCodes?: ReadonlyArray<string> | undefined
  readonly model?: string | undefined
}

/**
 * A finished operation; `retryable` when it ended with a gRPC code a fresh recognition may cure (4
 * DEADLINE_EXCEEDED, 13 INTERNAL, 14 UNAVAILABLE): the caller re-submits, a bounded number of times.
 */
export type OperationStatus =
  | { readonly done: false }
  | { readonly done: true }
  | { readonly done: true; readonly retryable: { readonly code: number; readonly message: string } }

/** SpeechKit's limits for async recognition (stt/limits): audio length counts every channel. */
export const limits = {
  maxDuration: Duration.hours(4),
  maxBytes: 1024 * 1024 * 1024
} as const

/** One utterance. `channel` is SpeechKit's `channelTag` as sent ("0", "1", …). */
export interface Segment {
  readonly startMs: number
  readonly endMs: number
  readonly channel: string
  readonly text: string
}

export interface Recognition {
  readonly segments: ReadonlyArray<Segment>
  /** The language SpeechKit most often rated highest across utterances, when it reported any. */
  readonly language?: string | undefined
}

export type SpeechKitError = JobError.Transient | JobError.RateLimited | JobError.Permanent

export class SpeechKit extends Context.Tag("pgfiber/SpeechKit")<SpeechKit, {
  /** Starts an async recognition of OGG Opus audio at `uri`; succeeds with the operation id. */
  readonly startRecognition: (request: StartRecognition) => Effect.Effect<string, SpeechKitError>
  /** One poll of the operation; an operation that ended with `error` fails `Permanent`. */
  readonly getOperation: (operationId: string) => Effect.Effect<OperationStatus, SpeechKitError>
  /** The finished operation's utterances, normalized text preferred (see `assembleRecognition`). */
  readonly getRecognition: (operationId: string) => Effect.Effect<Recognition, SpeechKitError>
}>() {}

export type Credentials =
  | { readonly _tag: "ApiKey"; readonly apiKey: Redacted.Redacted<string> }
  | { readonly _tag: "IamToken"; readonly iamToken: Redacted.Redacted<string> }

export interface Options {
  readonly credentials: Credentials
  /** Sent as `x-folder-id` when set. */
  readonly folderId?: string | undefined
  readonly sttUrl?: string | undefined
  readonly operationUrl?: string | undefined
  /** `recognitionModel.model` when a request names none. Default `general`. */
  readonly model?: string | undefined
  /** The whitelisted language when a request names none. Default `ru-RU`. */
  readonly language?: string | undefined
  /** Bound on each HTTP call, body included. Default 30 seconds. */
  readonly timeout?: Duration.DurationInput | undefined
  /** Delay for a 429 without a usable `Retry-After`. Default 60 seconds. */
  readonly defaultRetryAfter?: Duration.DurationInput | undefined
  /** A `Retry-After` above this is cut to it, so one odd header cannot park a job for days. Default 10 minutes. */
  readonly maxRetryAfter?: Duration.DurationInput | undefined
  /**
   * getRecognition right after the operation says `done` may still answer 404 (the results are not readable
   * yet): it is asked again this many times, waiting `resultRetryDelay`, doubling, before the 404 is Permanent.
   * Defaults 3 and 1 second.
   */
  readonly resultNotFoundRetries?: number | undefined
  readonly resultRetryDelay?: Duration.DurationInput | undefined
}

// ---------------------------------------------------------------------------------------------
// Wire schemas (only the fields we read; unknown fields are ignored, `null` reads as absent)
// ---------------------------------------------------------------------------------------------

/** proto3 JSON writes int64 as a string ("7400") and accepts numbers; take both. */
const Int64 = Schema.Union(Schema.Int, Schema.NumberFromString.pipe(Schema.int()))
/** The docs type doubles as "string" but the example sends numbers (`"confidence": 0`); take both. */
const Double = Schema.Union(Schema.Number, Schema.NumberFromString)

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optionalWith(schema, { nullable: true })

/** google.rpc.Status, the error model of every Yandex Cloud API (`en/_includes/errors-handling.md`). */
const Status = Schema.Struct({
  code: optionalNullable(Schema.Number),
  message: optionalNullable(Schema.String)
})

const Operation = Schema.Struct({
  id: Schema.String.pipe(Schema.nonEmptyString()),
  done: optionalNullable(Schema.Boolean),
  error: optionalNullable(Status)
})

const Alternative = Schema.Struct({
  text: optionalNullable(Schema.String),
  startTimeMs: optionalNullable(Int64),
  endTimeMs: optionalNullable(Int64),
  words: optionalNullable(Schema.Array(Schema.Struct({
    startTimeMs: optionalNullable(Int64),
    endTimeMs: optionalNullable(Int64)
  }))),
  languages: optionalNullable(Schema.Array(Schema.Struct({
    languageCode: optionalNullable(Schema.String),
    probability: optionalNullable(Double)
  })))
})

const AlternativeUpdate = Schema.Struct({
  alternatives: optionalNullable(Schema.Array(Alternative)),
  channelTag: optionalNullable(Schema.String)
})

const StreamingResponse = Schema.Struct({
  audioCursors: optionalNullable(Schema.Struct({ finalIndex: optionalNullable(Int64) })),
  final: optionalNullable(AlternativeUpdate),
  finalRefinement: optionalNullable(Schema.Struct({
    finalIndex: optionalNullable(Int64),
    normalizedText: optionalNullable(AlternativeUpdate)
  })),
  channelTag: optionalNullable(Schema.String)
})
type StreamingResponse = typeof StreamingResponse.Type

/**
 * One object of the getRecognition stream. The docs' example wraps each in `{ "result": … }` (grpc-gateway
 * streaming), the reference page shows it bare; a mid-stream failure arrives as `{ "error": Status }`.
 * Chosen by key rather than by a Union, so a malformed `result` fails instead of passing as an empty bare line.
 */
const StreamLine = Schema.Union(
  Schema.Struct({ _tag: Schema.tag("Result"), result: StreamingResponse }),
  Schema.Struct({ _tag: Schema.tag("Error"), error: Status })
)
type StreamLine = typeof StreamLine.Type

const tagStreamLine = (object: unknown): unknown =>
  typeof object !== "object" || object === null || Array.isArray(object)
    ? object
    : "result" in object
    ? { _tag: "Result", result: object.result }
    : "error" in object
    ? { _tag: "Error", error: object.error }
    : { _tag: "Result", result: object }

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/** The client's options with their defaults applied. */
interface Settings {
  readonly sttUrl: string
  readonly operationUrl: string
  readonly model: string
  readonly language: string
  readonly timeout: Duration.Duration
  readonly maxRetryAfter: Duration.Duration
  readonly defaultRetryAfter: Duration.Duration
  readonly resultNotFoundRetries: number
  readonly resultRetryDelay: Duration.Duration
}

/** Applies the defaults documented on `Options`. */
const resolveSettings = (options: Options): Settings => {
  const maxRetryAfter = Duration.decode(options.maxRetryAfter ?? Duration.minutes(10))
  return {
    sttUrl: trimSlash(options.sttUrl ?? defaultSttUrl),
    operationUrl: trimSlash(options.operationUrl ?? defaultOperationUrl),
    model: options.model ?? "general",
    language: options.language ?? "ru-RU",
    timeout: Duration.decode(options.timeout ?? Duration.seconds(30)),
    maxRetryAfter,
    defaultRetryAfter: Duration.min(Duration.decode(options.defaultRetryAfter ?? Duration.seconds(60)), maxRetryAfter),
    resultNotFoundRetries: Math.max(0, Math.floor(options.resultNotFoundRetries ?? 3)),
    resultRetryDelay: Duration.decode(options.resultRetryDelay ?? Duration.seconds(1))
  }
}

/** Adds the credentials, and the folder when one is configured, to a request. */
const authorize = (options: Options, request: HttpClientRequest.HttpClientRequest) => {
  // Redacted.value only here, at the moment the header is built; the tracer redacts `authorization`.
  const authorization = options.credentials._tag === "ApiKey"
    ? `Api-Key ${Redacted.value(options.credentials.apiKey)}`
    : `Bearer ${Redacted.value(options.credentials.iamToken)}`
  const withAuth = HttpClientRequest.setHeader(request, "authorization", authorization)
  return options.folderId ? HttpClientRequest.setHeader(withAuth, "x-folder-id", options.folderId) : withAuth
}

/** Sends one call and returns a 2xx body as text; anything else fails with its JobError. */
type Send = (call: string, request: HttpClientRequest.HttpClientRequest) => Effect.Effect<string, SpeechKitError>

/** The one way every method talks to SpeechKit: authorized, bounded by the timeout, failures mapped to JobError. */
const makeSend = (client: HttpClient.HttpClient, options: Options, settings: Settings): Send => (call, request) =>
  Effect.gen(function*() {
    const response = yield* client.execute(authorize(options, HttpClientRequest.acceptJson(request)))
    if (response.status >= 200 && response.status < 300) return yield* response.text
    return yield* Effect.fail(yield* failureOf(call, response, settings.defaultRetryAfter, settings.maxRetryAfter))
  }).pipe(
    Effect.catchTags({
      RequestError: (error) => Effect.fail(new JobError.Transient({ message: `SpeechKit ${call}: ${error.reason} error: ${error.message}` })),
      ResponseError: (error) => Effect.fail(new JobError.Transient({ message: `SpeechKit ${call}: reading the response failed: ${error.message}` }))
    }),
    Effect.timeoutFail({
      duration: settings.timeout,
      onTimeout: () => new JobError.Transient({ message: `SpeechKit ${call}: no complete response within ${Duration.format(settings.timeout)}` })
    })
  )

/** `SpeechKit.startRecognition`: POST recognizeFileAsync with the request's (or the configured) model and languages. */
const makeStartRecognition = (send: Send, settings: Settings) =>
  Effect.fn("SpeechKit.startRecognition")(function*(request: StartRecognition) {
    const languageCodes = request.languageCodes && request.languageCodes.length > 0 ? request.languageCodes : [settings.language]
    const body = {
      uri: request.uri,
      recognitionModel: {
        model: request.model ?? settings.model,
        audioFormat: { containerAudio: { containerAudioType: "OGG_OPUS" } },
        // Normalized text ("twenty one" → "21") arrives as finalRefinement; we prefer it.
        textNormalization: { textNormalization: "TEXT_NORMALIZATION_ENABLED" },
        languageRestriction: { restrictionType: "WHITELIST", languageCode: languageCodes },
        // A file is all there: let the model see the whole of it rather than stream-optimise.
        audioProcessingType: "FULL_DATA"
      }
    }
    const text = yield* send(
      "recognizeFileAsync",
      HttpClientRequest.post(`${settings.sttUrl}/stt/v3/recognizeFileAsync`).pipe(HttpClientRequest.bodyUnsafeJson(body))
    )
    const operation = yield* decodeJson("recognizeFileAsync", Operation, text)
    yield* Effect.annotateCurrentSpan("operationId", operation.id)
    if (operation.error) return yield* Effect.fail(operationFailed(operation.id, operation.error))
    return operation.id
  })

/** `SpeechKit.getOperation`: one poll of the Operation. */
const makeGetOperation = (send: Send, settings: Settings) =>
  Effect.fn("SpeechKit.getOperation")(function*(operationId: string) {
    yield* Effect.annotateCurrentSpan("operationId", operationId)
    const text = yield* send(
      "getOperation",
      HttpClientRequest.get(`${settings.operationUrl}/operations/${encodeURIComponent(operationId)}`)
    )
    const operation = yield* decodeJson("getOperation", Operation, text)
    // `error` may show before `done` (operation.md); this recognition cannot recover from it, so it ends now
    if (operation.error) {
      const { code, message } = operation.error
      if (code !== undefined && resubmittableGrpcCodes.has(code)) {
        return { done: true, retryable: { code, message: message ?? "no message" } } as const
      }
      return yield* Effect.fail(operationFailed(operationId, operation.error))
    }
    return operation.done === true ? { done: true } as const : { done: false } as const
  })

/** `SpeechKit.getRecognition`: reads the result stream, asking again while it is not readable yet. */
const makeGetRecognition = (send: Send, settings: Settings) =>
  Effect.fn("SpeechKit.getRecognition")(function*(operationId: string) {
    const { resultNotFoundRetries } = settings
    yield* Effect.annotateCurrentSpan("operationId", operationId)
    const read = send("getRecognition", HttpClientRequest.get(`${settings.sttUrl}/stt/v3/getRecognition`, { urlParams: { operationId } }))
    // only called once the operation is done: a 404 now means "not readable yet", which passes in seconds
    const text = yield* read.pipe(
      Effect.retry({
        while: (e) => e._tag === "Permanent" && / HTTP 404: /.test(e.message),
        schedule: Schedule.exponential(settings.resultRetryDelay),
        times: resultNotFoundRetries
      }),
      Effect.mapError((e) =>
        e._tag === "Permanent" && / HTTP 404: /.test(e.message)
          ? new JobError.Permanent({ message: `${e.message} (still not found after ${resultNotFoundRetries} retries)` })
          : e
      )
    )
    const objects = splitJsonObjects(text)
    if (Either.isLeft(objects)) {
      return yield* Effect.fail(new JobError.Permanent({ message: `SpeechKit getRecognition: malformed result stream: ${objects.left}` }))
    }
    const results: Array<StreamingResponse> = []
    for (const object of objects.right) {
      const line: StreamLine = yield* decodeValue("getRecognition", Schema.parseJson(), object).pipe(
        Effect.map(tagStreamLine),
        Effect.flatMap((tagged) => decodeValue("getRecognition", StreamLine, tagged))
      )
      if (line._tag === "Error") return yield* Effect.fail(streamFailure(line.error, settings.defaultRetryAfter))
      results.push(line.result)
    }
    return assembleRecognition(results)
  })

export const make = (options: Options): Effect.Effect<SpeechKit["Type"], never, HttpClient.HttpClient> =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const settings = resolveSettings(options)
    const send = makeSend(client, options, settings)
    return SpeechKit.of({
      startRecognition: makeStartRecognition(send, settings),
      getOperation: makeGetOperation(send, settings),
      getRecognition: makeGetRecognition(send, settings)
    })
  })

// ---------------------------------------------------------------------------------------------
// Results → segments
// ---------------------------------------------------------------------------------------------

/**
 * The rule: every `final` with a non-empty first alternative is one segment, timed by that alternative.
 * A `finalRefinement.normalizedText` replaces the text (never the timing) of the final it refers to:
 * same channel and `finalRefinement.finalIndex` equal to the final's `audioCursors.finalIndex` (the docs'
 * example pairs them so). Without indices, a final takes its ordinal on its channel and a refinement
 * refers to the latest final on its channel. Partials, EOU updates and status lines are ignored.
 * Segments come ordered by start time, then channel.
 */
const assembleRecognition = (results: ReadonlyArray<StreamingResponse>): Recognition => {
  const finals: Array<{ key: string; order: number; segment: Segment; language: string | undefined }> = []
  const refinements = new Map<string, string>()
  const ordinals = new Map<string, number>()
  const latestFinal = new Map<string, number>()
  for (const result of results) {
    if (result.final) {
      const channel = result.channelTag ?? result.final.channelTag ?? "0"
      const ordinal = ordinals.get(channel) ?? 0
      ordinals.set(channel, ordinal + 1)
      const index = result.audioCursors?.finalIndex ?? ordinal
      latestFinal.set(channel, index)
      const alternative = result.final.alternatives?.[0]
      const text = alternative?.text?.trim() ?? ""
      if (alternative && text !== "") {
        const words = alternative.words ?? []
        const startMs = alternative.startTimeMs ?? words[0]?.startTimeMs ?? 0
        const endMs = alternative.endTimeMs ?? words[words.length - 1]?.endTimeMs ?? startMs
        finals.push({
          key: `${channel}#${index}`,
          order: finals.length,
          segment: { startMs, endMs, channel, text },
          language: topLanguage(alternative.languages ?? [])
        })
      }
    }
    const normalized = result.finalRefinement?.normalizedText
    if (normalized) {
      const channel = result.channelTag ?? normalized.channelTag ?? "0"
      const index = result.finalRefinement?.finalIndex ?? latestFinal.get(channel)
      const text = normalized.alternatives?.[0]?.text?.trim()
      if (index !== undefined && text) refinements.set(`${channel}#${index}`, text)
    }
  }
  const segments = finals
    .map(({ key, order, segment }) => ({ order, segment: { ...segment, text: refinements.get(key) ?? segment.text } }))
    .sort((a, b) =>
      a.segment.startMs - b.segment.startMs ||
      a.segment.channel.localeCompare(b.segment.channel, "en", { numeric: true }) ||
      a.order - b.order
    )
    .map(({ segment }) => segment)
  return { segments, language: mostFrequent(finals.map((final) => final.language)) }
}

const topLanguage = (languages: ReadonlyArray<{ readonly languageCode?: string | undefined; readonly probability?: number | undefined }>) => {
  let best: { code: string; probability: number } | undefined
  for (const { languageCode, probability } of languages) {
    if (!languageCode) continue
    const p = probability ?? 0
    if (best === undefined || p > best.probability) best = { code: languageCode, probability: p }
  }
  return best?.code
}

const mostFrequent = (values: ReadonlyArray<string | undefined>): string | undefined => {
  const counts = new Map<string, number>()
  for (const value of values) if (value) counts.set(value, (counts.get(value) ?? 0) + 1)
  let best: string | undefined
  for (const [value, count] of counts) if (best === undefined || count > counts.get(best)!) best = value
  return best
}

/**
 * Splits concatenated top-level JSON objects: grpc-gateway writes one per line, the docs print them
 * pretty across lines; counting braces outside strings handles both. Left: what was wrong.
 */
export const splitJsonObjects = (text: string): Either.Either<Array<string>, string> => {
  const objects: Array<string> = []
  let depth = 0
  let start = -1
  let inString = false
  let escaped = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (inString) {
      if (escaped) escaped = false
      else if (c === "\\") escaped = true
      else if (c === "\"") inString = false
      continue
    }
    if (c === "\"") {
      if (depth === 0) return Either.left(`unexpected string at offset ${i}`)
      inString = true
    } else if (c === "{" || c === "[") {
      if (depth === 0) {
        if (c === "[") return Either.left(`unexpected array at offset ${i}`)
        start = i
      }
      depth++
    } else if (c === "}" || c === "]") {
      depth--
      if (depth < 0) return Either.left(`unbalanced '${c}' at offset ${i}`)
      if (depth === 0) objects.push(text.slice(start, i + 1))
    } else if (depth === 0 && !/\s/.test(c!)) {
      return Either.left(`unexpected '${c}' at offset ${i}`)
    }
  }
  if (depth !== 0 || inString) return Either.left("the stream ends inside an object")
  return Either.right(objects)
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

const decodeJson = <A, I>(call: string, schema: Schema.Schema<A, I>, text: string) =>
  decodeValue(call, Schema.parseJson(schema), text)

/** A 2xx body that is not the contract is Permanent (see the table above); one rule with the documents client. */
const decodeValue = <A, I>(call: string, schema: Schema.Schema<A, I>, value: unknown) =>
  Schema.decodeUnknown(schema)(value).pipe(
    Effect.mapError((error) =>
      new JobError.Permanent({
        message: `SpeechKit ${call}: unexpected response body: ${truncate(ParseResult.TreeFormatter.formatErrorSync(error), 500)}`
      })
    )
  )

const operationFailed = (operationId: string, status: typeof Status.Type) =>
  new JobError.Permanent({
    message: `SpeechKit operation ${operationId} failed (gRPC code ${status.code ?? "unknown"}): ${status.message ?? "no message"}`
  })

/** gRPC codes a retry can cure: UNKNOWN, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE. */
const transientGrpcCodes = new Set([2, 4, 10, 13, 14])

/** An operation that ended with these (DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE) is worth starting again. */
export const resubmittableGrpcCodes: ReadonlySet<number> = new Set([4, 13, 14])

const streamFailure = (status: typeof Status.Type, defaultRetryAfter: Duration.Duration): SpeechKitError => {
  const message = `SpeechKit getRecognition: stream error (gRPC code ${status.code ?? "unknown"}): ${status.message ?? "no message"}`
  if (status.code === 8) return new JobError.RateLimited({ message, retryAfter: defaultRetryAfter })
  if (status.code !== undefined && transientGrpcCodes.has(status.code)) return new JobError.Transient({ message })
  return new JobError.Permanent({ message })
}

/** Maps a non-2xx response to its JobError, with the server's google.rpc.Status message when it sent one. */
const failureOf = (
  call: string,
  response: HttpClientResponse.HttpClientResponse,
  defaultRetryAfter: Duration.Duration,
  maxRetryAfter: Duration.Duration
) =>
  Effect.gen(function*() {
    const body = yield* response.text.pipe(Effect.orElseSucceed(() => ""))
    const status = Schema.decodeUnknownOption(Schema.parseJson(Status))(body)
    const detail = Option.match(status, {
      onNone: () => truncate(body.trim(), 300) || "no message",
      onSome: ({ code, message }) => `${code === undefined ? "" : `(gRPC code ${code}) `}${message ?? "no message"}`
    })
    const message = `SpeechKit ${call}: HTTP ${response.status}: ${detail}`
    if (response.status === 429) {
      const now = yield* Clock.currentTimeMillis
      const retryAfter = RetryAfter.parse(response.headers["retry-after"], now)
      return new JobError.RateLimited({
        message,
        retryAfter: Duration.min(Option.getOrElse(retryAfter, () => defaultRetryAfter), maxRetryAfter)
      })
    }
    if (response.status >= 500 || response.status === 408 || response.status === 409) {
      return new JobError.Transient({ message })
    }
    return new JobError.Permanent({ message })
  })

const truncate = (text: string, max: number) => text.length > max ? `${text.slice(0, max)}…` : text
const trimSlash = (url: string) => url.replace(/\/+$/, "")

// ---------------------------------------------------------------------------------------------
// Layers
// ---------------------------------------------------------------------------------------------

const nonEmpty = <A>(option: Option.Option<A>, value: (a: A) => string) =>
  Option.filter(option, (a) => value(a).trim() !== "")

/** Every SPEECHKIT_* variable; exactly one of SPEECHKIT_API_KEY / SPEECHKIT_IAM_TOKEN must be set. */
export const config: Config.Config<Options> = Config.all({
  apiKey: Config.option(Config.redacted("SPEECHKIT_API_KEY")),
  iamToken: Config.option(Config.redacted("SPEECHKIT_IAM_TOKEN")),
  folderId: Config.option(Config.string("SPEECHKIT_FOLDER_ID")),
  sttUrl: Config.string("SPEECHKIT_STT_URL").pipe(Config.withDefault(defaultSttUrl)),
  operationUrl: Config.string("SPEECHKIT_OPERATION_URL").pipe(Config.withDefault(defaultOperationUrl)),
  model: Config.string("SPEECHKIT_MODEL").pipe(Config.withDefault("general")),
  language: Config.string("SPEECHKIT_LANGUAGE").pipe(Config.withDefault("ru-RU")),
  timeout: Millis.config("SPEECHKIT_TIMEOUT_MS", { min: 1, fallback: 30_000 }),
  maxRetryAfter: Millis.config("SPEECHKIT_MAX_RETRY_AFTER_MS", { min: 1, fallback: 600_000 }),
  resultNotFoundRetries: Config.integer("SPEECHKIT_RESULT_404_RETRIES").pipe(Config.withDefault(3))
}).pipe(Config.mapOrFail((raw) => {
  const apiKey = nonEmpty(raw.apiKey, Redacted.value)
  const iamToken = nonEmpty(raw.iamToken, Redacted.value)
  if (Option.isSome(apiKey) && Option.isSome(iamToken)) {
    return Either.left(ConfigError.InvalidData([], "set one of SPEECHKIT_API_KEY or SPEECHKIT_IAM_TOKEN, not both"))
  }
  const credentials: Option.Option<Credentials> = Option.isSome(apiKey)
    ? Option.some({ _tag: "ApiKey", apiKey: apiKey.value })
    : Option.map(iamToken, (token) => ({ _tag: "IamToken", iamToken: token }))
  if (Option.isNone(credentials)) {
    return Either.left(ConfigError.MissingData([], "set SPEECHKIT_API_KEY or SPEECHKIT_IAM_TOKEN"))
  }
  if (raw.resultNotFoundRetries < 0) {
    return Either.left(ConfigError.InvalidData(["SPEECHKIT_RESULT_404_RETRIES"], "must be 0 or more"))
  }
  return Either.right({
    credentials: credentials.value,
    folderId: Option.getOrUndefined(nonEmpty(raw.folderId, (s) => s)),
    sttUrl: raw.sttUrl,
    operationUrl: raw.operationUrl,
    model: raw.model,
    language: raw.language,
    timeout: raw.timeout,
    maxRetryAfter: raw.maxRetryAfter,
    resultNotFoundRetries: raw.resultNotFoundRetries
  })
}))

/** Production: options from the environment, HTTP over the global fetch. */
export const layer: Layer.Layer<SpeechKit, ConfigError.ConfigError> = Layer.effect(
  SpeechKit,
  Effect.flatMap(config, make)
).pipe(Layer.provide(FetchHttpClient.layer))

/** For tests and embedding: explicit options, HTTP over the global fetch. */
export const layerWith = (options: Options): Layer.Layer<SpeechKit> =>
  Layer.effect(SpeechKit, make(options)).pipe(Layer.provide(FetchHttpClient.layer))

// ---------------------------------------------------------------------------------------------
// In-memory double
// ---------------------------------------------------------------------------------------------

/** How a scripted operation goes: `pollsUntilDone` polls answer `done: false`, then it ends. */
export interface MemoryScript {
  readonly pollsUntilDone?: number | undefined
  readonly outcome?:
    | { readonly _tag: "Recognized"; readonly recognition: Recognition }
    | { readonly _tag: "Failed"; readonly code: number; readonly message: string }
    | undefined
}

/** The transcript the double returns when a script names none. */
export const memoryRecognition: Recognition = {
  segments: [{ startMs: 0, endMs: 1000, channel: "0", text: "In-memory SpeechKit transcript." }],
  language: "ru-RU"
}

/**
 * SpeechKit in memory, for unit tests of stages: operations follow `script(request)`; an unknown
 * operation id fails `Permanent` (as a 404 would) and so does reading a recognition before it is done.
 */
export const makeMemory = (script: (request: StartRecognition) => MemoryScript = () => ({})) =>
  Effect.gen(function*() {
    const operations = yield* Ref.make(new Map<string, { polls: number; script: MemoryScript }>())
    const counter = yield* Ref.make(0)

    const notFound = (operationId: string) =>
      new JobError.Permanent({ message: `SpeechKit (memory): HTTP 404: (gRPC code 5) operation ${operationId} not found` })

    const isDone = (entry: { polls: number; script: MemoryScript }) => entry.polls > (entry.script.pollsUntilDone ?? 1)

    const startRecognition = Effect.fn("SpeechKit.startRecognition")(function*(request: StartRecognition) {
      const n = yield* Ref.updateAndGet(counter, (n) => n + 1)
      const operationId = `memory-operation-${n}`
      yield* Ref.update(operations, (map) => new Map(map).set(operationId, { polls: 0, script: script(request) }))
      return operationId
    })

    const getOperation = Effect.fn("SpeechKit.getOperation")(function*(operationId: string) {
      const entry = yield* Ref.modify(operations, (map) => {
        const found = map.get(operationId)
        if (!found) return [undefined, map] as const
        const next = { ...found, polls: found.polls + 1 }
        return [next, new Map(map).set(operationId, next)] as const
      })
      if (!entry) return yield* Effect.fail(notFound(operationId))
      if (!isDone(entry)) return { done: false } as const
      const outcome = entry.script.outcome
      if (outcome?._tag === "Failed") {
        if (resubmittableGrpcCodes.has(outcome.code)) return { done: true, retryable: { code: outcome.code, message: outcome.message } } as const
        return yield* Effect.fail(operationFailed(operationId, outcome))
      }
      return { done: true } as const
    })

    const getRecognition = Effect.fn("SpeechKit.getRecognition")(function*(operationId: string) {
      const entry = (yield* Ref.get(operations)).get(operationId)
      if (!entry) return yield* Effect.fail(notFound(operationId))
      const outcome = entry.script.outcome
      if (!isDone(entry) || outcome?._tag === "Failed") {
        return yield* Effect.fail(new JobError.Permanent({ message: `SpeechKit (memory): operation ${operationId} has no results` }))
      }
      return outcome?.recognition ?? memoryRecognition
    })

    return SpeechKit.of({ startRecognition, getOperation, getRecognition })
  })

export const layerMemory = (script?: (request: StartRecognition) => MemoryScript): Layer.Layer<SpeechKit> =>
  Layer.effect(SpeechKit, makeMemory(script))
