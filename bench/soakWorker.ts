/**
 * A soak worker process: the real pgfiber worker (`Worker.layer` under `NodeRuntime.runMain`) with one stage whose
 * handler is an async no-op, fairness on (the stage's default) and the history kept (the default retention), and
 * (with `housekeeping`) pgfiber's housekeeping as a deployment runs it: the `pgfiber.housekeeping` stage beside it and its schedules
 * declared to the Scheduler (what `pgfiber worker` composes in App.layerWorker). Every second it tells the harness
 * its counters and how long each claim took since the last report, timed by a tracer that keeps only the
 * `Queue.claim` spans (the claim statement's round trip, as the pool waits for it).
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Context, Duration, Effect, Layer, Metric, Option, Redacted, Schedule, Schema, Tracer } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../packages/pgfiber/src/queue/PgSchedules.js"
import type * as Schedules from "../packages/pgfiber/src/queue/Schedules.js"
import * as Metrics from "../packages/pgfiber/src/runtime/Metrics.js"
import * as Scheduler from "../packages/pgfiber/src/runtime/Scheduler.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import * as Housekeeping from "../packages/pgfiber/src/stages/housekeeping/Housekeeping.js"
import { nowNs, tell } from "./lib.js"

export interface SoakWorkerConfig {
  readonly url: string
  readonly schema: string
  readonly workerId: string
  readonly stage: string
  readonly concurrency: number
  /**
   * How often the worker reports its counters (ms): well under the soak's sampling interval, or an interval's
   * completions alias (reported every second and sampled every half second, they alternated between 0 and twice
   * the rate, and the CI flatness check compared medians of that).
   */
  readonly reportMs: number
  /**
   * The `pgfiber.payload-index` schedule as an operator may change it (`pgfiber schedules add`), for short runs:
   * another cron, another `minMB`. Unset, the code's definition.
   */
  readonly payloadIndex?: { readonly cron?: string | undefined; readonly minMB?: number | undefined } | undefined
  /** Run the housekeeping stage and its schedules (the soak's default; off with `--no-housekeeping`). */
  readonly housekeeping: boolean
}

const config = JSON.parse(process.argv[2] ?? "{}") as SoakWorkerConfig

const soak = Stage.make({
  name: config.stage,
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: config.concurrency,
  handler: () => Effect.promise(() => Promise.resolve())
})

/** Claim round trips (ms) since the last report. */
let claimMs: Array<number> = []

/**
 * A tracer that records the length of every `Queue.claim` span and nothing else (the housekeeping stage's claims
 * too: a few in a run of thousands, which the p99 does not see).
 */
const claimTimer = Tracer.make({
  span: (name, parent, context, links, startTime, kind) => {
    let status: Tracer.SpanStatus = { _tag: "Started", startTime }
    const attributes = new Map<string, unknown>()
    const spanLinks = [...links]
    const span: Tracer.Span = {
      _tag: "Span",
      name,
      spanId: Math.random().toString(16).slice(2),
      traceId: Option.match(parent, { onNone: () => Math.random().toString(16).slice(2), onSome: (p) => p.traceId }),
      parent,
      context: context ?? Context.empty(),
      get status() {
        return status
      },
      attributes,
      links: spanLinks,
      sampled: true,
      kind,
      end: (endTime, exit) => {
        status = { _tag: "Ended", startTime, endTime, exit }
        if (name === "Queue.claim") claimMs.push(Number(endTime - startTime) / 1e6)
      },
      attribute: (key, value) => void attributes.set(key, value),
      event: () => undefined,
      addLinks: (more) => void spanLinks.push(...more)
    }
    return span
  },
  context: (f) => f()
})

const payloadIndex = config.payloadIndex
const housekeepingSchedules: ReadonlyArray<Schedules.ScheduleSpec> = Housekeeping.schedules.map((s) =>
  s.name !== "pgfiber.payload-index" || payloadIndex === undefined ? s : {
    ...s,
    cron: payloadIndex.cron ?? s.cron,
    payload: payloadIndex.minMB === undefined ? s.payload : { task: "payload-index", minMB: payloadIndex.minMB }
  }
)

const counter = (m: Metric.Metric.Counter<number>) =>
  Effect.map(Metric.value(Metrics.forStage(m, config.stage)), (s) => s.count)

const report = Effect.gen(function*() {
  const [claimed, completed, fenced] = [yield* counter(Metrics.claimed), yield* counter(Metrics.completed), yield* counter(Metrics.fenced)]
  const ms = claimMs
  claimMs = []
  tell({ t: "claims", ms })
  tell({ t: "metrics", claimed, completed, fenced })
})

const reportCounters = Layer.scopedDiscard(
  Effect.zipRight(
    Effect.sync(() => tell({ t: "ready", at: nowNs() })),
    Effect.forkScoped(Effect.repeat(report, Schedule.spaced(Duration.millis(config.reportMs))))
  )
)

tell({ t: "starting", at: nowNs() })
Layer.launch(
  reportCounters.pipe(
    Layer.provideMerge(config.housekeeping ? Scheduler.layer(housekeepingSchedules).pipe(Layer.provide(PgSchedules.layer)) : Layer.empty),
    Layer.provideMerge(Worker.layer(config.housekeeping ? [soak, Housekeeping.housekeeping] : [soak], { ...Worker.defaults(), workerId: config.workerId, shutdownGrace: Duration.seconds(5) })),
    Layer.provide(PgQueue.layer({ knownStages: [config.stage, Housekeeping.stageName] })),
    Layer.provideMerge(Db.layerWith({ url: Redacted.make(config.url), schema: config.schema, poolMax: 10, applicationName: config.workerId }))
  )
).pipe(
  Effect.ensuring(report),
  Effect.withTracer(claimTimer),
  NodeRuntime.runMain
)
