/**
 * The document transcription service (the internal `POST /transcribe` service) as a Layer.
 *
 * The client speaks the service's HTTP contract: `POST {TRANSCRIBE_URL}` with `{ "url": <media url> }`,
 * answered by `{ segments: [...], language?, confidence?, metadata? }`. It fails only with the shared
 * JobError vocabulary, so the stage's retry policy acts on the tag:
 *
 * | outcome                                             | error                                      |
 * | --------------------------------------------------- | ------------------------------------------ |
 * | 429                                                 | `RateLimited` after `Retry-After` (seconds or HTTP-date) |
 * | 5xx, 408, 409, 425, network error, timeout, cut body | `Transient`                                |
 * | any other 4xx (400, 401, 403, 404, 422, …), 1xx/3xx | `Permanent` with the server's message      |
 * | 2xx whose body is not JSON or not the contract      | `Permanent` (see `decodeBody`)             |
 *
 * A speech-to-text adapter (`layerSpeechKit`, owned by the SpeechKit client) would plug in as one more `layer*` here.
 */
import * as HttpClient from "@effect/platform/HttpClient"
import type * as HttpClientError from "@effect/platform/HttpClientError"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import type * as HttpClientResponse from "@effect/platform/HttpClientResponse"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { Clock, Config, type ConfigError, Context, Duration, Effect, Layer, Option, ParseResult, Predicate, Redacted, Ref, Schema } from "effect"
import { Permanent, RateLimited, Transient } from "pgfiber/internal/JobError.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as RetryAfter from "pgfiber/internal/layers/RetryAfter.js"

/** Any JSON value: segments are stored as real JSON (jsonb), never as a string holding JSON. */
export type Json = null | boolean | number | string | ReadonlyArray<Json> | { readonly [key: string]: Json }

export const Json: Schema.Schema<Json> = Schema.Union(
  Schema.Null,
  Schema.Boolean,
  Schema.Number,
  Schema.String,
  Schema.Array(Schema.suspend((): Schema.Schema<Json> => Json)),
  Schema.Record({ key: Schema.String, value: Schema.suspend((): Schema.Schema<Json> => Json) })
)

/** `url` is the media to transcribe (the document's `canonical_url` or `metadata.media_url`). */
export interface TranscribeRequest {
  readonly url: string
}

/** The service's answer. `null` optional fields (Python's `None`) decode as absent. */
export const TranscriptionResult = Schema.Struct({
  segments: Schema.Array(Json),
  language: Schema.optionalWith(Schema.String, { nullable: true }),
  confidence: Schema.optionalWith(Schema.Number, { nullable: true }),
  metadata: Schema.optionalWith(Schema.Record({ key: Schema.String, value: Json }), { nullable: true })
})
export type TranscriptionResult = typeof TranscriptionResult.Type

export type TranscriptionError = Transient | RateLimited | Permanent

export class Transcription extends Context.Tag("pgfiber/Transcription")<Transcription, {
  readonly transcribe: (request: TranscribeRequest) => Effect.Effect<TranscriptionResult, TranscriptionError>
}>() {}

export interface Options {
  /** The service's endpoint, posted to as is. */
  readonly url: URL
  /** Bound on the whole call, body included. Default 600 seconds (the service's own limit). */
  readonly timeout?: Duration.DurationInput | undefined
  /** Sent as `Authorization: Bearer …`; never logged. */
  readonly token?: Redacted.Redacted | undefined
  /** Delay for a 429 without a usable `Retry-After`. Default 30 seconds. */
  readonly defaultRetryAfter?: Duration.DurationInput | undefined
}

export const defaultTimeout = Duration.seconds(600)
export const defaultRetryAfter = Duration.seconds(30)

/** Longest server message kept in an error: enough to diagnose, short enough for `last_error`. */
const maxMessageLength = 500

export const make = (options: Options): Effect.Effect<Transcription["Type"], never, HttpClient.HttpClient> =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const timeout = Duration.decode(options.timeout ?? defaultTimeout)
    const fallbackRetryAfter = Duration.decode(options.defaultRetryAfter ?? defaultRetryAfter)
    // Origin and path only: userinfo or a query string in the configured URL may hold credentials.
    const endpoint = `${options.url.origin}${options.url.pathname}`
    const baseRequest = HttpClientRequest.post(options.url).pipe(
      HttpClientRequest.acceptJson,
      options.token === undefined ? (request) => request : HttpClientRequest.bearerToken(options.token)
    )

    const transcribe = Effect.fn("Transcription.transcribe")(function*(request: TranscribeRequest) {
      const response = yield* client.execute(HttpClientRequest.bodyUnsafeJson(baseRequest, { url: request.url })).pipe(
        Effect.flatMap((response) =>
          Effect.map(response.text, (text) => ({ status: response.status, headers: response.headers, text }))
        ),
        Effect.catchAll((error) => Effect.fail(fromHttpClientError(error, endpoint))),
        Effect.timeoutFail({
          duration: timeout,
          onTimeout: () =>
            new Transient({
              message: `Transcription service ${endpoint} did not answer within ${Duration.format(timeout)}`
            })
        })
      )
      yield* Effect.annotateCurrentSpan("http.response.status_code", response.status)
      if (response.status >= 200 && response.status < 300) {
        return yield* decodeBody(response.text, endpoint)
      }
      return yield* fromStatus(response, endpoint, fallbackRetryAfter)
    })

    return Transcription.of({ transcribe })
  })

/** The connection, not the request, is at fault, except for a request we could not build. */
const fromHttpClientError = (error: HttpClientError.HttpClientError, endpoint: string): TranscriptionError => {
  const cause = Predicate.hasProperty(error.cause, "message") ? String(error.cause.message) : error.reason
  if (error._tag === "ResponseError") {
    return new Transient({ message: `Transcription service ${endpoint} answer cut short: ${cause}` })
  }
  return error.reason === "Transport"
    ? new Transient({ message: `Transcription service ${endpoint} unreachable: ${cause}` })
    : new Permanent({ message: `Transcription request to ${endpoint} could not be built (${error.reason}): ${cause}` })
}

/**
 * A 2xx body that is not JSON, or whose `segments` is not an array, is Permanent: the service finished
 * and answered outside its contract, so a retry would repeat a long paid transcription for the same answer;
 * the dead letter carries the reason for a human. A body cut short on the wire fails earlier, as Transient.
 */
const decodeBody = (text: string, endpoint: string): Effect.Effect<TranscriptionResult, Permanent> =>
  Effect.try({
    try: (): unknown => JSON.parse(text),
    catch: () =>
      new Permanent({ message: `Transcription service ${endpoint} answered with a body that is not JSON: ${truncate(text)}` })
  }).pipe(
    Effect.flatMap(Schema.decodeUnknown(TranscriptionResult)),
    Effect.catchTag("ParseError", (error) =>
      Effect.fail(
        new Permanent({
          message: `Transcription service ${endpoint} answered outside its contract: ${
            truncate(ParseResult.TreeFormatter.formatErrorSync(error))
          }`
        })
      ))
  )

const fromStatus = (
  response: { readonly status: number; readonly headers: HttpClientResponse.HttpClientResponse["headers"]; readonly text: string },
  endpoint: string,
  fallbackRetryAfter: Duration.Duration
): Effect.Effect<never, TranscriptionError> =>
  Effect.gen(function*() {
    const message = `Transcription service ${endpoint} answered ${response.status}: ${serverMessage(response.text)}`
    if (response.status === 429) {
      const now = yield* Clock.currentTimeMillis
      const retryAfter = RetryAfter.parse(response.headers["retry-after"], now).pipe(
        Option.getOrElse(() => fallbackRetryAfter)
      )
      return yield* new RateLimited({ message, retryAfter })
    }
    // 408 and 425 ask for a resend; 409 is the service busy with the same media.
    if (response.status >= 500 || response.status === 408 || response.status === 409 || response.status === 425) {
      return yield* new Transient({ message })
    }
    return yield* new Permanent({ message })
  })

/** The server's own words: `error` / `message` / `detail` from a JSON body (FastAPI uses `detail`), else the text. */
const serverMessage = (text: string): string => {
  const json = Option.getOrUndefined(Option.liftThrowable(JSON.parse)(text)) as unknown
  const field = Predicate.isRecord(json) ? (json.error ?? json.message ?? json.detail) : undefined
  const message = field === undefined ? text : Predicate.isString(field) ? field : JSON.stringify(field)
  return message.trim() === "" ? "(empty body)" : truncate(message)
}

const truncate = (text: string): string => {
  const oneLine = text.replace(/\s+/g, " ").trim()
  return oneLine.length <= maxMessageLength ? oneLine : `${oneLine.slice(0, maxMessageLength)}… (${oneLine.length} chars)`
}

/** One `Config.all`; keys are the env names themselves, so plain and constant-case providers both read them. */
export const config = Config.all({
  url: Config.url("TRANSCRIBE_URL").pipe(
    Config.validate({
      message: "Expected an http:// or https:// URL",
      validation: (url) => url.protocol === "http:" || url.protocol === "https:"
    })
  ),
  timeout: Millis.config("TRANSCRIBE_TIMEOUT_MS", { min: 1, fallback: defaultTimeout }),
  // An empty TRANSCRIBE_TOKEN means no token, not `Bearer ` with nothing after it.
  token: Config.option(Config.redacted("TRANSCRIBE_TOKEN")).pipe(
    Config.map(Option.filter((token) => Redacted.value(token) !== ""))
  )
})

/**
 * Production: reads `config` when built. Brings its own node:http client, not undici/fetch: undici's
 * default 300 s headers timeout would cut a 600 s transcription short, as a Transient that never succeeds.
 */
export const layer: Layer.Layer<Transcription, ConfigError.ConfigError> = Layer.effect(
  Transcription,
  Effect.flatMap(config, ({ timeout, token, url }) => make({ url, timeout, token: Option.getOrUndefined(token) }))
).pipe(Layer.provide(NodeHttpClient.layer))

/** One scripted answer of the test double: a result, or the error the real client would fail with. */
export type Scripted = TranscriptionResult | TranscriptionError

export type Script =
  | readonly [Scripted, ...ReadonlyArray<Scripted>]
  | ((request: TranscribeRequest, call: number) => Effect.Effect<TranscriptionResult, TranscriptionError>)

/**
 * Test double. An array answers call n with `script[n]` and repeats its last entry after that; a function
 * gets each request and its 0-based call number. Results go through the real decoder, so the twin cannot
 * return what the client never would.
 */
export const makeMemory = (script: Script): Effect.Effect<Transcription["Type"]> =>
  Effect.map(Ref.make(0), (calls) => {
    const answer = (request: TranscribeRequest, call: number) =>
      typeof script === "function" ? script(request, call) : Effect.suspend(() => {
        const step = script[Math.min(call, script.length - 1)]
        return Predicate.hasProperty(step, "_tag") ? Effect.fail(step as TranscriptionError) : Effect.succeed(step)
      })
    return Transcription.of({
      transcribe: Effect.fn("Transcription.transcribe")(function*(request) {
        const call = yield* Ref.getAndUpdate(calls, (n) => n + 1)
        const result = yield* answer(request, call)
        return yield* Effect.orDie(Schema.decodeUnknown(TranscriptionResult)(result))
      })
    })
  })

export const layerMemory = (script: Script): Layer.Layer<Transcription> =>
  Layer.effect(Transcription, makeMemory(script))
