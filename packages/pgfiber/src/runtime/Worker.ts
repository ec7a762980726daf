/**
 * The worker: a runtime per process (the Waker, its one LISTEN connection, stage control) and one StagePool per
 * stage, each stage a Layer of its own on that runtime (`stage`, `runtime`; `layer` composes a list). Shutdown is
 * closing the Layer's scope
 * (NodeRuntime.runMain interrupts the main fiber on SIGINT/SIGTERM): pools stop claiming, drain within the
 * grace period, interrupt and release the rest; then the listener and the database pool close.
 */
import { Config, Context, Duration, Effect, Either, Layer } from "effect"
import * as ConfigError from "effect/ConfigError"
import * as Os from "node:os"
import * as Limits from "../queue/Limits.js"
import * as Stage from "./Stage.js"
import * as StageControl from "./StageControl.js"
import * as StageRegistry from "./StageRegistry.js"
import * as Millis from "../layers/Millis.js"
import * as StagePool from "./StagePool.js"
import * as Waker from "./Waker.js"
import * as Queue from "../queue/Queue.js"

export interface WorkerOptions {
  readonly workerId: string
  readonly shutdownGrace: Duration.Duration
  readonly sweepInterval: Duration.Duration
  readonly pollInterval: Duration.Duration
  /** Per-stage concurrency overrides by stage name. */
  readonly concurrency: Readonly<Record<string, number>>
  /** Per-stage limits from configuration, over the stages' own (run-time overrides apply over both). */
  readonly limits?: Readonly<Record<string, Partial<Limits.Override>>> | undefined
}

export class WorkerInfo extends Context.Tag("pgfiber/WorkerInfo")<WorkerInfo, {
  readonly workerId: string
  readonly stages: ReadonlyArray<{ readonly name: string; readonly concurrency: number }>
  readonly startedAt: Date
  /** Each pool's live state, for /readyz. A stage missing here has no running pool. */
  readonly pools: Effect.Effect<ReadonlyArray<StagePool.PoolHealth>>
}>() {}

export const defaultWorkerId = () => `${Os.hostname()}:${process.pid}:${Math.random().toString(36).slice(2, 8)}`

/** `stage=value,stage=value`, the shape of every per-stage setting; each value parsed by `parse`. */
const perStage = <A>(name: string, expected: string, parse: (value: string) => A | undefined) =>
  Config.string(name).pipe(
    Config.mapOrFail((text) => {
      const out: Record<string, A> = {}
      for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
        const at = part.indexOf("=")
        const stage = at > 0 ? part.slice(0, at).trim() : ""
        const value = at > 0 ? parse(part.slice(at + 1).trim()) : undefined
        if (!stage || value === undefined) return Either.left(ConfigError.InvalidData([name], `"${part}" is not stage=${expected}`))
        out[stage] = value
      }
      return Either.right(out)
    }),
    Config.withDefault({} as Record<string, A>)
  )

const wholeNumber = (min: number) => (v: string) => {
  const n = Number(v)
  return Number.isInteger(n) && n >= min && n <= 10_000_000 ? n : undefined
}
const rate = (v: string) => {
  const r = Limits.parseRate(v)
  return Either.isRight(r) ? r.right : undefined
}

/** `PGFIBER_CONCURRENCY=extract_audio=2,analyze=8` overrides stages' own concurrency. */
const concurrencyOverrides = perStage("PGFIBER_CONCURRENCY", "N with N a whole number from 1 to 10000", (v) => {
  const n = wholeNumber(1)(v)
  return n !== undefined && n <= 10_000 ? n : undefined
})

/**
 * Limits in the same shape: `PGFIBER_MAX_RUNNING=transcribe_start=10`, `PGFIBER_MAX_RUNNING_PER_ORG=…=3`,
 * `PGFIBER_RATE_LIMIT=transcribe_poll=5/s` (or `PGFIBER_RATE_LIMIT_PER_ORG`, one bucket per org),
 * `PGFIBER_RATE_BURST=transcribe_poll=5`, `PGFIBER_FAIR=housekeeping=false`. 0 lifts a cap or a rate limit.
 */
const limitOverrides = Config.all({
  maxRunning: perStage("PGFIBER_MAX_RUNNING", "N (0: no cap)", wholeNumber(0)),
  maxRunningPerOrg: perStage("PGFIBER_MAX_RUNNING_PER_ORG", "N (0: no cap)", wholeNumber(0)),
  rate: perStage("PGFIBER_RATE_LIMIT", "N/period like 20/s or 500/1h (0/s: none)", (v) => (/^0\s*\//.test(v) ? null : rate(v))),
  ratePerOrg: perStage("PGFIBER_RATE_LIMIT_PER_ORG", "N/period like 5/s", rate),
  burst: perStage("PGFIBER_RATE_BURST", "N (at least 1)", wholeNumber(1)),
  fair: perStage("PGFIBER_FAIR", "true or false", (v) => (v === "true" ? true : v === "false" ? false : undefined))
}).pipe(Config.map((c) => {
  const out: Record<string, { -readonly [K in keyof Limits.Override]?: Limits.Override[K] }> = {}
  const at = (stage: string) => (out[stage] ??= {})
  for (const [stage, n] of Object.entries(c.maxRunning)) at(stage).maxRunning = n
  for (const [stage, n] of Object.entries(c.maxRunningPerOrg)) at(stage).maxRunningPerOrg = n
  for (const [stage, r] of Object.entries(c.rate)) {
    Object.assign(at(stage), r === null ? { rateLimit: 0 } : { rateLimit: r.limit, ratePerMs: r.perMs, ratePerOrg: false })
  }
  for (const [stage, r] of Object.entries(c.ratePerOrg)) Object.assign(at(stage), { rateLimit: r.limit, ratePerMs: r.perMs, ratePerOrg: true })
  for (const [stage, n] of Object.entries(c.burst)) at(stage).rateBurst = n
  for (const [stage, f] of Object.entries(c.fair)) at(stage).fair = f
  return out as Readonly<Record<string, Partial<Limits.Override>>>
}))

export const config: Config.Config<WorkerOptions> = Config.all({
  workerId: Config.string("WORKER_ID").pipe(Config.withDefault("")),
  shutdownGrace: Millis.config("SHUTDOWN_GRACE_MS", { min: 1, fallback: 25_000 }),
  sweepInterval: Millis.config("SWEEP_INTERVAL_MS", { min: 1, fallback: 60_000 }),
  pollInterval: Millis.config("POLL_INTERVAL_MS", { min: 1, fallback: 2_000 }),
  concurrency: concurrencyOverrides,
  limits: limitOverrides
}).pipe(Config.map((c) => ({ ...c, workerId: c.workerId || defaultWorkerId() })))

export const defaults = (): WorkerOptions => ({
  workerId: defaultWorkerId(),
  shutdownGrace: Duration.seconds(25),
  sweepInterval: Duration.seconds(60),
  pollInterval: Duration.seconds(2),
  concurrency: {},
  limits: {}
})

/**
 * What the stages of one process share: the options, one Waker (so one LISTEN connection), operators' stage
 * control heard through it, and the pools' health for /readyz. Built once by `runtime`; each `stage` layer
 * starts its pool on it.
 */
export class Runtime extends Context.Tag("pgfiber/WorkerRuntime")<Runtime, {
  readonly options: WorkerOptions
  readonly control: StageControl.StageControl
  readonly health: Map<string, StagePool.PoolHealth>
  /** The stages whose pools run here, in the order they started. */
  readonly stages: Array<{ readonly name: string; readonly concurrency: number }>
}>() {}

/**
 * The process's worker runtime as a Layer: the Waker (its LISTEN connection, timers, sweep), stage control and
 * WorkerInfo. Stages join it as layers of their own (`stage`). Closing it closes the stages first (they are built
 * on it), so pools drain while the listener still runs.
 */
export const runtime = (options: WorkerOptions): Layer.Layer<Runtime | Waker.Waker | WorkerInfo, never, Queue.Queue> => {
  const shared = Layer.scoped(
    Runtime,
    Effect.map(StageControl.make, (control) => ({ options, control, health: new Map(), stages: [] }))
  )
  const info = Layer.effect(
    WorkerInfo,
    Effect.map(Runtime, (rt) => ({
      workerId: options.workerId,
      stages: rt.stages,
      startedAt: new Date(),
      pools: Effect.sync(() => [...rt.health.values()].map((h) => ({ ...h })))
    }))
  )
  return info.pipe(
    Layer.provideMerge(shared),
    Layer.provideMerge(Waker.layer({ sweepInterval: options.sweepInterval, pollInterval: options.pollInterval, presence: options.workerId }))
  )
}

/**
 * One stage's pool as a Layer, on the process's `runtime`: stages are composed as layers, and each stage's own
 * services can be provided to its layer alone (`Worker.stage(sendEmail).pipe(Layer.provide(Mailer.live))`).
 * The pool claims, runs and settles for the life of the layer; closing it stops claiming, drains within the
 * shutdown grace and releases the rest. A stage name twice in one process is a defect.
 */
export const stage = <A, I, R>(
  stage: Stage.Stage<A, I, R>
): Layer.Layer<never, never, Runtime | Waker.Waker | Queue.Queue | R> =>
  Layer.scopedDiscard(
    Effect.gen(function*() {
      const rt = yield* Runtime
      if (rt.stages.some((s) => s.name === stage.name)) {
        return yield* Effect.dieMessage(`the stage ${stage.name} is composed into this worker twice`)
      }
      const concurrency = rt.options.concurrency[stage.name]
      rt.stages.push({ name: stage.name, concurrency: concurrency ?? stage.concurrency })
      yield* Effect.addFinalizer(() => Effect.sync(() => {
        const at = rt.stages.findIndex((s) => s.name === stage.name)
        if (at >= 0) rt.stages.splice(at, 1)
      }))
      // the stage registry: every operator surface learns of the stage from here; the sweep keeps the row
      // seen, and a clean shutdown (this finalizer runs after the pool drained) removes this process from it
      const queue = yield* Queue.Queue
      const presence = { workerId: rt.options.workerId, sweepMs: Duration.toMillis(rt.options.sweepInterval) }
      const registryLogs = Effect.annotateLogs({ component: "stage-registry", stage: stage.name })
      yield* queue.registry.register(presence, [StageRegistry.entry(stage, concurrency ?? stage.concurrency)]).pipe(
        Effect.catchAll((e) => Effect.logWarning("could not register the stage; operators' tools may not know it", e.message)),
        registryLogs
      )
      yield* Effect.addFinalizer(() =>
        queue.registry.unregister(presence.workerId, [stage.name]).pipe(
          Effect.catchAll((e) => Effect.logWarning("could not remove this process from the stage registry", e.message)),
          registryLogs
        )
      )
      yield* StagePool.scoped(stage, {
        workerId: rt.options.workerId,
        shutdownGrace: rt.options.shutdownGrace,
        concurrency,
        limits: rt.options.limits?.[stage.name],
        health: rt.health,
        control: rt.control
      })
    })
  )

/** The given stages' layers on one `runtime`: `stage` for each, merged, with the runtime provided. */
export const layer = <const Stages extends ReadonlyArray<Stage.Any>>(
  stages: Stages,
  options: WorkerOptions
): Layer.Layer<Waker.Waker | WorkerInfo, never, Queue.Queue | Stage.Requirements<Stages[number]>> => {
  const pools: Layer.Layer<never, never, Runtime | Waker.Waker | Queue.Queue | Stage.Requirements<Stages[number]>> =
    Layer.mergeAll(Layer.empty, ...stages.map((s) => stage(s)))
  return pools.pipe(
    Layer.provideMerge(runtime(options)),
    Layer.map((context) => Context.omit(Runtime)(context))
  )
}

/**
 * Every given stage's limits as claims see them (code, then this process's configuration, then the run-time
 * override), and any override of a stage not given: for `pgfiber limits list` and `GET /limits`.
 */
export const limitViews = (stages: ReadonlyArray<{ readonly name: string; readonly shares: Limits.Shares }>) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const configured = yield* config
    const overrides = yield* queue.limits.list
    const known = stages.map((s) => Limits.view(s.name, s.shares, configured.limits?.[s.name], overrides.get(s.name) ?? null))
    const unknown = [...overrides].filter(([name]) => !stages.some((s) => s.name === name))
      .map(([name, o]) => Limits.view(name, Limits.defaultShares, configured.limits?.[name], o))
    return [...known, ...unknown].sort((a, b) => a.stage.localeCompare(b.stage))
  })
