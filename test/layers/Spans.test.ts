/**
 * Spans on the hot paths only when a tracer is installed: with one, `whenTraced` opens the span (what an OTLP
 * exporter sends); with Effect's own, the effect runs as it is, in no span.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Option, Tracer } from "effect"
import * as Spans from "../../packages/pgfiber/src/layers/Spans.js"

const spanName = Effect.map(Effect.option(Effect.currentSpan), Option.map((s) => s.name))

describe("Spans.whenTraced", () => {
  it.effect("opens the span when a tracer is installed", () =>
    Effect.gen(function*() {
      const started: Array<string> = []
      const recording = Tracer.make({
        span: (name, parent, context, links, startTime, kind, options) => {
          started.push(name)
          return Spans.nativeTracer.span(name, parent, context, links, startTime, kind, options)
        },
        context: (f) => f()
      })
      const inside = yield* spanName.pipe(Spans.whenTraced("Queue.claim"), Effect.withTracer(recording))
      expect(inside).toEqual(Option.some("Queue.claim"))
      expect(started).toEqual(["Queue.claim"])
      expect(yield* Effect.withTracer(Spans.isTraced, recording)).toBe(true)
    }))

  it.effect("runs the effect in no span under Effect's own tracer", () =>
    Effect.gen(function*() {
      expect(yield* spanName.pipe(Spans.whenTraced("Queue.claim"))).toEqual(Option.none())
      expect(yield* Spans.isTraced).toBe(false)
    }))
})
