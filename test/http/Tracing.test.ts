/**
 * OTEL_EXPORTER_OTLP_ENDPOINT set: spans go out over OTLP/HTTP to `<endpoint>/v1/traces` (here a loopback
 * collector that records what it receives). Unset: no exporter, nothing sent.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Layer } from "effect"
import * as Http from "node:http"
import * as Tracing from "../../packages/service/src/layers/Tracing.js"

const collector = Effect.acquireRelease(
  Effect.async<{ url: string; bodies: Array<{ path: string; body: string }>; close: () => void }>((resume) => {
    const bodies: Array<{ path: string; body: string }> = []
    const server = Http.createServer((req, res) => {
      let body = ""
      req.on("data", (d) => (body += d))
      req.on("end", () => {
        bodies.push({ path: req.url ?? "", body })
        res.writeHead(200, { "content-type": "application/json" }).end("{}")
      })
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as { port: number }).port
      resume(Effect.succeed({ url: `http://127.0.0.1:${port}`, bodies, close: () => server.close() }))
    })
  }),
  (c) => Effect.sync(() => c.close())
)

const withEnv = (env: Record<string, string>) => Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

describe("tracing", () => {
  it.live("exports spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set", () =>
    Effect.gen(function*() {
      const otlp = yield* collector
      // the tracer is installed for effects run inside the layer; closing it flushes the spans
      yield* Effect.void.pipe(
        Effect.withSpan("Queue.claim", { attributes: { stage: "demo" } }),
        Effect.provide(Tracing.layer.pipe(Layer.provide(withEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_SERVICE_NAME: "pgfiber-test" }))))
      )
      for (let i = 0; i < 100 && !otlp.bodies.some((b) => b.body.includes("Queue.claim")); i++) yield* Effect.sleep("50 millis")
      const sent = otlp.bodies.find((b) => b.body.includes("Queue.claim"))
      expect(sent?.path).toBe("/v1/traces")
      expect(sent?.body).toContain("pgfiber-test")
    }).pipe(Effect.scoped))

  it.effect("builds nothing when the endpoint is unset, and refuses a non-URL", () =>
    Effect.gen(function*() {
      yield* Effect.scoped(Layer.build(Tracing.layer.pipe(Layer.provide(withEnv({})))))
      const bad = yield* Effect.either(
        Effect.scoped(Layer.build(Tracing.layer.pipe(Layer.provide(withEnv({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" })))))
      )
      expect(bad._tag === "Left" && String(bad.left)).toContain("OTEL_EXPORTER_OTLP_ENDPOINT")
    }))
})
