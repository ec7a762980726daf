/**
 * The long-running commands and their one-shot twin: `start` (HTTP API + every stage, what `npm start` runs),
 * `worker` (stages only), `migrate`, and `tick --max N` (claim and run at most N jobs in this process, then
 * exit: for cron and serverless). Shutdown is SIGINT/SIGTERM interrupting the main fiber: pools stop claiming,
 * drain within SHUTDOWN_GRACE_MS, release the rest; the HTTP server and the database pool close; exit 0.
 */
import { Command, Options } from "@effect/cli"
import { Effect, Layer } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as EmbeddedPg from "pgfiber/internal/layers/EmbeddedPg.js"
import * as Migrations from "pgfiber/internal/queue/Migrations.js"
import * as PgQueue from "pgfiber/internal/queue/PgQueue.js"
import * as PgSchedules from "pgfiber/internal/queue/PgSchedules.js"
import * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import * as Tick from "pgfiber/internal/runtime/Tick.js"
import * as Tracing from "../layers/Tracing.js"
import * as Env from "./Env.js"
import * as Output from "./Output.js"

const stagesOption = Options.text("stages").pipe(
  Options.withDescription("Comma-separated stage names to run (default: all)"),
  Options.withDefault("")
)

const runService = (stageList: string, http: boolean) =>
  Effect.gen(function*() {
    const known = yield* Env.knownStages
    const selection = yield* Env.select(known, stageList)
    const migrate = yield* Env.migrateOnStart
    const App = yield* Env.loadApp
    const Storage = yield* Effect.promise(() => import("@pgfiber/media/internal/layers/Storage.js"))
    const worker = App.layerWorker(selection)
    // what either runs on: the service's layers (Env.layerService)
    const app: Layer.Layer<Worker.WorkerInfo, unknown, Layer.Layer.Success<ReturnType<typeof Env.layerService>>> = http
      ? (yield* App.layerHttp(selection)).pipe(
        Layer.provideMerge(worker),
        // the dev tick runs handlers outside the pools; POST /calls writes to storage even where calls do not run
        Layer.provide(Env.stageServices(selection)),
        Layer.provide(Storage.layerFromConfig)
      )
      : worker
    yield* Effect.logInfo(http ? "pgfiber starting: HTTP API and workers" : "pgfiber worker starting").pipe(
      Effect.annotateLogs({ stages: selection.stages.map((s) => s.name) })
    )
    // an embedded server that died and could not be restarted ends the service, naming the cause
    return yield* EmbeddedPg.endWhenLost(Layer.launch(
      app.pipe(
        Layer.provide(Env.layerService(known, migrate)),
        Layer.provide(Tracing.layer)
      )
    ))
  })

export const start = Command.make("start", { stages: stagesOption }, ({ stages }) => runService(stages, true)).pipe(
  Command.withDescription(
    "Run the service: migrate (unless PGFIBER_MIGRATE_ON_START=false), serve the HTTP API, run all stages (or --stages) until SIGINT/SIGTERM"
  )
)

export const worker = Command.make("worker", { stages: stagesOption }, ({ stages }) => runService(stages, false)).pipe(
  Command.withDescription("Run stage workers only, no HTTP (--stages a,b to run some); several may run against one database")
)

export const migrate = Command.make("migrate", {}, () =>
  Output.logsToStderr(
    Migrations.migrate().pipe(
      Effect.tap((r) =>
        Output.line(r.applied.length > 0 ? `applied: ${r.applied.join(", ")}` : `up to date (migration ${r.current})`)
      ),
      Effect.provide(Db.layer)
    )
  )).pipe(Command.withDescription("Apply pending database migrations (under an advisory lock) and exit"))

export const tick = Command.make(
  "tick",
  {
    max: Options.integer("max").pipe(
      Options.withDefault(10),
      Options.withDescription("Claim and run at most this many runnable jobs (default 10)")
    ),
    stages: stagesOption,
    json: Options.boolean("json").pipe(Options.withDescription("Print the counts as JSON"))
  },
  (o) =>
    Output.logsToStderr(
      Effect.gen(function*() {
        if (o.max < 1) return yield* Effect.fail("--max must be at least 1")
        const known = yield* Env.knownStages
        const selection = yield* Env.select(known, o.stages)
        const { workerId, concurrency, limits } = yield* Worker.config
        // where only ticks run, they fire the due schedules too (exactly once per tick, as a worker would)
        const fireDue = Effect.flatMap(Schedules.Schedules, (s) => s.fireDue()).pipe(Effect.provide(PgSchedules.layer))
        const result = yield* fireDue.pipe(
          Effect.zipRight(Tick.run({ max: o.max, stages: selection.stages, workerId: `${workerId}:tick`, concurrency, limits })),
          Effect.provide(Env.stageServices(selection)),
          Effect.provide(PgQueue.layer({ knownStages: known.map((s) => s.name), retention: Env.retentionOf(known) }).pipe(Layer.provideMerge(Env.layerDbChecked))),
          Effect.provide(Tracing.layer)
        )
        if (o.json) return yield* Output.json(result)
        yield* Output.line(
          `claimed ${result.claimed}: completed ${result.completed}, retried ${result.retried}, rescheduled ${result.rescheduled}, ` +
            `dead-lettered ${result.deadLettered}, released ${result.released}, fenced ${result.fenced}`
        )
      })
    )
).pipe(Command.withDescription("Claim and run at most --max runnable jobs in this process, then exit (cron, serverless)"))
