/**
 * The application's composition: which stages exist, the Layers they need, and the Layers that run them
 * against Postgres. `main.ts` (the CLI) picks what to launch; tests and the bench compose the same pieces.
 *
 * Stages come in pipelines. A pipeline whose outside service is not configured (no SpeechKit credentials,
 * no TRANSCRIBE_URL) is not started, with a warning: its jobs wait in the queue, nothing is lost, and
 * another process that has the configuration can run them. Naming such a stage explicitly fails start-up.
 */
import { Config, Effect, Layer, Option } from "effect"
import type * as ServerModule from "./http/Server.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Migrations from "pgfiber/internal/queue/Migrations.js"
import * as PgQueue from "pgfiber/internal/queue/PgQueue.js"
import * as PgSchedules from "pgfiber/internal/queue/PgSchedules.js"
import type * as Queue from "pgfiber/internal/queue/Queue.js"
import type * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as Events from "pgfiber/internal/runtime/Events.js"
import * as MinuteStats from "pgfiber/internal/runtime/MinuteStats.js"
import * as Scheduler from "pgfiber/internal/runtime/Scheduler.js"
import type * as Stage from "pgfiber/internal/runtime/Stage.js"
import type * as Waker from "pgfiber/internal/runtime/Waker.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import { callLayers, callStages, type CallRequirements } from "@pgfiber/media/internal/stages/calls/index.js"
import { documentLayers, documentStages, DocumentsSweep } from "@pgfiber/media/internal/stages/documents/index.js"
import * as Housekeeping from "pgfiber/internal/stages/housekeeping/Housekeeping.js"
import * as WebhookDelivery from "./stages/webhooks/Delivery.js"

/** What any stage may need from the outside world; each pipeline's layer provides its part. */
export type StageRequirements = CallRequirements | Stage.Requirements<(typeof documentStages)[number]>
type AnyStage = Stage.Stage<any, any, StageRequirements, any>

/** The outside services the pipelines' layers provide, all of them together (Db comes from the service). */
export type PipelineServices = Exclude<StageRequirements, Db.Db>

/** What building a pipeline's layer may fail with (its configuration, its clients' set-up). */
export type PipelineError = Layer.Layer.Error<typeof callLayers> | Layer.Layer.Error<typeof documentLayers>

/**
 * A pipeline's outside services, built from configuration alone (it requires nothing). Which of PipelineServices it
 * provides is its stages' business: a Layer's output is contravariant, so `never` here admits a layer of any output;
 * `pipelineServices` says what the selected ones provide together.
 */
export type PipelineLayer = Layer.Layer<never, PipelineError>

export interface Pipeline {
  readonly name: string
  readonly stages: ReadonlyArray<AnyStage>
  /** The pipeline's outside services, from configuration (Db and Queue come from the service). */
  readonly layer: PipelineLayer
  /** The configuration it cannot run without, when that is missing; undefined when it can run. */
  readonly missing: Effect.Effect<string | undefined>
  /** Work to do once the queue is up. */
  readonly onStart: Effect.Effect<void, unknown, Queue.Queue | Db.Db>
  /** The pipeline's recurring jobs, declared in code and upserted at start-up (see Scheduler.ts). */
  readonly schedules: Effect.Effect<ReadonlyArray<Schedules.ScheduleSpec>, unknown>
}

const isSet = (name: string) =>
  Config.option(Config.nonEmptyString(name)).pipe(Effect.map(Option.isSome), Effect.orElseSucceed(() => false))

export const pipelines: ReadonlyArray<Pipeline> = [
  {
    name: "calls",
    stages: callStages,
    layer: callLayers,
    missing: Effect.map(
      Effect.all([isSet("SPEECHKIT_API_KEY"), isSet("SPEECHKIT_IAM_TOKEN")]),
      ([key, token]) => (key || token ? undefined : "SPEECHKIT_API_KEY or SPEECHKIT_IAM_TOKEN")
    ),
    onStart: Effect.void,
    schedules: Effect.succeed([])
  },
  {
    name: "documents",
    stages: documentStages,
    layer: documentLayers,
    missing: Effect.map(isSet("TRANSCRIBE_URL"), (set) => (set ? undefined : "TRANSCRIBE_URL")),
    onStart: Effect.void,
    schedules: DocumentsSweep.scheduleFromConfig
  },
  {
    // the queue's own upkeep: always runs
    name: "housekeeping",
    stages: [Housekeeping.housekeeping],
    layer: Layer.empty,
    missing: Effect.succeed(undefined),
    onStart: Effect.void,
    schedules: Effect.succeed(Housekeeping.schedules)
  },
  {
    // webhook deliveries (docs/events.md): always runs; a delivery needs nothing but the database and the network
    name: "webhooks",
    stages: [WebhookDelivery.delivery],
    layer: Layer.empty,
    missing: Effect.succeed(undefined),
    onStart: Effect.void,
    schedules: Effect.succeed([])
  }
]

/** Every stage this build knows; enqueueing to any other stage name is refused. */
export const stages: ReadonlyArray<AnyStage> = pipelines.flatMap((p) => p.stages)

export const stageNames = () => stages.map((s) => s.name)

/** Postgres (DATABASE_URL, or embedded), migrated before anything else uses it. */
export const layerDb = Layer.effectDiscard(Migrations.migrate().pipe(
  Effect.tap((r) => r.applied.length > 0 ? Effect.logInfo(`migrations applied: ${r.applied.join(", ")}`) : Effect.void)
)).pipe(Layer.provideMerge(Db.layer))

/** The queue, plus the process's job-events bus (Events.ts) that it and the worker publish to. */
/**
 * The stages' own retention (`retain`), for the queue: it applies them to what it finishes itself (a cancelled
 * queued job); the default comes from PGFIBER_RETAIN_COMPLETED.
 */
export const retentionOf = (list: ReadonlyArray<Stage.Any>) => ({
  stages: Object.fromEntries(list.flatMap((s) => (s.retain === undefined ? [] : [[s.name, s.retain] as const])))
})

export const layerQueue = PgQueue.layer({ knownStages: stageNames(), retention: retentionOf(stages) }).pipe(
  Layer.provideMerge(Layer.merge(layerDb, Events.layer()))
)

export interface Selection {
  readonly stages: ReadonlyArray<AnyStage>
  readonly pipelines: ReadonlyArray<Pipeline>
}

/**
 * The stages to run here: those named (`--stages a,b`), or all whose pipeline is configured. A named stage
 * whose pipeline is not configured, or an unknown name, fails start-up with the reason.
 */
export const selectStages = (names: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const unknown = names.filter((n) => !stages.some((s) => s.name === n))
    if (unknown.length > 0) {
      return yield* Effect.fail(`unknown stage(s): ${unknown.join(", ")}; known: ${stageNames().join(", ")}`)
    }
    const chosen: Array<Pipeline> = []
    const selected: Array<AnyStage> = []
    for (const pipeline of pipelines) {
      const wanted = names.length === 0 ? pipeline.stages : pipeline.stages.filter((s) => names.includes(s.name))
      if (wanted.length === 0) continue
      const missing = yield* pipeline.missing
      if (missing !== undefined) {
        if (names.length > 0) {
          return yield* Effect.fail(`${wanted.map((s) => s.name).join(", ")} cannot run: set ${missing}`)
        }
        yield* Effect.logWarning(
          `the ${pipeline.name} pipeline is not started: ${missing} is not set (its jobs wait in the queue)`
        )
        continue
      }
      chosen.push(pipeline)
      selected.push(...wanted)
    }
    return { stages: selected, pipelines: chosen } satisfies Selection
  })

/**
 * The selected pipelines' outside services, merged: what the selected stages need, since a stage is selected only
 * with its pipeline (`selectStages`) and a pipeline's layer provides what its stages need.
 */
export const pipelineServices = (selection: Selection): Layer.Layer<PipelineServices, PipelineError> =>
  // the selection is made at run time, so the types cannot follow it: this line states what it guarantees
  Layer.mergeAll(Layer.empty, ...selection.pipelines.map((p) => p.layer)) as Layer.Layer<PipelineServices, PipelineError>

/** The selected stages' pools, their outside services, and each pipeline's start-up work. */
export const layerWorker = (
  selection: Selection
): Layer.Layer<Waker.Waker | Worker.WorkerInfo, unknown, Queue.Queue | Db.Db> => {
  const services = pipelineServices(selection)
  const onStart = Layer.effectDiscard(
    Effect.forEach(selection.pipelines, (p) =>
      p.onStart.pipe(Effect.catchAllCause((cause) => Effect.logError(`${p.name}: start-up work failed`, cause))), { discard: true })
  )
  const worker = Layer.unwrapEffect(
    Effect.map(Worker.config, (options) => Worker.layer(selection.stages, options))
  ).pipe(Layer.provide(services))
  // the schedules of the pipelines that run here; any worker fires any schedule (its job goes to the queue)
  const scheduler = Layer.unwrapEffect(
    Effect.map(Effect.forEach(selection.pipelines, (p) => p.schedules), (lists) => Scheduler.layer(lists.flat()))
  ).pipe(Layer.provide(PgSchedules.layer))
  // the per-minute counts the dashboard's charts read, from this process's job events
  const minuteStats = Layer.unwrapEffect(Effect.map(MinuteStats.config, (o) => Layer.scopedDiscard(MinuteStats.make(o))))
  return scheduler.pipe(Layer.provideMerge(worker), Layer.merge(onStart), Layer.merge(minuteStats))
}

/**
 * The HTTP API (and the dashboard it serves) for `pgfiber start`, configured by `HTTP_*` / `ADMIN_*`, its dev
 * tick limited to the selected stages; the caller provides the worker and the stages' services. The server's
 * module is loaded only here, when asked for: the HTTP API (with its Swagger page) is half of the bundle every
 * command would parse.
 */
export const layerHttp = (selection: Selection) =>
  Effect.gen(function*() {
    const Server: typeof ServerModule = yield* Effect.promise(() => import("./http/Server.js"))
    return Server.layer<StageRequirements>({
      ...(yield* Server.config),
      workerId: Worker.defaultWorkerId(),
      tickStages: selection.stages,
      tickConfig: yield* Worker.config
    })
  })
