/**
 * A FAKE of the document transcription service, for tests only: a real HTTP server on 127.0.0.1 and a
 * free port, started in-process, that checks requests the way the real `POST /transcribe` would and
 * answers from a script. Transcripts are derived from the media url (`fakeTranscript`), never from media.
 *
 * Request checks, in order: path `/transcribe` (else 404), method POST (else 400), the bearer token when
 * one is configured (else 401), `Content-Type: application/json` and a JSON object body with a non-empty
 * string `url` (else 400). Every request is recorded, valid or not; only valid ones consume the script.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Context, Duration, Effect, Layer, Predicate, type Scope } from "effect"
import type { TranscriptionResult } from "../../packages/media/src/layers/Transcription.js"

/** One scripted answer. Defaults: status 200; body `fakeTranscript(url)` on 2xx, `{ error }` otherwise. */
export interface Reply {
  readonly status?: number
  /** Sent as JSON, except a string, which is sent as is (for bodies that are not JSON). */
  readonly body?: unknown
  readonly headers?: Readonly<Record<string, string>>
  /** Wait (real time) before answering. */
  readonly delay?: Duration.DurationInput
  /** Never answer; the connection stays open until the client gives up or the server stops. */
  readonly hang?: boolean
}

export interface RecordedRequest {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: string
}

export interface Options {
  /** Answers to valid calls, in order. */
  readonly script?: ReadonlyArray<Reply>
  /** The answer once the script is used up. Default: 200 with `fakeTranscript(url)`. */
  readonly fallback?: Reply
  /** When set, requests must carry `Authorization: Bearer <token>`. */
  readonly token?: string
}

export const path = "/transcribe"

export class FakeTranscriptionServer extends Context.Tag("pgfiber/FakeTranscriptionServer")<FakeTranscriptionServer, {
  /** The endpoint to configure as TRANSCRIBE_URL. */
  readonly url: URL
  /** Every request received so far, valid or not, in arrival order. */
  readonly requests: Effect.Effect<ReadonlyArray<RecordedRequest>>
  /** Waits until at least `count` requests have arrived (for hang tests driven by TestClock). */
  readonly awaitRequests: (count: number) => Effect.Effect<void>
}>() {}

/** Deterministic: the same url always yields the same transcript. */
export const fakeTranscript = (url: string): TranscriptionResult => {
  const name = url.split(/[?#]/)[0]!.split("/").filter((part) => part !== "").at(-1) ?? url
  // A stable pseudo-confidence in [0.8, 1) so tests can tell urls apart without hard-coding one number.
  const hash = [...url].reduce((h, char) => (h * 31 + char.charCodeAt(0)) >>> 0, 7)
  return {
    segments: [
      { start: 0, end: 1.5, text: `Fake transcript of ${name}.` },
      { start: 1.5, end: 3, text: `It has ${url.length} characters in its url.` }
    ],
    language: "en",
    confidence: 0.8 + (hash % 200) / 1000,
    metadata: { fake: true, model: "fake-transcriber", source_url: url }
  }
}

export const make = (options: Options = {}): Effect.Effect<FakeTranscriptionServer["Type"], never, Scope.Scope> =>
  Effect.gen(function*() {
    const script = options.script ?? []
    const fallback = options.fallback ?? {}
    const recorded: Array<RecordedRequest> = []
    const waiters = new Set<() => void>()
    const timers = new Set<NodeJS.Timeout>()
    let validCalls = 0

    const send = (res: Http.ServerResponse, status: number, body: unknown, headers: Readonly<Record<string, string>> = {}) => {
      const raw = Predicate.isString(body)
      res.writeHead(status, { "content-type": raw ? "text/plain; charset=utf-8" : "application/json", ...headers })
      res.end(raw ? body : JSON.stringify(body))
    }

    const answer = (res: Http.ServerResponse, url: string) => {
      const reply = script[validCalls] ?? fallback
      validCalls += 1
      if (reply.hang === true) return
      const status = reply.status ?? 200
      const body = reply.body !== undefined
        ? reply.body
        : status >= 200 && status < 300
        ? fakeTranscript(url)
        : { error: Http.STATUS_CODES[status] ?? `status ${status}` }
      const delay = Duration.toMillis(reply.delay ?? 0)
      if (delay === 0) return send(res, status, body, reply.headers)
      const timer = setTimeout(() => {
        timers.delete(timer)
        send(res, status, body, reply.headers)
      }, delay)
      timers.add(timer)
    }

    const handle = (req: Http.IncomingMessage, res: Http.ServerResponse, body: string) => {
      const requestPath = new URL(req.url ?? "/", "http://127.0.0.1").pathname
      recorded.push({ method: req.method ?? "", path: requestPath, headers: req.headers, body })
      for (const wake of waiters) wake()
      if (requestPath !== path) return send(res, 404, { error: `No route ${requestPath}; POST ${path}` })
      if (req.method !== "POST") return send(res, 400, { error: `Expected POST, got ${req.method}` })
      if (options.token !== undefined && req.headers.authorization !== `Bearer ${options.token}`) {
        return send(res, 401, { error: "Missing or wrong bearer token" })
      }
      if (!(req.headers["content-type"] ?? "").startsWith("application/json")) {
        return send(res, 400, { error: `Expected Content-Type application/json, got ${req.headers["content-type"]}` })
      }
      let json: unknown
      try {
        json = JSON.parse(body)
      } catch {
        return send(res, 400, { error: "Body is not JSON" })
      }
      if (!Predicate.isRecord(json) || !Predicate.isString(json.url) || json.url === "") {
        return send(res, 400, { error: "Body must be a JSON object with a non-empty string \"url\"" })
      }
      answer(res, json.url)
    }

    const server = yield* Effect.acquireRelease(
      Effect.async<Http.Server>((resume) => {
        const server = Http.createServer((req, res) => {
          const chunks: Array<Buffer> = []
          req.on("data", (chunk: Buffer) => chunks.push(chunk))
          req.on("end", () => handle(req, res, Buffer.concat(chunks).toString("utf8")))
        })
        server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
      }),
      (server) =>
        Effect.async<void>((resume) => {
          for (const timer of timers) clearTimeout(timer)
          // Hanging replies keep sockets open; close() alone would wait for them forever.
          server.closeAllConnections()
          server.close(() => resume(Effect.void))
        })
    )
    const { port } = server.address() as AddressInfo

    return FakeTranscriptionServer.of({
      url: new URL(`http://127.0.0.1:${port}${path}`),
      requests: Effect.sync(() => [...recorded]),
      awaitRequests: (count) =>
        Effect.async<void>((resume) => {
          const check = () => {
            if (recorded.length < count) return
            waiters.delete(check)
            resume(Effect.void)
          }
          waiters.add(check)
          check()
          return Effect.sync(() => waiters.delete(check))
        })
    })
  })

export const layer = (options: Options = {}): Layer.Layer<FakeTranscriptionServer> =>
  Layer.scoped(FakeTranscriptionServer, make(options))
