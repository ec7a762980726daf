/**
 * The HTTP server as a Layer over a given stage list: the API (Api.ts) with its handlers on the API listener
 * (`HTTP_HOST:HTTP_PORT`), and the operational endpoints (`/readyz`, `/metrics`, `/docs`, `/openapi.json`) on a
 * separate admin listener (`ADMIN_HOST:ADMIN_PORT`, loopback by default); `/healthz` answers on both. Bad input
 * never reaches a handler as a crash, and every error is JSON `{ "_tag", "message" }`: a request to a keyed route
 * is authenticated before its body is read (Auth.guard); a NUL anywhere in the path or query is 400 before any
 * route sees it; a body over the limit is 413, one labelled with a charset other than UTF-8 is 415; bytes that
 * are not UTF-8 (StrictInput.ts), malformed JSON, text PostgreSQL cannot store (NUL, lone surrogates) or nesting
 * past 64 levels is 400; a real fault is a logged 500.
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
import { Cause, Config, Context, Effect, Exit, Layer, LogLevel, Option } from "effect"
import type * as NodeHttp from "node:http"
import { createServer } from "node:http"
import * as AuthLimiter from "../auth/AuthLimiter.js"
import * as Dashboard from "../dashboard/Dashboard.js"
import type * as Stage from "pgfiber/internal/runtime/Stage.js"
import type * as Worker from "pgfiber/internal/runtime/Worker.js"
import { Api } from "./Api.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Auth from "./Auth.js"
import * as Calls from "./Calls.js"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import * as EventFeed from "pgfiber/internal/runtime/EventFeed.js"
import * as EventsHttp from "./Events.js"
import * as WebhooksHttp from "./Webhooks.js"
import * as Health from "./Health.js"
import * as LimitsHttp from "./Limits.js"
import * as Stages from "./Stages.js"
import * as Jobs from "./Jobs.js"
import * as Schedules from "./Schedules.js"
import * as StrictInput from "./StrictInput.js"

export interface ServerOptions {
  readonly host: string
  readonly port: number
  /** The admin listener for `/readyz`, `/metrics`, `/docs`, `/openapi.json`; default 127.0.0.1:9090. */
  readonly admin?: { readonly host: string; readonly port: number } | undefined
  /**
   * The failed-authentication limit shared by the API and the dashboard's sign-in (AuthLimiter.ts): by default
   * 20 failures a minute per client and key prefix, 100 per client, and no trusted proxy.
   */
  readonly authFailures?: Partial<AuthLimiter.AuthLimiterOptions> | undefined
  /** Larger request bodies are refused with 413 (before they are read when they declare their length). */
  readonly maxBodyBytes: number
  /** The same for `multipart/form-data` uploads (recordings to `POST /calls`), which stream to disk. */
  readonly maxUploadBytes: number
  readonly devTick: boolean
  /** Names the dev tick's claims (`locked_by`) when no worker runs in this process. */
  readonly workerId: string
  /** The stages the dev tick may run here; default: every known stage. */
  readonly tickStages?: ReadonlyArray<Stage.Stage<any, any, any>> | undefined
  /** This process's configuration over the stages' concurrency and limits (`Worker.config`), for the dev tick's claims. */
  readonly tickConfig?: Pick<Worker.WorkerOptions, "concurrency" | "limits"> | undefined
  /**
   * The web dashboard on the API listener: default, one at `/dashboard` configured by `DASHBOARD_*`; given
   * options, one made with them; false, none made here (a `Dashboard` provided to this layer is still served).
   */
  readonly dashboard?: false | Dashboard.DashboardOptions | undefined
}

export const config = Config.all({
  host: Config.string("HTTP_HOST").pipe(Config.withDefault("0.0.0.0")),
  port: Config.port("HTTP_PORT").pipe(Config.withDefault(8080)),
  admin: Config.all({
    host: Config.string("ADMIN_HOST").pipe(Config.withDefault("127.0.0.1")),
    // 0 picks a free port (logged at start)
    port: Config.integer("ADMIN_PORT").pipe(
      Config.validate({ message: "must be a port number from 0 to 65535", validation: (n) => n >= 0 && n <= 65535 }),
      Config.withDefault(9090)
    )
  }),
  authFailures: AuthLimiter.config,
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

/** Served without a key on every listener: load balancers' liveness check. */
export const livenessPath = "/healthz"
/** Served on the admin listener only (and without a key there): operational, some of them across orgs. */
export const adminPaths: ReadonlySet<string> = new Set(["/readyz", "/metrics", "/docs", "/openapi.json", "/stages", "/limits"])
/**
 * Pausing and resuming a stage: operators only (a stage is shared by every org): the admin listener without a
 * key, and the API listener to an admin key.
 */
const stageControlPath = /^\/stages\/[^/]+\/(pause|resume|purge)$/
/** Shared limits are the operator's: `/limits` and `/limits/<stage>` answer on the admin listener only. */
export const isAdminPath = (path: string): boolean =>
  adminPaths.has(path) || stageControlPath.test(path) || path.startsWith("/limits/")
const openPaths = { has: (path: string) => path === livenessPath || isAdminPath(path) }

/**
 * A request's path as the router will match it (percent-decoded, repeated and trailing slashes folded, case
 * ignored), so `//metrics`, `/%6Detrics` or `/ReadyZ` cannot reach an admin route through the API listener.
 */
export const routePath = (url: string): string => {
  const raw = url.split("?")[0] ?? url
  let decoded = raw
  try {
    decoded = decodeURIComponent(raw)
  } catch {
    // malformed escapes: the router will not match them either
  }
  const folded = decoded.replace(/\/+/g, "/").toLowerCase()
  return folded.length > 1 && folded.endsWith("/") ? folded.slice(0, -1) : folded
}

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
 * Reads a body up to `max` bytes. Past the limit the rest is read and dropped rather than the socket cut, so
 * the client (already authenticated) reads a 413 instead of a connection reset; memory stays at `max`.
 */
const readBody = (source: NodeHttp.IncomingMessage, max: number) =>
  Effect.async<Buffer | "too-large", Error>((resume) => {
    const chunks: Array<Buffer> = []
    let size = 0
    source.on("data", (chunk: Buffer) => {
      size += chunk.length
      if (size <= max) chunks.push(chunk)
      else chunks.length = 0
    })
    source.once("end", () => resume(Effect.succeed(size > max ? "too-large" : Buffer.concat(chunks))))
    source.once("error", (e) => resume(Effect.fail(e)))
  })

/** A JSON body's problem, if any: not UTF-8, not JSON at all, or JSON the queue would refuse (NUL, surrogates, depth). */
const jsonBodyProblem = (body: Buffer): string | undefined => {
  if (body.length === 0) return undefined
  const notUtf8 = StrictInput.utf8Problem(body)
  if (notUtf8 !== undefined) return notUtf8
  let value: unknown
  try {
    value = JSON.parse(body.toString("utf8"))
  } catch (e) {
    return `malformed request body: ${e instanceof Error ? e.message : String(e)}`
  }
  return Queue.jsonProblem(value, "the request body")
}

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
    // uploads stream to disk under the multipart limits; other bodies are read and checked here, up to the limit
    if (!upload && hasBody(request.method)) {
      const badCharset = StrictInput.charsetProblem(request.headers["content-type"])
      if (badCharset !== undefined) return jsonError(415, "UnsupportedMediaType", badCharset)
      const body = yield* readBody(NodeHttpServerRequest.toIncomingMessage(request), limit).pipe(
        Effect.catchAll(() => Effect.succeed("unreadable" as const))
      )
      if (body === "too-large") return tooLarge("")
      if (body === "unreadable") return jsonError(400, "BadRequest", "the request body could not be read")
      const problem = jsonBodyProblem(body)
      if (problem !== undefined) return jsonError(400, "BadRequest", problem)
      const { "transfer-encoding": _chunked, "content-length": _length, ...headers } = request.headers
      served = HttpServerRequest.fromWeb(
        new Request(`http://localhost${request.url}`, {
          method: request.method,
          headers: { ...headers },
          ...(body.length > 0 ? { body } : {})
        })
      )
    }
    return yield* app.pipe(
      Effect.provideService(HttpServerRequest.HttpServerRequest, served),
      HttpIncomingMessage.withMaxBodySize(Option.some(limit)),
      Multipart.withLimits({ maxFileSize: Option.some(limit), maxTotalSize: Option.some(limit), maxParts: Option.some(16) }),
      Effect.catchAllCause((cause) => Option.match(bodyFailure(cause), { onNone: () => Effect.failCause(cause), onSome: Effect.succeed }))
    )
  })

/**
 * Every error leaves as JSON `{ "_tag", "message" }`. What the API did not answer itself is either the
 * router's (no such route: 404) or a real fault: a 500 whose cause is logged, and whose body says nothing more.
 */
export const jsonErrors = <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<never, R> =>
  app.pipe(
    // an error answered with no body (the router's own 404 for a method it does not route) gets one
    Effect.map((response) =>
      response.status >= 400 && response.body._tag === "Empty"
        ? jsonError(response.status, response.status === 404 ? "NotFound" : "BadRequest", response.status === 404 ? "no such route" : "the request was refused")
        : response
    ),
    Effect.catchAllCause((cause) =>
    Effect.gen(function*() {
      if (Cause.isInterruptedOnly(cause)) return yield* Effect.failCause(cause as Cause.Cause<never>)
      const [response] = yield* HttpServerError.causeResponse(cause)
      if (response.status === 404) return jsonError(404, "NotFound", "no such route")
      if (response.status < 500) {
        const tag = (Cause.squash(cause) as { _tag?: unknown })?._tag
        return jsonError(response.status, typeof tag === "string" ? tag : "BadRequest", "the request was refused")
      }
      yield* Effect.logError("request failed: internal server error", cause)
      return jsonError(500, "InternalServerError", "internal server error; the cause is in the server's log")
    }))
  )

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

/** A NUL anywhere in the path or query, or query text PostgreSQL could not store: 400 before any route sees it. */
const strictUrl = <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const problem = StrictInput.urlProblem(request.url)
    return problem === undefined ? app : Effect.succeed(jsonError(400, "BadRequest", problem))
  })

/**
 * What one listener serves: the API listener everything but the admin paths, the admin listener only those. On
 * the API listener, pausing and resuming a stage is served to an operator's (admin) key through `adminGate`.
 */
const listenerFilter = (
  listener: "api" | "admin",
  adminGate?: <E, R>(app: HttpApp.Default<E, R>) => HttpApp.Default<E, R>
) => <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const path = routePath(request.url)
    if (listener === "api" && adminGate !== undefined && stageControlPath.test(path)) return adminGate(app)
    const served = path === livenessPath || (listener === "admin") === isAdminPath(path)
    return served ? app : Effect.succeed(jsonError(404, "NotFound", "no such route"))
  })

/** The API's handlers and docs, without a listening socket (tests may serve it however they like). */
export const layerApi = <R = never>(
  options: Pick<ServerOptions, "devTick" | "workerId" | "tickStages" | "tickConfig" | "maxBodyBytes" | "maxUploadBytes">
) =>
  Layer.mergeAll(
    // API-level, so it runs inside the router's error handling and its 401/413/400 is the response sent;
    // authentication first, so nothing of an unauthenticated request's body is read
    HttpApiBuilder.middleware(
      Effect.map(
        Auth.guard(openPaths, routePath),
        (guard) => (app: HttpApp.Default) => guard(bodyLimit(options)(app))
      )
    ),
    HttpApiSwagger.layer({ path: "/docs" }),
    HttpApiBuilder.middlewareOpenApi({ path: "/openapi.json" })
  ).pipe(
    Layer.provideMerge(HttpApiBuilder.api(Api)),
    Layer.provide(Health.layer),
    Layer.provide(Stages.layer),
    Layer.provide(LimitsHttp.layer),
    Layer.provide(Jobs.layer<R>(options)),
    Layer.provide(Schedules.layer),
    Layer.provide(Calls.layer),
    Layer.provide(EventsHttp.layer.pipe(Layer.provide(EventFeed.layer), Layer.provide(EventLog.layer))),
    Layer.provide(WebhooksHttp.layer),
    Layer.provide(Auth.layer)
  )

/** The admin listener's server, to tell its bound address (`HttpServer.HttpServer` is the API listener's). */
export class AdminServer extends Context.Tag("pgfiber/http/AdminServer")<AdminServer, HttpServer.HttpServer>() {}

/**
 * Serves the API on `host:port` and the operational endpoints on `admin.host:admin.port` for the life of the
 * layer; `HttpServer.HttpServer` and `AdminServer` tell the bound addresses.
 */
export const layer = <R = never>(options: ServerOptions) => {
  const api = layerApi<R>(options)
  const admin = options.admin ?? { host: "127.0.0.1", port: 9090 }
  // what HttpApiBuilder.serve does, with the JSON error bodies inside the app: a serve middleware only sees
  // the exit after the platform has already answered a failure (with an empty body)
  const serveOn = (listener: "api" | "admin") =>
    Layer.unwrapEffect(
      Effect.gen(function*() {
        const app = yield* HttpApiBuilder.httpApp
        // the dashboard (its own sign-in, HTML errors) answers its paths before the API's key guard sees them
        const dashboard = listener === "api" ? yield* Effect.serviceOption(Dashboard.Dashboard) : Option.none()
        const served = Option.isSome(dashboard) ? Dashboard.mount(dashboard.value)(app) : app
        const adminGate = listener === "api" ? yield* Auth.adminKeyGate : undefined
        return HttpServer.serve(jsonErrors(strictUrl(listenerFilter(listener, adminGate)(served))), accessLog)
      })
    ).pipe(
      Layer.provide([HttpApiBuilder.Router.Live, HttpApiBuilder.Middleware.layer]),
      Layer.provide(api)
    )
  const adminListener = Layer.mergeAll(
    serveOn("admin"),
    Layer.effect(AdminServer, HttpServer.HttpServer),
    Layer.effectDiscard(Effect.flatMap(HttpServer.HttpServer, (server) =>
      Effect.logInfo(`admin listener (readyz, metrics, docs) on ${HttpServer.formatAddress(server.address)}`)))
  ).pipe(Layer.provide(NodeHttpServer.layer(createServer, { port: admin.port, host: admin.host })))
  const dashboard = options.dashboard === false
    ? Layer.empty
    : options.dashboard === undefined
    ? Dashboard.layerFromConfig
    : Dashboard.layer(options.dashboard)
  return Layer.merge(
    serveOn("api").pipe(
      Layer.provide(dashboard),
      HttpServer.withLogAddress,
      Layer.provideMerge(NodeHttpServer.layer(createServer, { port: options.port, host: options.host }))
    ),
    adminListener
  ).pipe(
    // one limiter for the API's keys and the dashboard's sign-in: one budget per client
    Layer.provide(AuthLimiter.layer(options.authFailures)),
    // what the API and the dashboard read: on DATABASE_READ_URL when it is set (one pool, shared)
    Layer.provide(Reads.layer)
  )
}
