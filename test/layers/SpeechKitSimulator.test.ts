/**
 * The simulator's own contract checks, driven with raw HTTP on loopback: if a check here is lax, the
 * client tests that rely on it prove nothing.
 */
import * as FetchHttpClient from "@effect/platform/FetchHttpClient"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Either, Option, Ref } from "effect"
import { execFileSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Url from "node:url"
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

const stereo7s = oggOpus(7, 2)
const notOgg = new TextEncoder().encode("RIFF....WAVEfmt this is not ogg opus")

/** A loopback file server for the audio the simulator downloads; records the urls it was asked for. */
const serveFiles = (files: Record<string, Uint8Array>) =>
  Effect.gen(function*() {
    const seen = yield* Ref.make<ReadonlyArray<string>>([])
    const server = yield* NodeHttpServer.make(() => Http.createServer(), { host: "127.0.0.1", port: 0 }).pipe(Effect.orDie)
    yield* server.serve(HttpRouter.empty.pipe(
      HttpRouter.get(
        "/audio/:name",
        Effect.gen(function*() {
          const request = yield* HttpServerRequest.HttpServerRequest
          yield* Ref.update(seen, (urls) => [...urls, request.url])
          const { name } = yield* HttpRouter.params
          const bytes = name === undefined ? undefined : files[name]
          return bytes === undefined ? HttpServerResponse.empty({ status: 404 }) : HttpServerResponse.uint8Array(bytes)
        })
      )
    ))
    const address = server.address
    assert(address._tag === "TcpAddress")
    return { url: `http://127.0.0.1:${address.port}/audio`, seen: Ref.get(seen) }
  })

const apiKey = "sim-test-api-key"

const startSimulator = (options: SpeechKitSimulator.Options = {}) =>
  SpeechKitSimulator.make({ apiKey, ...options }).pipe(Effect.provide(FetchHttpClient.layer))

const validBody = (uri: string, extra: Record<string, unknown> = {}) => ({
  uri,
  recognitionModel: {
    model: "general",
    audioFormat: { containerAudio: { containerAudioType: "OGG_OPUS" } },
    textNormalization: { textNormalization: "TEXT_NORMALIZATION_ENABLED" },
    languageRestriction: { restrictionType: "WHITELIST", languageCode: ["ru-RU"] },
    audioProcessingType: "FULL_DATA"
  },
  ...extra
})

/** One raw call; answers status, headers and the body text. */
const call = (request: HttpClientRequest.HttpClientRequest) =>
  Effect.gen(function*() {
    const client = yield* HttpClient.HttpClient
    const response = yield* client.execute(request)
    return { status: response.status, headers: response.headers, text: yield* response.text }
  }).pipe(Effect.provide(FetchHttpClient.layer), Effect.orDie)

const withKey = HttpClientRequest.setHeader("authorization", `Api-Key ${apiKey}`)

const start = (base: string, body: unknown, auth = withKey) =>
  call(HttpClientRequest.post(`${base}/stt/v3/recognizeFileAsync`).pipe(HttpClientRequest.bodyUnsafeJson(body), auth))

const poll = (base: string, id: string, auth = withKey) => call(HttpClientRequest.get(`${base}/operations/${id}`).pipe(auth))

const results = (base: string, id: string, auth = withKey) =>
  call(HttpClientRequest.get(`${base}/stt/v3/getRecognition`, { urlParams: { operationId: id } }).pipe(auth))

const json = (text: string) => JSON.parse(text) as Record<string, any>

// ---------------------------------------------------------------------------------------------

describe("SpeechKitSimulator", () => {
  it.scoped("runs an operation: Operation JSON, done after the configured polls, result lines in the docs' shape", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator({ pollsUntilDone: 2 })

      const started = yield* start(sim.url, validBody(`${files.url}/call.ogg`))
      assert.strictEqual(started.status, 200, started.text)
      assert.strictEqual(started.headers["x-pgfiber-simulator"], "1")
      const operation = json(started.text)
      assert.strictEqual(operation.done, false)
      assert.match(operation.id, /^sim\d{17}$/)
      assert.strictEqual(operation.createdBy, "pgfiber-simulator")

      // Not ready yet: results are withheld.
      assert.strictEqual((yield* results(sim.url, operation.id)).status, 404)
      assert.deepStrictEqual(
        [(yield* poll(sim.url, operation.id)), (yield* poll(sim.url, operation.id)), (yield* poll(sim.url, operation.id))]
          .map((r) => json(r.text).done),
        [false, false, true]
      )

      const body = yield* results(sim.url, operation.id)
      assert.strictEqual(body.status, 200)
      const lines = body.text.trim().split("\n").map(json)
      assert.isTrue(lines.every((line) => "result" in line), "every line is wrapped in {result}")
      const finals = lines.filter((l) => l.result.final).map((l) => l.result)
      // 7 s of stereo in 5 s utterances: two per channel.
      assert.deepStrictEqual(
        finals.map((f) => [f.channelTag, f.audioCursors.finalIndex, f.final.alternatives[0].startTimeMs, f.final.alternatives[0].endTimeMs]),
        [["0", "0", "0", "5000"], ["1", "0", "0", "5000"], ["0", "1", "5000", "7000"], ["1", "1", "5000", "7000"]]
      )
      assert.strictEqual(finals[0].final.alternatives[0].text, "simulated utterance 1 on channel 0")
      assert.deepStrictEqual(finals[0].final.alternatives[0].languages, [{ languageCode: "ru-RU", probability: 1 }])
      const refinements = lines.filter((l) => l.result.finalRefinement).map((l) => l.result.finalRefinement)
      assert.strictEqual(refinements.length, 4)
      assert.strictEqual(refinements[0].normalizedText.alternatives[0].text, "Simulated utterance 1 on channel 0.")
      assert.isTrue(lines.some((l) => l.result.partial) && lines.some((l) => l.result.eouUpdate))

      assert.deepStrictEqual(
        [yield* sim.count("recognizeFileAsync"), yield* sim.count("getOperation"), yield* sim.count("getRecognition")],
        [1, 3, 2]
      )
      const last = Option.getOrThrow(yield* sim.lastRequest("recognizeFileAsync"))
      assert.strictEqual(last.headers["authorization"], `Api-Key ${apiKey}`)
      assert.deepStrictEqual(last.body, validBody(`${files.url}/call.ogg`))
    }))

  it.scoped("sends finalRefinement only when the request enabled normalization", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator({ pollsUntilDone: 0 })
      const body = validBody(`${files.url}/call.ogg`)
      const { textNormalization: _, ...model } = body.recognitionModel
      const id = json((yield* start(sim.url, { ...body, recognitionModel: model })).text).id
      yield* poll(sim.url, id)
      const lines = (yield* results(sim.url, id)).text.trim().split("\n").map(json)
      assert.isTrue(lines.some((l) => l.result.final))
      assert.isFalse(lines.some((l) => l.result.finalRefinement))
    }))

  it.scoped("checks the Authorization header: missing, wrong key, wrong scheme → 401; scheme is case-insensitive", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator({ iamToken: "iam-token" })
      const uri = `${files.url}/call.ogg`
      const as = (value: string) => HttpClientRequest.setHeader("authorization", value)

      const missing = yield* start(sim.url, validBody(uri), (r) => r)
      assert.strictEqual(missing.status, 401)
      assert.strictEqual(json(missing.text).code, 16)
      assert.strictEqual((yield* start(sim.url, validBody(uri), as("Api-Key wrong"))).status, 401)
      assert.strictEqual((yield* start(sim.url, validBody(uri), as(`Token ${apiKey}`))).status, 401)
      assert.strictEqual((yield* start(sim.url, validBody(uri), as(`Bearer ${apiKey}`))).status, 401)
      assert.strictEqual((yield* start(sim.url, validBody(uri), as(`Api-key ${apiKey}`))).status, 200)
      assert.strictEqual((yield* start(sim.url, validBody(uri), as("Bearer iam-token"))).status, 200)
      assert.strictEqual((yield* poll(sim.url, "sim00000000000000001", (r) => r)).status, 401)
    }))

  it.scoped("requires x-folder-id on the stt routes when a folder is configured", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator({ folderId: "b1gfolder" })
      const uri = `${files.url}/call.ogg`
      const folder = (id: string) => (r: HttpClientRequest.HttpClientRequest) => withKey(HttpClientRequest.setHeader(r, "x-folder-id", id))

      assert.strictEqual((yield* start(sim.url, validBody(uri))).status, 401)
      assert.strictEqual((yield* start(sim.url, validBody(uri), folder("b1gother"))).status, 403)
      const ok = yield* start(sim.url, validBody(uri), folder("b1gfolder"))
      assert.strictEqual(ok.status, 200)
      // The operation service is not SpeechKit's: no folder there.
      assert.strictEqual((yield* poll(sim.url, json(ok.text).id)).status, 200)
      assert.strictEqual((yield* results(sim.url, json(ok.text).id)).status, 401)
    }))

  it.scoped("rejects malformed RecognizeFileRequests with 400 before any work", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator()
      const uri = `${files.url}/call.ogg`
      const body = validBody(uri)
      const model = body.recognitionModel
      const bad: ReadonlyArray<[string, unknown]> = [
        ["both uri and content", { ...body, content: "T2dnUw==" }],
        ["neither uri nor content", { recognitionModel: model }],
        ["WAV", { ...body, recognitionModel: { ...model, audioFormat: { containerAudio: { containerAudioType: "WAV" } } } }],
        ["no audio format", { ...body, recognitionModel: { ...model, audioFormat: undefined } }],
        ["implausible language", { ...body, recognitionModel: { ...model, languageRestriction: { restrictionType: "WHITELIST", languageCode: ["russian"] } } }],
        ["no restriction type", { ...body, recognitionModel: { ...model, languageRestriction: { languageCode: ["ru-RU"] } } }],
        ["unknown model", { ...body, recognitionModel: { ...model, model: "whisper" } }],
        ["unknown field", { ...body, recognitionModel: { ...model, langauge: "ru-RU" } }],
        ["bad enum", { ...body, recognitionModel: { ...model, audioProcessingType: "BATCH" } }],
        ["ftp uri", { ...body, uri: "ftp://127.0.0.1/call.ogg" }],
        ["file uri without allowFileUris", { ...body, uri: "file:///tmp/call.ogg" }]
      ]
      for (const [label, request] of bad) {
        const answer = yield* start(sim.url, request)
        assert.strictEqual(answer.status, 400, `${label}: ${answer.text}`)
        assert.strictEqual(json(answer.text).code, 3, label)
      }
      const notJson = yield* call(
        HttpClientRequest.post(`${sim.url}/stt/v3/recognizeFileAsync`).pipe(HttpClientRequest.bodyText("uri=x"), withKey)
      )
      assert.strictEqual(notJson.status, 400)
      assert.strictEqual(yield* sim.count("recognizeFileAsync"), bad.length + 1)
      // protojson takes proto field names too, as the docs' curl example sends them.
      const snake = yield* start(sim.url, {
        uri,
        recognition_model: { model: "general", audio_format: { container_audio: { container_audio_type: "OGG_OPUS" } } }
      })
      assert.strictEqual(snake.status, 200, snake.text)
    }))

  it.scoped("fails the operation, like SpeechKit, when the audio is not OGG Opus or cannot be downloaded", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.wav": notOgg })
      const sim = yield* startSimulator({ pollsUntilDone: 0 })
      for (const [name, reason] of [["call.wav", /not an OGG stream/], ["missing.ogg", /HTTP 404/]] as const) {
        const started = yield* start(sim.url, validBody(`${files.url}/${name}`))
        assert.strictEqual(started.status, 200, "accepted: the download happens in the operation")
        const done = json((yield* poll(sim.url, json(started.text).id)).text)
        assert.strictEqual(done.done, true)
        assert.strictEqual(done.error.code, 3)
        assert.match(done.error.message, reason)
        const recognition = yield* results(sim.url, done.id)
        assert.strictEqual(recognition.status, 400)
      }
    }))

  it.scoped("checks OpusHead, not just OggS; accepts base64 content and (opted in) file: uris", () =>
    Effect.gen(function*() {
      const sim = yield* startSimulator({ pollsUntilDone: 0, allowFileUris: true })
      const oggVorbis = new Uint8Array([...new TextEncoder().encode("OggS"), ...new Uint8Array(24), ...new TextEncoder().encode("\x01vorbis")])
      const { uri: _, ...withoutUri } = validBody("")
      const content = (bytes: Uint8Array) => ({ ...withoutUri, content: Buffer.from(bytes).toString("base64") })

      const vorbis = json((yield* start(sim.url, content(oggVorbis))).text)
      assert.match(json((yield* poll(sim.url, vorbis.id)).text).error.message, /not Opus/)

      const inline = json((yield* start(sim.url, content(stereo7s))).text)
      assert.isUndefined(json((yield* poll(sim.url, inline.id)).text).error)

      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "speechkit-sim-"))
      const file = Path.join(dir, "call.ogg")
      Fs.writeFileSync(file, stereo7s)
      const local = json((yield* start(sim.url, validBody(Url.pathToFileURL(file).href))).text)
      assert.isUndefined(json((yield* poll(sim.url, local.id)).text).error)
      Fs.rmSync(dir, { recursive: true })
    }))

  it.scoped("drops the uri's query when downloading, as SpeechKit ignores it", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator()
      yield* start(sim.url, validBody(`${files.url}/call.ogg?X-Amz-Signature=secret#frag`))
      assert.deepStrictEqual(yield* files.seen, ["/audio/call.ogg"])
    }))

  it.scoped("plays a route's fault script in order, after the contract checks, then passes", () =>
    Effect.gen(function*() {
      const files = yield* serveFiles({ "call.ogg": stereo7s })
      const sim = yield* startSimulator({
        faults: { recognizeFileAsync: [{ status: 429, headers: { "retry-after": "2" } }, { status: 503 }, "pass", { status: 400 }] }
      })
      const uri = `${files.url}/call.ogg`
      // An unauthenticated request does not consume the script.
      assert.strictEqual((yield* start(sim.url, validBody(uri), (r) => r)).status, 401)
      const answers = [
        yield* start(sim.url, validBody(uri)),
        yield* start(sim.url, validBody(uri)),
        yield* start(sim.url, validBody(uri)),
        yield* start(sim.url, validBody(uri)),
        yield* start(sim.url, validBody(uri))
      ]
      assert.deepStrictEqual(answers.map((a) => a.status), [429, 503, 200, 400, 200])
      assert.strictEqual(answers[0]!.headers["retry-after"], "2")
      assert.strictEqual(json(answers[0]!.text).code, 8)
      assert.strictEqual(json(answers[1]!.text).code, 14)
      assert.isTrue(answers.every((a) => a.headers["x-pgfiber-simulator"] === "1"))

      yield* sim.scriptFaults("getOperation", [{ status: 200, body: "<html>gateway</html>" }])
      const mangled = yield* poll(sim.url, json(answers[2]!.text).id)
      assert.deepStrictEqual([mangled.status, mangled.text], [200, "<html>gateway</html>"])
      assert.strictEqual(yield* sim.count("recognizeFileAsync"), 6)
    }))

  it.scoped("answers unknown operations and routes with 404", () =>
    Effect.gen(function*() {
      const sim = yield* startSimulator()
      const unknown = yield* poll(sim.url, "nope")
      assert.deepStrictEqual([unknown.status, json(unknown.text).code], [404, 5])
      assert.strictEqual((yield* results(sim.url, "nope")).status, 404)
      const noRoute = yield* call(HttpClientRequest.get(`${sim.url}/stt/v2/longRunningRecognize`).pipe(withKey))
      assert.deepStrictEqual([noRoute.status, noRoute.headers["x-pgfiber-simulator"]], [404, "1"])
      const noId = yield* call(HttpClientRequest.get(`${sim.url}/stt/v3/getRecognition`).pipe(withKey))
      assert.strictEqual(noId.status, 400)
    }))

  it("reads channels and duration from the Ogg pages", () => {
    const info = SpeechKitSimulator.inspectOggOpus(oggOpus(2, 1))
    assert(Either.isRight(info))
    assert.strictEqual(info.right.channels, 1)
    assert.approximately(info.right.durationMs, 2000, 30)
    assert.isTrue(Either.isLeft(SpeechKitSimulator.inspectOggOpus(notOgg)))
  })
})
