/**
 * `pgfiber`: the service and its operator commands. `npm start` runs `pgfiber start`.
 * SIGINT/SIGTERM interrupt the main fiber (NodeRuntime.runMain); closing the layers is the graceful shutdown.
 */
import { Command, Options } from "@effect/cli"
import { NodeContext, NodeRuntime } from "@effect/platform-node"
import { Console, Effect, Layer } from "effect"
import * as App from "./App.js"
import * as Db from "./layers/Db.js"
import * as Logging from "./layers/Logging.js"
import * as Migrations from "./queue/Migrations.js"

const stagesOption = Options.text("stages").pipe(
  Options.withDescription("Comma-separated stage names to run (default: all)"),
  Options.withDefault("")
)

const parseList = (text: string) => text.split(",").map((s) => s.trim()).filter(Boolean)

const runWorker = (stageList: string) =>
  Effect.gen(function*() {
    const selection = yield* App.selectStages(parseList(stageList))
    yield* Effect.logInfo("pgfiber worker starting", { stages: selection.stages.map((s) => s.name) })
    return yield* Layer.launch(App.layerWorker(selection).pipe(Layer.provide(App.layerQueue)))
  })

const start = Command.make("start", { stages: stagesOption }, ({ stages }) => runWorker(stages)).pipe(
  Command.withDescription("Run the service: migrate, then all stages (or --stages) until SIGINT/SIGTERM")
)

const worker = Command.make("worker", { stages: stagesOption }, ({ stages }) => runWorker(stages)).pipe(
  Command.withDescription("Run stage workers only (no HTTP)")
)

const migrate = Command.make("migrate", {}, () =>
  Migrations.migrate().pipe(
    Effect.tap((r) =>
      Console.log(r.applied.length > 0 ? `applied: ${r.applied.join(", ")}` : `up to date (migration ${r.current})`)
    ),
    Effect.provide(Db.layer)
  )).pipe(Command.withDescription("Apply pending database migrations and exit"))

const root = Command.make("pgfiber", { stages: stagesOption }, ({ stages }) => runWorker(stages)).pipe(
  Command.withDescription("pgfiber: a Postgres job queue and event-driven worker runtime"),
  Command.withSubcommands([start, worker, migrate])
)

const cli = Command.run(root, { name: "pgfiber", version: "0.1.0" })

cli(process.argv).pipe(
  Effect.provide(Layer.mergeAll(NodeContext.layer, Logging.layer)),
  NodeRuntime.runMain({ disablePrettyLogger: true })
)
