import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { assert, describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Exit, Fiber, Layer, Option, Redacted, TestClock } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Permanent, RateLimited, Transient } from "../../packages/pgfiber/src/JobError.js"
import * as FakeTranscriptionServer from "../support/FakeTranscriptionServer.js"
import * as Transcription from "../../packages/media/src/layers/Transcription.js"

const media = "https://media.example.com/uploads/lecture-01.mp4"

/** A fake server and a client pointed at it, both living as long as the test's scope. */
const setup = (
  server: FakeTranscriptionServer.Options = {},
  client: Partial<Omit<Transcription.Options, "url">> = {}
) =>
  Effect.gen(function*() {
    const fake = yield* FakeTranscriptionServer.make(server)
    const transcription = yield* Transcription.make({ url: fake.url, ...client })
    return { fake, transcription }
  })

const withConfig = (env: Record<string, string>) =>
  Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

describe("Transcription over HTTP (fake server on loopback)", () => {
  it.scoped("posts the url as JSON and decodes segments as a JSON array", () =>
    Effect.gen(function*() {
      const { fake, transcription } = yield* setup({ token: "s3cret" }, { token: Redacted.make("s3cret") })
      const result = yield* transcription.transcribe({ url: media })

      const expected = FakeTranscriptionServer.fakeTranscript(media)
      assert.isArray(result.segments)
      expect(result.segments).toEqual(expected.segments)
      expect(result.language).toBe("en")
      expect(result.confidence).toBe(expected.confidence)
      expect(result.metadata).toEqual({ fake: true, model: "fake-transcriber", source_url: media })

      const [request] = yield* fake.requests
      expect(request?.method).toBe("POST")
      expect(request?.path).toBe("/transcribe")
      expect(request?.headers["content-type"]).toMatch(/^application\/json/)
      expect(request?.headers.authorization).toBe("Bearer s3cret")
      expect(JSON.parse(request?.body ?? "")).toEqual({ url: media })
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("null optional fields decode as absent", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({
        script: [{ body: { segments: [], language: null, confidence: null, metadata: null } }]
      })
      const result = yield* transcription.transcribe({ url: media })
      expect(result).toEqual({ segments: [] })
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("503 is Transient, and the next call succeeds", () =>
    Effect.gen(function*() {
      const { fake, transcription } = yield* setup({ script: [{ status: 503 }, { status: 200 }] })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Transient)
      expect(error.message).toContain("503")
      const result = yield* transcription.transcribe({ url: media })
      expect(result.segments).toHaveLength(2)
      expect(yield* fake.requests).toHaveLength(2)
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("429 with Retry-After in seconds is RateLimited for that long", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({ script: [{ status: 429, headers: { "retry-after": "7" } }] })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, RateLimited)
      expect(Duration.toMillis(error.retryAfter)).toBe(7_000)
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("429 with Retry-After as an HTTP-date is RateLimited until that date", () =>
    Effect.gen(function*() {
      const now = Date.parse("2026-03-01T12:00:00Z")
      yield* TestClock.setTime(now)
      const { transcription } = yield* setup({
        script: [{ status: 429, headers: { "retry-after": new Date(now + 120_000).toUTCString() } }]
      })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, RateLimited)
      expect(Duration.toMillis(error.retryAfter)).toBe(120_000)
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("429 without a usable Retry-After falls back to defaultRetryAfter", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup(
        { script: [{ status: 429 }, { status: 429, headers: { "retry-after": "soon" } }] },
        { defaultRetryAfter: "5 seconds" }
      )
      for (const _ of [1, 2]) {
        const error = yield* Effect.flip(transcription.transcribe({ url: media }))
        assert.instanceOf(error, RateLimited)
        expect(Duration.toMillis(error.retryAfter)).toBe(5_000)
      }
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("400 is Permanent and carries the server's message", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({
        script: [{ status: 400, body: { detail: "url must point at audio or video" } }]
      })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Permanent)
      expect(error.message).toContain("400")
      expect(error.message).toContain("url must point at audio or video")
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("a long error body is truncated to one bounded line", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({
        script: [{ status: 422, body: `<html>\n${"x".repeat(10_000)}\n</html>` }]
      })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Permanent)
      expect(error.message).toContain("<html> xxx")
      expect(error.message).not.toContain("\n")
      expect(error.message.length).toBeLessThan(700)
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("maps each status to the tag the retry policy expects", () =>
    Effect.gen(function*() {
      const transient = [500, 502, 503, 504, 408, 409]
      const permanent = [400, 401, 403, 404, 422, 410]
      const { transcription } = yield* setup({ script: [...transient, ...permanent].map((status) => ({ status })) })
      for (const status of transient) {
        const error = yield* Effect.flip(transcription.transcribe({ url: media }))
        expect([status, error._tag]).toEqual([status, "Transient"])
      }
      for (const status of permanent) {
        const error = yield* Effect.flip(transcription.transcribe({ url: media }))
        expect([status, error._tag]).toEqual([status, "Permanent"])
      }
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("a 200 whose segments is not an array is Permanent (answered outside the contract)", () =>
    Effect.gen(function*() {
      // The seed's failure mode: segments stored as a string holding JSON.
      const { transcription } = yield* setup({ script: [{ body: { segments: "[{\"text\":\"hi\"}]", language: "en" } }] })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Permanent)
      expect(error.message).toContain("segments")
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("a 200 whose body is not JSON is Permanent", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({ script: [{ body: "<html>proxy login</html>" }] })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Permanent)
      expect(error.message).toContain("not JSON")
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("a server that hangs past the timeout is Transient", () =>
    Effect.gen(function*() {
      const { fake, transcription } = yield* setup({ script: [{ hang: true }] }, { timeout: "2 seconds" })
      const call = yield* Effect.fork(transcription.transcribe({ url: media }))
      // The request is on the server, so the timeout's clock is running.
      yield* fake.awaitRequests(1)
      yield* TestClock.adjust("1999 millis")
      expect(Option.isNone(yield* Fiber.poll(call))).toBe(true)
      yield* TestClock.adjust("1 millis")
      const exit = yield* Fiber.await(call)
      assert(Exit.isFailure(exit))
      const error = yield* Effect.flip(exit)
      assert.instanceOf(error, Transient)
      expect(error.message).toContain("did not answer within")
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("connection refused is Transient", () =>
    Effect.gen(function*() {
      const port = yield* Effect.promise(() => freePort())
      const transcription = yield* Transcription.make({ url: new URL(`http://127.0.0.1:${port}/transcribe`) })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Transient)
      expect(error.message).toContain("ECONNREFUSED")
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it.scoped("a wrong token is Permanent and the token is not in the message", () =>
    Effect.gen(function*() {
      const { transcription } = yield* setup({ token: "right" }, { token: Redacted.make("wrong-secret") })
      const error = yield* Effect.flip(transcription.transcribe({ url: media }))
      assert.instanceOf(error, Permanent)
      expect(error.message).toContain("401")
      expect(error.message).not.toContain("wrong-secret")
    }).pipe(Effect.provide(NodeHttpClient.layer)))
})

describe("FakeTranscriptionServer", () => {
  it.scoped("rejects malformed requests without consuming the script, and records them all", () =>
    Effect.gen(function*() {
      const fake = yield* FakeTranscriptionServer.make({ script: [{ status: 503 }] })
      const client = yield* HttpClient.HttpClient
      const endpoint = fake.url.href
      const statusOf = (request: HttpClientRequest.HttpClientRequest) =>
        Effect.map(client.execute(request), (response) => response.status)
      expect(yield* statusOf(HttpClientRequest.get(endpoint))).toBe(400)
      expect(yield* statusOf(HttpClientRequest.post(new URL("/other", endpoint)))).toBe(404)
      expect(yield* statusOf(HttpClientRequest.post(endpoint).pipe(HttpClientRequest.bodyText("{\"url\":\"x\"}")))).toBe(400)
      expect(yield* statusOf(HttpClientRequest.post(endpoint).pipe(HttpClientRequest.bodyUnsafeJson({ url: 1 })))).toBe(400)
      expect(yield* statusOf(HttpClientRequest.post(endpoint).pipe(HttpClientRequest.bodyUnsafeJson({})))).toBe(400)
      expect(yield* statusOf(HttpClientRequest.post(endpoint).pipe(HttpClientRequest.bodyUnsafeJson({ url: "a" })))).toBe(503)
      expect(yield* statusOf(HttpClientRequest.post(endpoint).pipe(HttpClientRequest.bodyUnsafeJson({ url: "a" })))).toBe(200)
      expect((yield* fake.requests).map((request) => request.method)).toEqual(["GET", "POST", "POST", "POST", "POST", "POST", "POST"])
    }).pipe(Effect.provide(NodeHttpClient.layer)))

  it("derives the same transcript from the same url, and different ones from different urls", () => {
    expect(FakeTranscriptionServer.fakeTranscript(media)).toEqual(FakeTranscriptionServer.fakeTranscript(media))
    expect(FakeTranscriptionServer.fakeTranscript(media)).not.toEqual(FakeTranscriptionServer.fakeTranscript(`${media}?v=2`))
  })
})

describe("Transcription.layer (config)", () => {
  it.scoped("reads TRANSCRIBE_URL, TRANSCRIBE_TOKEN and TRANSCRIBE_TIMEOUT_MS", () =>
    Effect.gen(function*() {
      const fake = yield* FakeTranscriptionServer.make({ token: "from-env", script: [{ hang: true }] })
      const context = yield* Layer.build(Transcription.layer).pipe(
        withConfig({ TRANSCRIBE_URL: fake.url.href, TRANSCRIBE_TOKEN: "from-env", TRANSCRIBE_TIMEOUT_MS: "250" })
      )
      const transcription = yield* Effect.provide(Transcription.Transcription, context)
      const call = yield* Effect.fork(transcription.transcribe({ url: media }))
      yield* fake.awaitRequests(1)
      yield* TestClock.adjust("250 millis")
      const error = yield* Effect.flip(Fiber.join(call))
      expect(error._tag).toBe("Transient")
      expect(error.message).toContain("250")
      const result = yield* transcription.transcribe({ url: media })
      expect(result.segments).toEqual(FakeTranscriptionServer.fakeTranscript(media).segments)
      const requests = yield* fake.requests
      expect(requests.map((request) => request.headers.authorization)).toEqual(["Bearer from-env", "Bearer from-env"])
    }))

  it.scoped("a missing TRANSCRIBE_URL fails building the layer, naming the variable", () =>
    Effect.gen(function*() {
      const error = yield* Layer.build(Transcription.layer).pipe(withConfig({}), Effect.flip)
      expect(String(error)).toContain("TRANSCRIBE_URL")
    }))

  it.scoped("an invalid TRANSCRIBE_URL fails building the layer, naming the variable", () =>
    Effect.gen(function*() {
      for (const url of ["not a url", "ftp://127.0.0.1/transcribe"]) {
        const error = yield* Layer.build(Transcription.layer).pipe(withConfig({ TRANSCRIBE_URL: url }), Effect.flip)
        expect(error._op).toBe("InvalidData")
        expect(String(error)).toContain("TRANSCRIBE_URL")
      }
    }))

  it.scoped("an invalid TRANSCRIBE_TIMEOUT_MS fails building the layer, naming the variable", () =>
    Effect.gen(function*() {
      for (const ms of ["soon", "0"]) {
        const error = yield* Layer.build(Transcription.layer).pipe(
          withConfig({ TRANSCRIBE_URL: "http://127.0.0.1:1/transcribe", TRANSCRIBE_TIMEOUT_MS: ms }),
          Effect.flip
        )
        expect(String(error)).toContain("TRANSCRIBE_TIMEOUT_MS")
      }
    }))
})

describe("Transcription.layerMemory", () => {
  it.effect("answers from an array script and repeats its last entry", () =>
    Effect.gen(function*() {
      const transcription = yield* Transcription.makeMemory([
        new Transient({ message: "warming up" }),
        FakeTranscriptionServer.fakeTranscript(media)
      ])
      const first = yield* Effect.flip(transcription.transcribe({ url: media }))
      expect(first._tag).toBe("Transient")
      for (const _ of [1, 2]) {
        const result = yield* transcription.transcribe({ url: media })
        expect(result.segments).toEqual(FakeTranscriptionServer.fakeTranscript(media).segments)
      }
    }))

  it.effect("a function script sees each request and its call number", () =>
    Effect.gen(function*() {
      const seen: Array<[string, number]> = []
      const transcription = yield* Effect.provide(
        Transcription.Transcription,
        Transcription.layerMemory((request, call) => {
          seen.push([request.url, call])
          return Effect.succeed({ segments: [{ text: request.url }] })
        })
      )
      yield* transcription.transcribe({ url: "a" })
      const result = yield* transcription.transcribe({ url: "b" })
      expect(result.segments).toEqual([{ text: "b" }])
      expect(seen).toEqual([["a", 0], ["b", 1]])
    }))

  it.effect("a scripted result the real decoder would reject is a defect", () =>
    Effect.gen(function*() {
      const transcription = yield* Transcription.makeMemory([{ segments: "not an array" } as never])
      const exit = yield* Effect.exit(transcription.transcribe({ url: media }))
      assert(Exit.isFailure(exit))
      expect(Exit.isInterrupted(exit)).toBe(false)
      expect(exit.cause._tag).toBe("Die")
    }))
})

/** A port nothing listens on: bind, note it, close. */
const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Http.createServer()
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as AddressInfo
      server.close(() => resolve(port))
    })
  })
