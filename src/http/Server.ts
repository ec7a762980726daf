/**
 * The HTTP server as a Layer over a given stage list: the API (Api.ts) with its handlers, `/openapi.json` and
 * `/docs`, a body-size limit, and an access log through the application's logger. Bad input never reaches a
 * handler as a crash: malformed JSON is 400, a body over the limit 413, both with a JSON reason.
 *
 * Needs Db, Queue, Storage (for calls), ApiKeys and the stages (Submit.KnownStages); WorkerInfo and Waker are
 * optional and, when present (the `start` command), feed `/readyz`.
 */
import {
  HttpApiBuilder,
  HttpApiSwagger,
  HttpIncomingMessage,
  HttpServer,
  HttpServerError,
  HttpServerRequest,
  HttpServerResponse,
  Multipart
} from "@effect/platform"
import type { HttpApp } from "@effect/platform"
import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { Cause, Config, Effect, Exit, Layer, LogLevel, Option } from "effect"
import type * as NodeHttp from "node:http"
import { createServer } from "node:http"
import type * as Stage from "../runtime/Stage.js"
import { Api } from "./Api.js"
import * as Auth from "./Auth.js"
import * as Calls from "./Calls.js"
import * as Health from "./Health.js"
import * as Jobs from "./Jobs.js"
import * as Schedules from "./Schedules.js"

export interface ServerOptions {
  readonly host: string
  readonly port: number
  /** Larger request bodies are refused with 413 (before they are read when they declare their length). */
  readonly maxBodyBytes: number
  /** The same for `multipart/form-data` uploads (recordings to `POST /calls`), which stream to disk. */
  readonly maxUploadBytes: number
  readonly devTick: boolean
  /** Names the dev tick's claims (`locked_by`) when no worker runs in this process. */
  readonly workerId: string
  /** The stages the dev tick may run here; default: every known stage. */
  readonly tickStages?: ReadonlyArray<Stage.Stage<any, any, any>> | undefined
}

export const config = Config.all({
  host: Config.string("HTTP_HOST").pipe(Config.withDefault("0.0.0.0")),
  port: Config.port("HTTP_PORT").pipe(Config.withDefault(8080)),
  // validate before the default: a validation after `withDefault` loses the variable's name in the error
  maxBodyBytes: Config.integer("HTTP_MAX_BODY_BYTES").pipe(
    Config.validate({ message: "must be a whole number of bytes from 1024 to 1073741824", validation: (n) => n >= 1024 && n <= 1 << 30 }),
    Config.withDefault(1024 * 1024)
  ),
  maxUploadBytes: Config.integer("HTTP_MAX_UPLOAD_BYTES").pipe(
    Config.validate({ message: "must be a whole number of bytes from 1024 to 17179869184", validation: (n) => n >= 1024 && n <= 16 * 2 ** 30 }),
    Config.withDefault(256 * 1024 * 1024)
  ),
  devTick: Jobs.devTickConfig
})

/** Probes and scrapes are frequent and dull: they are logged at debug, everything else at info. */
const quietPaths = new Set(["/healthz", "/readyz", "/metrics"])

const jsonError = (status: number, tag: string, message: string) =>
  HttpServerResponse.unsafeJson({ _tag: tag, message }, { status })

/** The body could not be read: too large (413) or not the JSON it claims to be (400). */
const bodyFailure = (cause: Cause.Cause<unknown>): Option.Option<HttpServerResponse.HttpServerResponse> => {
  const error = Cause.squash(cause) as { _tag?: string; reason?: string; cause?: unknown }
  if (error?._tag === "MultipartError") {
    return Option.some(
      ["FileTooLarge", "FieldTooLarge", "BodyTooLarge"].includes(error.reason ?? "")
        ? jsonError(413, "PayloadTooLarge", "upload is over the size limit")
        : jsonError(400, "BadRequest", `malformed multipart body (${error.reason})`)
    )
  }
  if (error?._tag !== "RequestError" || error.reason !== "Decode") return Option.none()
  const detail = error.cause instanceof Error ? error.cause.message : String(error.cause ?? "unreadable body")
  return Option.some(
    detail.includes("maxBytes exceeded")
      ? jsonError(413, "PayloadTooLarge", "request body is over the size limit")
      : jsonError(400, "BadRequest", `malformed request body: ${detail}`)
  )
}

/**
 * Reads a body sent without Content-Length (chunked) up to `max` bytes. Past the limit the rest is drained
 * (up to a bound) rather than the socket cut, so the client reads a 413 instead of a connection reset.
 */
const readChunkedBody = (source: NodeHttp.IncomingMessage, max: number) =>
  Effect.async<Buffer | "too-large", Error>((resume) => {
    const chunks: Array<Buffer> = []
    let size = 0
    source.on("data", (chunk: Buffer) => {
      size += chunk.length
      if (size <= max) chunks.push(chunk)
      else if (size > max * 16) {
        source.destroy()
        resume(Effect.succeed("too-large"))
      }
    })
    source.once("end", () => resume(Effect.succeed(size > max ? "too-large" : Buffer.concat(chunks))))
    source.once("error", (e) => resume(Effect.fail(e)))
  })

const hasBody = (method: string) => method !== "GET" && method !== "HEAD" && method !== "OPTIONS"

export const bodyLimit = (limits: { readonly maxBodyBytes: number; readonly maxUploadBytes: number }) =>
<E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const upload = (request.headers["content-type"] ?? "").toLowerCase().startsWith("multipart/form-data")
    const limit = upload ? limits.maxUploadBytes : limits.maxBodyBytes
    const tooLarge = (size: string) => jsonError(413, "PayloadTooLarge", `request body${size} is over the limit of ${limit} bytes`)
    const declared = Number(request.headers["content-length"] ?? NaN)
    // a declared length over the limit is refused before a byte is read
    if (Number.isFinite(declared) && declared > limit) return tooLarge(` of ${declared} bytes`)
    let served = request
    // uploads stream to disk under the multipart limits; other chunked bodies are read here, up to the limit
    if (!upload && !Number.isFinite(declared) && hasBody(request.method) && request.headers["transfer-encoding"] !== undefined) {
      const body = yield* readChunkedBody(NodeHttpServerRequest.toIncomingMessage(request), limit).pipe(Effect.orDie)
      if (body === "too-large") return tooLarge("")
      const { "transfer-encoding": _chunked, ...headers } = request.headers
      served = HttpServerRequest.fromWeb(
        new Request(`http://localhost${request.url}`, { method: request.method, headers: { ...headers }, body })
      )
    }
    return yield* app.pipe(
      Effect.provideService(HttpServerRequest.HttpServerRequest, served),
      HttpIncomingMessage.withMaxBodySize(Option.some(limit)),
      Multipart.withLimits({ maxFileSize: Option.some(limit), maxTotalSize: Option.some(limit), maxParts: Option.some(16) }),
      Effect.catchAllCause((cause) => Option.match(bodyFailure(cause), { onNone: () => Effect.failCause(cause), onSome: Effect.succeed }))
    )
  })

/** One line per request through the application's logger (JSON by default): method, path, status, duration. */
export const accessLog = <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const started = Date.now()
    const exit = yield* Effect.exit(app)
    const status = Exit.isSuccess(exit)
      ? exit.value.status
      : Cause.isInterruptedOnly(exit.cause)
      ? 499
      : (yield* HttpServerError.causeResponse(exit.cause))[0].status
    const path = request.url.split("?")[0] ?? request.url
    yield* Effect.logWithLevel(quietPaths.has(path) ? LogLevel.Debug : status >= 500 ? LogLevel.Error : LogLevel.Info, "http request").pipe(
      Effect.annotateLogs({ "http.method": request.method, "http.path": path, "http.status": status, "http.duration_ms": Date.now() - started })
    )
    return yield* exit
  })

/** The API's handlers and docs, without a listening socket (tests may serve it however they like). */
export const layerApi = <R = never>(
  options: Pick<ServerOptions, "devTick" | "workerId" | "tickStages" | "maxBodyBytes" | "maxUploadBytes">
) =>
  Layer.mergeAll(
    // API-level, so it runs inside the router's error handling and its 400/413 is the response sent
    HttpApiBuilder.middleware(bodyLimit(options)),
    HttpApiSwagger.layer({ path: "/docs" }),
    HttpApiBuilder.middlewareOpenApi({ path: "/openapi.json" })
  ).pipe(
    Layer.provideMerge(HttpApiBuilder.api(Api)),
    Layer.provide(Health.layer),
    Layer.provide(Jobs.layer<R>(options)),
    Layer.provide(Schedules.layer),
    Layer.provide(Calls.layer),
    Layer.provide(Auth.layer)
  )

/** Serves the API on `host:port` for the life of the layer; `HttpServer.HttpServer` tells the bound address. */
export const layer = <R = never>(options: ServerOptions) =>
  HttpApiBuilder.serve(accessLog).pipe(
    Layer.provide(layerApi<R>(options)),
    HttpServer.withLogAddress,
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: options.port, host: options.host }))
  )
