/**
 * `pgfiber`: the service and its operator commands (`npm start` runs `pgfiber start`; `npx pgfiber …`).
 * SIGINT/SIGTERM interrupt the main fiber (NodeRuntime.runMain); closing the layers is the graceful shutdown.
 * Every failure ends here as a one-line message on stderr and an exit code from cli/Failure.ts.
 */
import { Command } from "@effect/cli"
import * as NodeContext from "@effect/platform-node/NodeContext"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import * as Failure from "./cli/Failure.js"
import * as Logging from "pgfiber/internal/layers/Logging.js"

/**
 * Each subcommand and the module that defines it, in the order `--help` lists them. A command line that names
 * one loads that module only (and what it imports); `--help`, `--version` or no command at all load every one.
 */
type AnyCommand = Command.Command<any, any, any, any>
const subcommands: ReadonlyArray<readonly [string, () => Promise<AnyCommand>]> = [
  ["start", () => import("./cli/Service.js").then((m) => m.start)],
  ["worker", () => import("./cli/Service.js").then((m) => m.worker)],
  ["migrate", () => import("./cli/Service.js").then((m) => m.migrate)],
  ["enqueue", () => import("./cli/Jobs.js").then((m) => m.enqueue)],
  ["jobs", () => import("./cli/Jobs.js").then((m) => m.jobs)],
  ["dlq", () => import("./cli/Jobs.js").then((m) => m.dlq)],
  ["stats", () => import("./cli/Jobs.js").then((m) => m.stats)],
  ["events", () => import("./cli/Events.js").then((m) => m.events)],
  ["stages", () => import("./cli/Jobs.js").then((m) => m.stagesCommand)],
  ["schedules", () => import("./cli/Schedules.js").then((m) => m.schedules)],
  ["limits", () => import("./cli/Limits.js").then((m) => m.limits)],
  ["tick", () => import("./cli/Service.js").then((m) => m.tick)],
  ["keys", () => import("./cli/Keys.js").then((m) => m.keys)],
  ["webhooks", () => import("./cli/Webhooks.js").then((m) => m.webhooks)],
  ["calls", () => import("./cli/Calls.js").then((m) => m.calls)]
]

/** The subcommands this command line needs: the one it names (its first word), else all. */
const needed = (argv: ReadonlyArray<string>) => {
  const first = argv.slice(2).find((a) => !a.startsWith("-"))
  const named = subcommands.filter(([name]) => name === first)
  return named.length > 0 ? named : subcommands
}

const cli = (argv: ReadonlyArray<string>): Effect.Effect<void, unknown, NodeContext.NodeContext> =>
  Effect.gen(function*() {
    const loaded = yield* Effect.promise(() => Promise.all(needed(argv).map(([, load]) => load())))
    const root = Command.make("pgfiber", {}, () => cli([argv[0]!, argv[1]!, "--help"])).pipe(
      Command.withDescription("pgfiber: a Postgres job queue and event-driven worker runtime"),
      Command.withSubcommands(loaded as [AnyCommand, ...Array<AnyCommand>])
    )
    return yield* Command.run(root, { name: "pgfiber", version: "0.1.0" })(argv)
  })

/** The exit code, after saying why on stderr (and in the log, for the service's own record). */
const report = (cause: Cause.Cause<unknown>) =>
  Option.match(Failure.fromCause(cause), {
    onNone: () => Effect.succeed(Failure.ExitCode.ok),
    onSome: ({ code, message }) =>
      message === ""
        ? Effect.succeed(code)
        : Effect.sync(() => {
          process.stderr.write(`pgfiber: ${message}\n`)
          return code
        })
  })

const program = cli(process.argv).pipe(
  Effect.provide(Layer.mergeAll(NodeContext.layer, Logging.layer)),
  Effect.as(Failure.ExitCode.ok as number),
  Effect.catchAllCause(report)
)

NodeRuntime.runMain(program, {
  disablePrettyLogger: true,
  disableErrorReporting: true,
  teardown: (exit, onExit) =>
    onExit(
      Exit.isSuccess(exit) && typeof exit.value === "number"
        ? exit.value
        : Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)
        ? Failure.ExitCode.failure
        : Failure.ExitCode.ok
    )
})
