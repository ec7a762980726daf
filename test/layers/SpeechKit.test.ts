/**
 * The SpeechKit client against the simulator over real HTTP on loopback (the simulator's checks are the
 * contract: a wrong header or body fails here), the result-assembly rule, the config, and one contract
 * suite run against both the in-memory double and client + simulator.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { assert, describe, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Either, Exit, Fiber, Option, Redacted, Schema, Scope, TestClock } from "effect"
import { execFileSync } from "node:child_process"
import * as Http from "node:http"
import * as JobError from "../../packages/pgfiber/src/JobError.js"
import * as SpeechKit from "../../packages/media/src/layers/SpeechKit.js"
import * as SpeechKitSimulator from "../../packages/media/src/testing/SpeechKitSimulator.js"

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

const ffmpegPath = (await import("@ffmpeg-installer/ffmpeg")).default.path

/** A real OGG Opus file: a sine tone, encoded by the ffmpeg the pipeline uses. */
const oggOpus = (seconds: number, channels: number): Uint8Array =>
  execFileSync(ffmpegPath, [
    "-hide_banner", "-loglevel", "error",
    "-f", "lavfi", "-i", `sine=frequency=440:duration=${seconds}`,
    "-ac", String(channels), "-c:a", "libopus", "-f", "ogg", "pipe:1"
  ])

const files: Record<string, Uint8Array> = {
  "call.ogg": oggOpus(7, 2),
  "call.wav": new TextEncoder().encode("RIFF....WAVEfmt this is not ogg opus")
}

/** A loopback file server for the audio the simulator downloads. */
const serveFiles = Effect.gen(function*() {
  const server = yield* NodeHttpServer.make(() => Http.createServer(), { host: "127.0.0.1", port: 0 }).pipe(Effect.orDie)
  yield* server.serve(HttpRouter.empty.pipe(
    HttpRouter.get(
      "/audio/:name",
      Effect.map(HttpRouter.params, ({ name }) => {
        const bytes = name === undefined ? undefined : files[name]
        return bytes === undefined ? HttpServerResponse.empty({ status: 404 }) : HttpServerResponse.uint8Array(bytes)
      })
    )
  ))
  const address = server.address
  assert(address._tag === "TcpAddress")
  return `http://127.0.0.1:${address.port}/audio`
})

const apiKey = "client-test-api-key"
const folderId = "b1gtestfolder"

/** A simulator expecting our key and folder, the audio server, and a client pointed at both. */
const setup = (
  simulator: SpeechKitSimulator.Options = {},
  client: Partial<SpeechKit.Options> = {}
) =>
  Effect.gen(function*() {
    const audio = yield* serveFiles
    const sim = yield* SpeechKitSimulator.make({ apiKey, folderId, ...simulator })
    const speechKit = yield* SpeechKit.make({
      credentials: { _tag: "ApiKey", apiKey: Redacted.make(apiKey) },
      folderId,
      sttUrl: sim.url,
      operationUrl: `${sim.url}/`,
      timeout: Duration.seconds(5),
      // a 404 is retried with real waits; TestClock would hold them (the quirk has its own live test)
      resultNotFoundRetries: 0,
      ...client
    })
    return { sim, speechKit, audio }
  }).pipe(Effect.provide(FetchHttpClient.layer))

const failure = <A>(effect: Effect.Effect<A, SpeechKit.SpeechKitError>) =>
  Effect.flip(effect).pipe(Effect.orElse(() => Effect.dieMessage("expected a failure")))

const assertTag = <T extends SpeechKit.SpeechKitError["_tag"]>(error: SpeechKit.SpeechKitError, tag: T, message?: RegExp) => {
  assert.strictEqual(error._tag, tag, error.message)
  if (message) assert.match(error.message, message)
  // Stored in last_error: it must round-trip through the shared Schema.
  const encoded = Schema.encodeSync(JobError.JobError)(error)
  assert.deepStrictEqual(Schema.encodeSync(JobError.JobError)(Schema.decodeUnknownSync(JobError.JobError)(encoded)), encoded)
}

// ---------------------------------------------------------------------------------------------

describe("SpeechKit client against the simulator", () => {
  it.scoped("happy path: start → not done → done → normalized segments, with the documented request on the wire", () =>
    Effect.gen(function*() {
      const { sim, speechKit, audio } = yield* setup()
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg?X-Amz-Signature=abc` })
      assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: false })
      assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true })
      const recognition = yield* speechKit.getRecognition(operationId)

      assert.deepStrictEqual(recognition, {
        segments: [
          { startMs: 0, endMs: 5000, channel: "0", text: "Simulated utterance 1 on channel 0." },
          { startMs: 0, endMs: 5000, channel: "1", text: "Simulated utterance 1 on channel 1." },
          { startMs: 5000, endMs: 7000, channel: "0", text: "Simulated utterance 2 on channel 0." },
          { startMs: 5000, endMs: 7000, channel: "1", text: "Simulated utterance 2 on channel 1." }
        ],
        language: "ru-RU"
      })

      const start = Option.getOrThrow(yield* sim.lastRequest("recognizeFileAsync"))
      assert.strictEqual(start.method, "POST")
      assert.strictEqual(start.headers["authorization"], `Api-Key ${apiKey}`)
      assert.strictEqual(start.headers["x-folder-id"], folderId)
      assert.deepStrictEqual(start.body, {
        uri: `${audio}/call.ogg?X-Amz-Signature=abc`,
        recognitionModel: {
          model: "general",
          audioFormat: { containerAudio: { containerAudioType: "OGG_OPUS" } },
          textNormalization: { textNormalization: "TEXT_NORMALIZATION_ENABLED" },
          languageRestriction: { restrictionType: "WHITELIST", languageCode: ["ru-RU"] },
          audioProcessingType: "FULL_DATA"
        }
      })
      const get = Option.getOrThrow(yield* sim.lastRequest("getRecognition"))
      assert.strictEqual(get.url, `/stt/v3/getRecognition?operationId=${operationId}`)
      assert.strictEqual(Option.getOrThrow(yield* sim.lastRequest("getOperation")).url, `/operations/${operationId}`)
      assert.deepStrictEqual(
        [yield* sim.count("recognizeFileAsync"), yield* sim.count("getOperation"), yield* sim.count("getRecognition")],
        [1, 2, 1]
      )
    }))

  it.scoped("passes languages and model through, and authenticates with an IAM token", () =>
    Effect.gen(function*() {
      const { sim, speechKit, audio } = yield* setup(
        { apiKey: undefined, iamToken: "t1.iam-token", pollsUntilDone: 0, transcript: [{ channel: "0", startMs: 100, endMs: 900, text: "сәлем" }] },
        { credentials: { _tag: "IamToken", iamToken: Redacted.make("t1.iam-token") } }
      )
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg`, languageCodes: ["kk-KK", "ru-RU"], model: "general:rc" })
      assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true })
      assert.deepStrictEqual(yield* speechKit.getRecognition(operationId), {
        segments: [{ startMs: 100, endMs: 900, channel: "0", text: "сәлем" }],
        language: "kk-KK"
      })
      const start = Option.getOrThrow(yield* sim.lastRequest("recognizeFileAsync"))
      assert.strictEqual(start.headers["authorization"], "Bearer t1.iam-token")
      const model = (start.body as { recognitionModel: { model: string; languageRestriction: unknown } }).recognitionModel
      assert.strictEqual(model.model, "general:rc")
      assert.deepStrictEqual(model.languageRestriction, { restrictionType: "WHITELIST", languageCode: ["kk-KK", "ru-RU"] })
    }))

  it.scoped("a wrong API key, or a credential of the wrong kind, is Permanent (401) and the key is not in the message", () =>
    Effect.gen(function*() {
      const wrongKey = yield* setup({}, { credentials: { _tag: "ApiKey", apiKey: Redacted.make("not-the-key") } })
      const error = yield* failure(wrongKey.speechKit.startRecognition({ uri: `${wrongKey.audio}/call.ogg` }))
      assertTag(error, "Permanent", /recognizeFileAsync: HTTP 401: \(gRPC code 16\) Unknown api key/)
      assert.notInclude(error.message, "not-the-key")

      const wrongKind = yield* setup({}, { credentials: { _tag: "IamToken", iamToken: Redacted.make(apiKey) } })
      assertTag(yield* failure(wrongKind.speechKit.getOperation("sim00000000000000001")), "Permanent", /HTTP 401/)
    }))

  it.scoped("a missing folder id, when the account needs one, is Permanent", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({}, { folderId: undefined })
      assertTag(yield* failure(speechKit.startRecognition({ uri: `${audio}/call.ogg` })), "Permanent", /HTTP 401: .*x-folder-id/)
      const other = yield* setup({}, { folderId: "b1gsomeoneelse" })
      assertTag(yield* failure(other.speechKit.startRecognition({ uri: `${other.audio}/call.ogg` })), "Permanent", /HTTP 403/)
    }))

  it.scoped("429 is RateLimited after Retry-After: seconds, an HTTP-date, or 60 s when absent", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.parse("2030-01-01T00:00:00Z"))
      const { sim, speechKit, audio } = yield* setup({
        faults: {
          recognizeFileAsync: [{ status: 429, headers: { "retry-after": "2" } }, { status: 429 }],
          getOperation: [{ status: 429, headers: { "retry-after": "Tue, 01 Jan 2030 00:00:30 GMT" } }]
        }
      })
      const seconds = yield* failure(speechKit.startRecognition({ uri: `${audio}/call.ogg` }))
      assertTag(seconds, "RateLimited", /HTTP 429/)
      assert.deepStrictEqual(seconds._tag === "RateLimited" && Duration.toMillis(seconds.retryAfter), 2000)
      const absent = yield* failure(speechKit.startRecognition({ uri: `${audio}/call.ogg` }))
      assert.deepStrictEqual(absent._tag === "RateLimited" && Duration.toMillis(absent.retryAfter), 60_000)

      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      const date = yield* failure(speechKit.getOperation(operationId))
      assert.deepStrictEqual(date._tag === "RateLimited" && Duration.toMillis(date.retryAfter), 30_000)
      assert.strictEqual(yield* sim.count("recognizeFileAsync"), 3)
    }))

  it.scoped("503, 500 and 409 are Transient; 400 and 404 are Permanent with the server's message", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({
        pollsUntilDone: 0,
        faults: {
          recognizeFileAsync: [{ status: 503 }, { status: 400, body: { code: 3, message: "audio too long" } }, { status: 409 }],
          getRecognition: [{ status: 500 }]
        }
      })
      const uri = `${audio}/call.ogg`
      assertTag(yield* failure(speechKit.startRecognition({ uri })), "Transient", /HTTP 503: \(gRPC code 14\)/)
      assertTag(yield* failure(speechKit.startRecognition({ uri })), "Permanent", /HTTP 400: \(gRPC code 3\) audio too long/)
      assertTag(yield* failure(speechKit.startRecognition({ uri })), "Transient", /HTTP 409/)
      const operationId = yield* speechKit.startRecognition({ uri })
      yield* speechKit.getOperation(operationId)
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "Transient", /getRecognition: HTTP 500/)
      assert.strictEqual((yield* speechKit.getRecognition(operationId)).segments.length, 4)
      assertTag(yield* failure(speechKit.getOperation("sim99999999999999999")), "Permanent", /HTTP 404: \(gRPC code 5\) Operation .* not found/)
    }))

  it.scoped("a body the simulator rejects (unsupported language) is Permanent", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup()
      assertTag(
        yield* failure(speechKit.startRecognition({ uri: `${audio}/call.ogg`, languageCodes: ["Russian"] })),
        "Permanent",
        /HTTP 400: .*unsupported language code\(s\): Russian/
      )
    }))

  it.scoped("an operation that ends with gRPC 4, 13 or 14 is done and retryable; any other code is Permanent", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({
        pollsUntilDone: 0,
        operationErrors: [
          { code: 13, message: "recognizer crashed" },
          { code: 14, message: "backend unavailable" },
          { code: 4, message: "deadline exceeded" },
          { code: 7, message: "permission denied on the bucket" }
        ]
      })
      for (const [code, message] of [[13, "recognizer crashed"], [14, "backend unavailable"], [4, "deadline exceeded"]] as const) {
        const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
        assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true, retryable: { code, message } })
      }
      const denied = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      assertTag(
        yield* failure(speechKit.getOperation(denied)),
        "Permanent",
        new RegExp(`operation ${denied} failed \\(gRPC code 7\\): permission denied on the bucket`)
      )
      // the scripted errors are used up: the next operation works
      const fine = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      assert.deepStrictEqual(yield* speechKit.getOperation(fine), { done: true })
    }))

  it.scopedLive("getRecognition's 404 right after done is asked again, up to resultNotFoundRetries, then Permanent", () =>
    Effect.gen(function*() {
      const quick = { resultNotFoundRetries: 3, resultRetryDelay: Duration.millis(10) }
      const late = yield* setup({ pollsUntilDone: 0, resultsNotFoundAfterDone: 2 }, quick)
      const operationId = yield* late.speechKit.startRecognition({ uri: `${late.audio}/call.ogg` })
      assert.deepStrictEqual(yield* late.speechKit.getOperation(operationId), { done: true })
      const { segments } = yield* late.speechKit.getRecognition(operationId)
      assert.isAbove(segments.length, 0)
      assert.strictEqual(yield* late.sim.count("getRecognition"), 3)

      const never = yield* setup({ pollsUntilDone: 0, resultsNotFoundAfterDone: 10 }, quick)
      const lost = yield* never.speechKit.startRecognition({ uri: `${never.audio}/call.ogg` })
      yield* never.speechKit.getOperation(lost)
      assertTag(yield* failure(never.speechKit.getRecognition(lost)), "Permanent", /HTTP 404: .* \(still not found after 3 retries\)$/)
      assert.strictEqual(yield* never.sim.count("getRecognition"), 4)
    }))

  it.scoped("Retry-After is capped at maxRetryAfter (default 10 minutes)", () =>
    Effect.gen(function*() {
      const day = { status: 429, headers: { "retry-after": "86400" } }
      const capped = yield* setup({ faults: { recognizeFileAsync: [day] } })
      const tenMinutes = yield* failure(capped.speechKit.startRecognition({ uri: `${capped.audio}/call.ogg` }))
      assert.deepStrictEqual(tenMinutes._tag === "RateLimited" && Duration.toMillis(tenMinutes.retryAfter), 600_000)
      const configured = yield* setup({ faults: { recognizeFileAsync: [day, { status: 429 }] } }, { maxRetryAfter: Duration.seconds(30) })
      const thirty = yield* failure(configured.speechKit.startRecognition({ uri: `${configured.audio}/call.ogg` }))
      assert.deepStrictEqual(thirty._tag === "RateLimited" && Duration.toMillis(thirty.retryAfter), 30_000)
      // the 60 s default for a 429 without the header is held to the cap too
      const absent = yield* failure(configured.speechKit.startRecognition({ uri: `${configured.audio}/call.ogg` }))
      assert.deepStrictEqual(absent._tag === "RateLimited" && Duration.toMillis(absent.retryAfter), 30_000)
    }))

  it.scoped("audio over SpeechKit's limits (all channels counted) ends the operation with code 3", () =>
    Effect.gen(function*() {
      // call.ogg is 7 s of stereo: under a 10 s limit by its length, over it with both channels counted
      const { speechKit, audio } = yield* setup({ pollsUntilDone: 0, maxDurationMs: 10_000 })
      const stereo = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      assertTag(yield* failure(speechKit.getOperation(stereo)), "Permanent", /gRPC code 3\): audio too long: \d+ ms × 2 channel/)
    }))

  it.scoped("a uri that is not OGG Opus ends the operation with an error: Permanent", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({ pollsUntilDone: 0 })
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.wav` })
      assertTag(yield* failure(speechKit.getOperation(operationId)), "Permanent", /gRPC code 3\): audio is not an OGG stream/)
    }))

  it.scoped("a malformed 2xx is Permanent, on every route (the documents client's rule too)", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({
        pollsUntilDone: 0,
        faults: {
          recognizeFileAsync: [{ status: 200, body: { done: false } }],
          getOperation: [{ status: 200, body: "<html>502 from a proxy</html>" }],
          getRecognition: [{ status: 200, body: "{\"result\": {\"final\": {\"alternatives\": \"oops\"}}}" }, { status: 200, body: "{\"result\": {" }]
        }
      })
      assertTag(yield* failure(speechKit.startRecognition({ uri: `${audio}/call.ogg` })), "Permanent", /unexpected response body.*id/s)
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      assertTag(yield* failure(speechKit.getOperation(operationId)), "Permanent", /unexpected response body/)
      assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true })
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "Permanent", /unexpected response body/)
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "Permanent", /malformed result stream/)
    }))

  it.scoped("an {error} line inside the result stream maps by gRPC code", () =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({
        pollsUntilDone: 0,
        faults: {
          getRecognition: [
            { status: 200, body: "{\"result\":{\"channelTag\":\"0\"}}\n{\"error\":{\"code\":14,\"message\":\"backend went away\"}}\n" },
            { status: 200, body: "{\"error\":{\"code\":8,\"message\":\"quota\"}}" },
            { status: 200, body: "{\"error\":{\"code\":5,\"message\":\"results expired\"}}" }
          ]
        }
      })
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      yield* speechKit.getOperation(operationId)
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "Transient", /gRPC code 14\): backend went away/)
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "RateLimited", /quota/)
      assertTag(yield* failure(speechKit.getRecognition(operationId)), "Permanent", /results expired/)
    }))

  it.scoped("a request that outlives the timeout is Transient (TestClock, no real wait)", () =>
    Effect.gen(function*() {
      const { sim, speechKit, audio } = yield* setup({ faults: { getOperation: ["hang"] } }, { timeout: Duration.seconds(30) })
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      const fiber = yield* Effect.fork(speechKit.getOperation(operationId))
      yield* sim.awaitRequests("getOperation", 1)
      yield* TestClock.adjust(Duration.seconds(29))
      assert.isNull(fiber.unsafePoll(), "still waiting before the timeout")
      yield* TestClock.adjust(Duration.seconds(1))
      assertTag(yield* failure(Fiber.join(fiber)), "Transient", /getOperation: no complete response within 30s/)
    }))

  it.effect("a connection refused is Transient", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const { speechKit } = yield* setup().pipe(Scope.extend(scope))
      yield* Scope.close(scope, Exit.void)
      assertTag(yield* failure(speechKit.getOperation("sim00000000000000001")), "Transient", /getOperation: Transport error/)
    }))
})

// ---------------------------------------------------------------------------------------------

describe("SpeechKit result assembly (getRecognition bodies scripted into the simulator)", () => {
  const recognize = (stream: string) =>
    Effect.gen(function*() {
      const { speechKit, audio } = yield* setup({ pollsUntilDone: 0, faults: { getRecognition: [{ status: 200, body: stream }] } })
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      yield* speechKit.getOperation(operationId)
      return yield* speechKit.getRecognition(operationId)
    })

  it.scoped("reads the docs' pretty-printed stream (en/_includes/speechkit/async-recognition-v3.md, trimmed)", () =>
    Effect.gen(function*() {
      const docsExample = `{
   "result": {
      "sessionUuid": { "uuid": "24935f24-2c1f62dc-8dd49006-********", "userRequestId": "f8d2h7m07t4i********" },
      "audioCursors": { "receivedDataMs": "7400", "resetTimeMs": "0", "partialTimeMs": "7400", "finalTimeMs": "7400", "finalIndex": "0", "eouTimeMs": "0" },
      "responseWallTimeMs": "189",
      "final": {
         "alternatives": [{
            "words": [{ "text": "I", "startTimeMs": "459", "endTimeMs": "520" }],
            "text": "I'm Yandex SpeechKit I can turn any text into speech now you can too",
            "startTimeMs": "0", "endTimeMs": "7400", "confidence": 0, "languages": []
         }],
         "channelTag": "0"
      },
      "channelTag": "0"
   }
}
{
   "result": {
      "audioCursors": { "receivedDataMs": "7400", "finalIndex": "0" },
      "finalRefinement": {
         "finalIndex": "0",
         "normalizedText": {
            "alternatives": [{ "text": "I'm Yandex SpeechKit, I can turn any text into speech. Now you can too!", "startTimeMs": "0", "endTimeMs": "7400" }],
            "channelTag": "0"
         }
      },
      "channelTag": "0"
   }
}
{
   "result": { "audioCursors": { "eouTimeMs": "7400" }, "eouUpdate": { "timeMs": "7400" }, "channelTag": "0" }
}`
      assert.deepStrictEqual(yield* recognize(docsExample), {
        segments: [{ startMs: 0, endMs: 7400, channel: "0", text: "I'm Yandex SpeechKit, I can turn any text into speech. Now you can too!" }],
        language: undefined
      })
    }))

  it.scoped("pairs a refinement with the final of its channel and index; without indices, with the channel's latest final", () =>
    Effect.gen(function*() {
      const final = (channel: string, index: number | undefined, text: string, startMs: number) => ({
        ...(index === undefined ? {} : { audioCursors: { finalIndex: String(index) } }),
        final: {
          alternatives: [{
            text,
            startTimeMs: String(startMs),
            endTimeMs: startMs + 1000, // proto3 JSON readers take int64 as a number too
            languages: [{ languageCode: "ru-RU", probability: 0.9 }, { languageCode: "en-US", probability: 0.1 }]
          }],
          channelTag: channel
        },
        channelTag: channel
      })
      const refinement = (channel: string, index: number | undefined, text: string) => ({
        finalRefinement: {
          ...(index === undefined ? {} : { finalIndex: String(index) }),
          normalizedText: { alternatives: [{ text }], channelTag: channel }
        },
        channelTag: channel
      })
      const lines = [
        final("0", 0, "раз", 0),
        final("1", 0, "два", 500),
        refinement("1", 0, "Два."),
        final("0", 1, "три", 2000),
        { partial: { alternatives: [{ text: "четы" }] }, channelTag: "0" },
        refinement("0", 0, "Раз."),
        final("1", undefined, "   ", 3000),
        final("1", undefined, "пять", 4000),
        refinement("1", undefined, "Пять!")
      ]
      const recognition = yield* recognize(lines.map((result) => JSON.stringify({ result })).join("\n"))
      assert.deepStrictEqual(recognition.segments.map((s) => [s.channel, s.startMs, s.endMs, s.text]), [
        ["0", 0, 1000, "Раз."],
        ["1", 500, 1500, "Два."],
        ["0", 2000, 3000, "три"],
        ["1", 4000, 5000, "Пять!"]
      ])
      assert.strictEqual(recognition.language, "ru-RU")
    }))

  it.scoped("takes bare StreamingResponse objects too (the reference page's shape)", () =>
    Effect.gen(function*() {
      const bare = JSON.stringify({ final: { alternatives: [{ text: "да", startTimeMs: "10", endTimeMs: "20" }], channelTag: "0" } })
      assert.deepStrictEqual((yield* recognize(bare)).segments, [{ startMs: 10, endMs: 20, channel: "0", text: "да" }])
    }))

  it("splits one-per-line and rejects what is not a sequence of objects", () => {
    assert.deepStrictEqual(Either.getOrThrow(SpeechKit.splitJsonObjects("{\"a\":\"}{\"}\n{\"b\":[1,{}]}\n")), ["{\"a\":\"}{\"}", "{\"b\":[1,{}]}"])
    assert.isTrue(Either.isLeft(SpeechKit.splitJsonObjects("[{}]")))
    assert.isTrue(Either.isLeft(SpeechKit.splitJsonObjects("{\"a\":1} x")))
    assert.isTrue(Either.isLeft(SpeechKit.splitJsonObjects("{\"a\":1")))
  })
})

// ---------------------------------------------------------------------------------------------

describe("SpeechKit.layer (config)", () => {
  const withEnv = (env: Record<string, string>) => Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

  it.scoped("reads SPEECHKIT_* and talks to the configured hosts", () =>
    Effect.gen(function*() {
      const audio = yield* serveFiles
      const sim = yield* SpeechKitSimulator.make({ apiKey, folderId, pollsUntilDone: 0 }).pipe(Effect.provide(FetchHttpClient.layer))
      const speechKit = yield* SpeechKit.SpeechKit.pipe(
        Effect.provide(SpeechKit.layer),
        withEnv({
          SPEECHKIT_API_KEY: apiKey,
          SPEECHKIT_FOLDER_ID: folderId,
          SPEECHKIT_STT_URL: sim.url,
          SPEECHKIT_OPERATION_URL: sim.url,
          SPEECHKIT_MODEL: "deferred-general",
          SPEECHKIT_LANGUAGE: "en-US",
          SPEECHKIT_TIMEOUT_MS: "5000"
        })
      )
      const operationId = yield* speechKit.startRecognition({ uri: `${audio}/call.ogg` })
      const model = (Option.getOrThrow(yield* sim.lastRequest("recognizeFileAsync")).body as { recognitionModel: any }).recognitionModel
      assert.strictEqual(model.model, "deferred-general")
      assert.deepStrictEqual(model.languageRestriction.languageCode, ["en-US"])
      assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true })
    }))

  it.effect("wants exactly one credential, a positive timeout, and keeps secrets redacted", () =>
    Effect.gen(function*() {
      const load = (env: Record<string, string>) => Effect.either(SpeechKit.config.pipe(withEnv(env)))
      assert.isTrue(Either.isLeft(yield* load({})))
      assert.isTrue(Either.isLeft(yield* load({ SPEECHKIT_API_KEY: "a", SPEECHKIT_IAM_TOKEN: "b" })))
      assert.isTrue(Either.isLeft(yield* load({ SPEECHKIT_API_KEY: "a", SPEECHKIT_TIMEOUT_MS: "0" })))
      const fromToken = Either.getOrThrow(yield* load({ SPEECHKIT_IAM_TOKEN: "secret-token", SPEECHKIT_FOLDER_ID: "" }))
      assert.strictEqual(fromToken.credentials._tag, "IamToken")
      assert.isUndefined(fromToken.folderId)
      assert.notInclude(JSON.stringify(fromToken) + String(fromToken.credentials), "secret-token")
      const defaults = Either.getOrThrow(yield* load({ SPEECHKIT_API_KEY: "k" }))
      assert.deepStrictEqual(
        [defaults.sttUrl, defaults.operationUrl, defaults.model, defaults.language, Duration.toMillis(defaults.timeout!)],
        ["https://stt.api.cloud.yandex.net", "https://operation.api.cloud.yandex.net", "general", "ru-RU", 30_000]
      )
    }))
})

// ---------------------------------------------------------------------------------------------
// One contract, two callers: the in-memory double must not drift from client + simulator.
// ---------------------------------------------------------------------------------------------

const contract = (
  name: string,
  make: Effect.Effect<{ speechKit: SpeechKit.SpeechKit["Type"]; uri: string }, never, Scope.Scope>
) =>
  describe(`SpeechKit contract: ${name}`, () => {
    it.scoped("an operation is not done at first, then done, then has non-empty, ordered segments", () =>
      Effect.gen(function*() {
        const { speechKit, uri } = yield* make
        const operationId = yield* speechKit.startRecognition({ uri, languageCodes: ["ru-RU"] })
        assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: false })
        assertTag(yield* failure(speechKit.getRecognition(operationId)), "Permanent")
        assert.deepStrictEqual(yield* speechKit.getOperation(operationId), { done: true })
        const { segments } = yield* speechKit.getRecognition(operationId)
        assert.isAbove(segments.length, 0)
        for (const segment of segments) {
          assert.isAtMost(segment.startMs, segment.endMs)
          assert.isString(segment.channel)
          assert.notStrictEqual(segment.text.trim(), "")
        }
        assert.deepStrictEqual(segments, [...segments].sort((a, b) => a.startMs - b.startMs))
      }))

    it.scoped("an unknown operation is Permanent on both reads", () =>
      Effect.gen(function*() {
        const { speechKit } = yield* make
        assertTag(yield* failure(speechKit.getOperation("sim00000000000000404")), "Permanent")
        assertTag(yield* failure(speechKit.getRecognition("sim00000000000000404")), "Permanent")
      }))
  })

contract("in memory", Effect.map(SpeechKit.makeMemory(), (speechKit) => ({ speechKit, uri: "https://storage.example/call.ogg" })))
contract(
  "client + simulator",
  Effect.map(setup(), ({ audio, speechKit }) => ({ speechKit, uri: `${audio}/call.ogg` }))
)

describe("SpeechKit.layerMemory", () => {
  it.effect("follows its script: polls, then the scripted outcome", () =>
    Effect.gen(function*() {
      const speechKit = yield* SpeechKit.SpeechKit
      const ok = yield* speechKit.startRecognition({ uri: "s3://bucket/ok.ogg" })
      const bad = yield* speechKit.startRecognition({ uri: "s3://bucket/bad.ogg" })
      assert.deepStrictEqual(yield* speechKit.getOperation(ok), { done: true })
      assert.deepStrictEqual(yield* speechKit.getRecognition(ok), SpeechKit.memoryRecognition)
      assertTag(yield* failure(speechKit.getOperation(bad)), "Permanent", /gRPC code 3\): no speech/)
    }).pipe(Effect.provide(SpeechKit.layerMemory((request) => ({
      pollsUntilDone: 0,
      outcome: request.uri.endsWith("bad.ogg") ? { _tag: "Failed", code: 3, message: "no speech" } : undefined
    })))))
})
