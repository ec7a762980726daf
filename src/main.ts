/**
 * `pgfiber`: the service and its operator commands (`npm start` runs `pgfiber start`; `npx pgfiber …`).
 * SIGINT/SIGTERM interrupt the main fiber (NodeRuntime.runMain); closing the layers is the graceful shutdown.
 * Every failure ends here as a one-line message on stderr and an exit code from cli/Failure.ts.
 */
import { Command } from "@effect/cli"
import * as NodeContext from "@effect/platform-node/NodeContext"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import * as Calls from "./cli/Calls.js"
import * as EventsCli from "./cli/Events.js"
import * as Failure from "./cli/Failure.js"
import * as Jobs from "./cli/Jobs.js"
import * as Keys from "./cli/Keys.js"
import * as Limits from "./cli/Limits.js"
import * as Schedules from "./cli/Schedules.js"
import * as Service from "./cli/Service.js"
import * as WebhooksCli from "./cli/Webhooks.js"
import * as Logging from "./layers/Logging.js"

const root = Command.make("pgfiber", {}, () => cli([process.argv[0]!, process.argv[1]!, "--help"])).pipe(
  Command.withDescription("pgfiber: a Postgres job queue and event-driven worker runtime"),
  Command.withSubcommands([
    Service.start,
    Service.worker,
    Service.migrate,
    Jobs.enqueue,
    Jobs.jobs,
    Jobs.dlq,
    Jobs.stats,
    EventsCli.events,
    Jobs.stagesCommand,
    Schedules.schedules,
    Limits.limits,
    Service.tick,
    Keys.keys,
    WebhooksCli.webhooks,
    Calls.calls
  ])
)

const cli: (argv: ReadonlyArray<string>) => Effect.Effect<void, unknown, NodeContext.NodeContext> = (argv) =>
  Command.run(root, { name: "pgfiber", version: "0.1.0" })(argv)

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
