/**
 * Spans on the hot paths (a claim, a settle, a job's run) only when someone collects them: with Effect's own
 * tracer (no exporter installed, Tracing.ts) a span is work nobody reads, and on a wake-up's path each costs
 * 0.1-0.2 ms of a cold process's time.
 */
import { Effect, type Tracer } from "effect"

/** The tracer every runtime has unless one is installed. */
export const nativeTracer: Tracer.Tracer = Effect.runSync(Effect.tracer)

/** Whether a tracer other than Effect's own is installed in this fiber's context. */
export const isTraced = Effect.map(Effect.tracer, (t) => t !== nativeTracer)

/** `Effect.withSpan`, when a tracer is installed; the effect as it is otherwise. */
export const whenTraced = (name: string, options?: Tracer.SpanOptions) =>
<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.tracerWith((t) => (t === nativeTracer ? effect : Effect.withSpan(effect, name, options)))
