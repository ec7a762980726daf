/**
 * `pgfiber limits list|set|reset`: stages' fair shares, global caps and rate limits at run time. `set` writes
 * an override to the database, over what the code and configuration say; every process's claims obey it
 * within a second, without a restart. `reset` drops the override (and the stage's token buckets).
 */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Either, Option } from "effect"
import * as Limits from "pgfiber/internal/queue/Limits.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import { NotFound, UsageError } from "./Failure.js"
import { operator } from "./Jobs.js"
import * as Output from "./Output.js"

const stageArg = Args.text({ name: "stage" }).pipe(Args.withDescription("The stage's name"))
const jsonFlag = Options.boolean("json").pipe(Options.withDescription("Print JSON instead of a table"))

const list = Command.make("list", { json: jsonFlag }, ({ json }) =>
  operator((stages) =>
    Effect.gen(function*() {
      const all = yield* Worker.limitViews(yield* StageRegistry.limitStages(stages))
      if (json) return yield* Output.json(all)
      yield* Output.line(Output.table(
        [{ header: "STAGE" }, { header: "FAIR" }, { header: "MAX RUNNING", align: "right" }, { header: "PER ORG", align: "right" },
          { header: "RATE" }, { header: "FROM" }],
        all.map((v) => {
          const d = Limits.describe(v.effective)
          return [v.stage, d.fair, d.maxRunning, d.maxRunningPerOrg, d.rate, v.source]
        })
      ))
    })
  )).pipe(Command.withDescription("Each stage's fairness, global caps and rate limit, and where they come from"))

const intOption = (name: string, description: string) =>
  Options.integer(name).pipe(Options.optional, Options.withDescription(description))

const rateOf = (flag: string, text: string) =>
  text === "none" || /^0\s*\//.test(text)
    ? Effect.succeed(null)
    : Either.match(Limits.parseRate(text), {
      onLeft: (message) => Effect.fail(new UsageError({ message: `${flag}: ${message}` })),
      onRight: Effect.succeed
    })

const set = Command.make("set", {
  stage: stageArg,
  maxRunning: intOption("max-running", "Running jobs of the stage across every process (0: no cap)"),
  maxRunningPerOrg: intOption("max-running-per-org", "Running jobs of one org in the stage (0: no cap)"),
  rate: Options.text("rate").pipe(Options.optional, Options.withDescription("A token bucket for the stage: 20/s, 500/1h (none: no limit)")),
  ratePerOrg: Options.text("rate-per-org").pipe(Options.optional, Options.withDescription("A token bucket per org: 5/s")),
  burst: intOption("burst", "Most tokens the bucket holds (default: a second's worth, at least 1)"),
  fair: Options.choice("fair", ["on", "off"]).pipe(Options.optional, Options.withDescription("Orgs take turns within a priority"))
}, (o) =>
  operator((stages) =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const known = yield* StageRegistry.operable(stages)
      if (!known.some((s) => s.name === o.stage)) return yield* new NotFound({ message: StageRegistry.unknownMessage(o.stage, known) })
      const counts = [o.maxRunning, o.maxRunningPerOrg, o.burst].flatMap((v) => (Option.isSome(v) ? [v.value] : []))
      if (counts.some((n) => n < 0)) return yield* new UsageError({ message: "caps and the burst are whole numbers, at least 0" })
      if (Option.isSome(o.burst) && o.burst.value < 1) return yield* new UsageError({ message: "--burst: at least 1" })
      if (Option.isSome(o.rate) && Option.isSome(o.ratePerOrg)) {
        return yield* new UsageError({ message: "--rate and --rate-per-org: one bucket per stage, either for the stage or per org" })
      }
      const override: { -readonly [K in keyof Limits.Override]?: Limits.Override[K] } = {}
      if (Option.isSome(o.maxRunning)) override.maxRunning = o.maxRunning.value
      if (Option.isSome(o.maxRunningPerOrg)) override.maxRunningPerOrg = o.maxRunningPerOrg.value
      if (Option.isSome(o.burst)) override.rateBurst = o.burst.value
      if (Option.isSome(o.fair)) override.fair = o.fair.value === "on"
      for (const [flag, text, perOrg] of [["--rate", o.rate, false], ["--rate-per-org", o.ratePerOrg, true]] as const) {
        if (Option.isNone(text)) continue
        const rate = yield* rateOf(flag, text.value)
        Object.assign(override, rate === null ? { rateLimit: 0 } : { rateLimit: rate.limit, ratePerMs: rate.perMs, ratePerOrg: perOrg })
      }
      if (Object.keys(override).length === 0) return yield* new UsageError({ message: "nothing to set: give at least one of the options" })
      yield* queue.limits.set(o.stage, override)
      yield* Output.line(`limits of ${o.stage} set; running workers apply them within a second`)
    })
  )).pipe(Command.withDescription("Override a stage's limits at run time, in every process, without a restart"))

const reset = Command.make("reset", { stage: stageArg }, ({ stage }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const had = yield* queue.limits.clear(stage)
      yield* Output.line(had ? `limits of ${stage} are the code's and configuration's again` : `${stage} had no override`)
    })
  )).pipe(Command.withDescription("Drop a stage's run-time override (and its token buckets)"))

export const limits = Command.make("limits").pipe(
  Command.withDescription("Fair shares, global caps and rate limits per stage: list, set, reset"),
  Command.withSubcommands([list, set, reset])
)
