/**
 * The worker: the Waker plus one StagePool per stage, as one Layer. Shutdown is closing that Layer's scope
 * (NodeRuntime.runMain interrupts the main fiber on SIGINT/SIGTERM): pools stop claiming, drain within the
 * grace period, interrupt and release the rest; then the listener and the database pool close.
 */
import { Config, Context, Duration, Effect, Either, Layer } from "effect"
import * as ConfigError from "effect/ConfigError"
import * as Os from "node:os"
import * as Stage from "./Stage.js"
import * as StageControl from "./StageControl.js"
import * as StagePool from "./StagePool.js"
import * as Waker from "./Waker.js"
import type * as Queue from "../queue/Queue.js"

export interface WorkerOptions {
  readonly workerId: string
  readonly shutdownGrace: Duration.Duration
  readonly sweepInterval: Duration.Duration
  readonly pollInterval: Duration.Duration
  /** Per-stage concurrency overrides by stage name. */
  readonly concurrency: Readonly<Record<string, number>>
}

export class WorkerInfo extends Context.Tag("pgfiber/WorkerInfo")<WorkerInfo, {
  readonly workerId: string
  readonly stages: ReadonlyArray<{ readonly name: string; readonly concurrency: number }>
  readonly startedAt: Date
  /** Each pool's live state, for /readyz. A stage missing here has no running pool. */
  readonly pools: Effect.Effect<ReadonlyArray<StagePool.PoolHealth>>
}>() {}

export const defaultWorkerId = () => `${Os.hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 8)}`

const positiveMillis = (name: string, fallback: number) =>
  Config.integer(name).pipe(
    Config.validate({ message: "must be a positive number of milliseconds", validation: (n) => n > 0 }),
    Config.withDefault(fallback),
    Config.map(Duration.millis)
  )

/** `PGFIBER_CONCURRENCY=extract_audio=2,analyze=8` overrides stages' own concurrency. */
const concurrencyOverrides = Config.string("PGFIBER_CONCURRENCY").pipe(
  Config.mapOrFail((text) => {
    const out: Record<string, number> = {}
    for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
      const [name, value] = part.split("=")
      const n = Number(value)
      if (!name || !Number.isInteger(n) || n < 1 || n > 10_000) {
        return Either.left(
          ConfigError.InvalidData([], `"${part}" is not stage=N with N a whole number from 1 to 10000`)
        )
      }
      out[name.trim()] = n
    }
    return Either.right(out)
  }),
  Config.withDefault({} as Record<string, number>)
)

export const config: Config.Config<WorkerOptions> = Config.all({
  workerId: Config.string("WORKER_ID").pipe(Config.withDefault("")),
  shutdownGrace: positiveMillis("SHUTDOWN_GRACE_MS", 25_000),
  sweepInterval: positiveMillis("SWEEP_INTERVAL_MS", 60_000),
  pollInterval: positiveMillis("POLL_INTERVAL_MS", 2_000),
  concurrency: concurrencyOverrides
}).pipe(Config.map((c) => ({ ...c, workerId: c.workerId || defaultWorkerId() })))

export const defaults = (): WorkerOptions => ({
  workerId: defaultWorkerId(),
  shutdownGrace: Duration.seconds(25),
  sweepInterval: Duration.seconds(60),
  pollInterval: Duration.seconds(2),
  concurrency: {}
})

/** The stages' pools plus the Waker, as one Layer. */
export const layer = <const Stages extends ReadonlyArray<Stage.Any>>(
  stages: Stages,
  options: WorkerOptions
): Layer.Layer<Waker.Waker | WorkerInfo, never, Queue.Queue | Stage.Requirements<Stages[number]>> => {
  const health = new Map<string, StagePool.PoolHealth>()
  const pools = Layer.scopedDiscard(
    Effect.gen(function*() {
      // operators' pause, heard through the Waker's LISTEN connection (one read per change)
      const control = yield* StageControl.make
      yield* Effect.forEach(stages, (stage) =>
        StagePool.scoped(stage, {
          workerId: options.workerId,
          shutdownGrace: options.shutdownGrace,
          concurrency: options.concurrency[stage.name],
          health,
          control
        }), { discard: true })
    })
  )
  const info = Layer.sync(WorkerInfo, () => ({
    workerId: options.workerId,
    stages: stages.map((s) => ({ name: s.name, concurrency: options.concurrency[s.name] ?? s.concurrency })),
    startedAt: new Date(),
    pools: Effect.sync(() => [...health.values()].map((h) => ({ ...h })))
  }))
  return Layer.mergeAll(pools, info).pipe(
    Layer.provideMerge(Waker.layer({ sweepInterval: options.sweepInterval, pollInterval: options.pollInterval }))
  ) as Layer.Layer<Waker.Waker | WorkerInfo, never, Queue.Queue | Stage.Requirements<Stages[number]>>
}
