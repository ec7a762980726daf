/**
 * `pgfiber schedules list|add|remove|enable|disable|run-now`: recurring jobs at run time. They act as the
 * service's own role (every org; `--org` names a tenant's schedule), print results on stdout, logs on stderr.
 * Running workers pick a change up at once (the schedules table NOTIFYs them).
 */
import { Args, Command, Options } from "@effect/cli"
import { Duration, Effect, Option } from "effect"
import * as PgSchedules from "pgfiber/internal/queue/PgSchedules.js"
import * as Schedules from "pgfiber/internal/queue/Schedules.js"
import * as Scheduler from "pgfiber/internal/runtime/Scheduler.js"
import type * as Env from "./Env.js"
import { operator } from "./Jobs.js"
import { UsageError } from "./Failure.js"
import * as Output from "./Output.js"

const nameArg = Args.text({ name: "name" }).pipe(Args.withDescription("The schedule's name"))
const orgOption = Options.text("org").pipe(
  Options.optional,
  Options.withDescription("The org the schedule belongs to (none: a system schedule)")
)
const jsonFlag = Options.boolean("json").pipe(Options.withDescription("Print JSON instead of a table"))

const withSchedules = <A, E>(
  run: (schedules: Schedules.Schedules["Type"], stages: ReadonlyArray<Env.KnownStage>) => Effect.Effect<A, E>
) => operator((stages) => Effect.flatMap(Schedules.Schedules, (s) => run(s, stages)).pipe(Effect.provide(PgSchedules.layer)))

const keyOf = (name: string, org: Option.Option<string>): Schedules.ScheduleKey => ({ name, orgId: Option.getOrNull(org) })

const timingText = (s: Schedules.Schedule) =>
  s.cron !== null ? `${s.cron}${s.timeZone === "UTC" ? "" : ` (${s.timeZone})`}` : `every ${Duration.format(Duration.millis(s.everyMs!))}`

const list = Command.make("list", { org: orgOption, json: jsonFlag }, (o) =>
  withSchedules((schedules) =>
    Effect.gen(function*() {
      const all = yield* schedules.list(Option.isSome(o.org) ? { orgId: o.org.value } : {})
      if (o.json) return yield* Output.json(all)
      yield* Output.line(Output.table(
        [{ header: "NAME" }, { header: "ORG" }, { header: "STAGE" }, { header: "WHEN" }, { header: "ENABLED" },
          { header: "CATCH-UP" }, { header: "NEXT TICK" }, { header: "LAST TICK" }, { header: "SOURCE" }],
        all.map((s) => [
          s.name,
          s.orgId ?? "",
          s.stage,
          timingText(s),
          s.enabled ? "yes" : "no",
          s.catchUp === "skip" ? "skip" : `backfill ${s.backfillLimit}`,
          s.enabled ? s.nextTickAt.toISOString().replace(/\.000Z$/, "Z") : "",
          s.lastTickAt?.toISOString().replace(/\.000Z$/, "Z") ?? "",
          s.source
        ])
      ))
    })
  )).pipe(Command.withDescription("List schedules: when each runs, its next and last tick, where it was defined"))

const parseEvery = (text: string) => {
  const ms = /^\d+$/.test(text) ? Number(text) : Option.map(Duration.decodeUnknown(text), Duration.toMillis).pipe(Option.getOrUndefined)
  return ms === undefined || !Number.isFinite(ms)
    ? Effect.fail(new UsageError({ message: `--every: "${text}" is not a duration (e.g. "30 seconds", "5 minutes", or milliseconds)` }))
    : Effect.succeed(ms)
}

const add = Command.make(
  "add",
  {
    name: nameArg,
    stage: Options.text("stage").pipe(Options.withDescription("The stage each tick's job goes to")),
    cron: Options.text("cron").pipe(Options.optional, Options.withDescription("A cron expression, 5 fields or 6 (seconds first)")),
    every: Options.text("every").pipe(Options.optional, Options.withDescription("Or a fixed interval: \"30 seconds\", \"5 minutes\", ms")),
    payload: Options.text("payload").pipe(Options.withDefault("{}"), Options.withDescription("The job's payload as JSON (default {})")),
    tz: Options.text("tz").pipe(Options.withDefault("UTC"), Options.withDescription("The IANA time zone of the cron expression (default UTC)")),
    org: orgOption,
    catchUp: Options.choice("catch-up", ["skip", "backfill"]).pipe(
      Options.withDefault("skip" as const),
      Options.withDescription("After downtime: skip to the latest missed tick (default), or backfill missed ticks")
    ),
    backfill: Options.integer("backfill").pipe(Options.withDefault(10), Options.withDescription("With --catch-up backfill: at most this many missed ticks (default 10)")),
    disabled: Options.boolean("disabled").pipe(Options.withDescription("Add it disabled")),
    json: jsonFlag
  },
  (o) =>
    withSchedules((schedules, stages) =>
      Effect.gen(function*() {
        const payload = yield* Effect.try({
          try: () => JSON.parse(o.payload) as unknown,
          catch: (e) => new UsageError({ message: `--payload is not valid JSON: ${e instanceof Error ? e.message : String(e)}` })
        })
        const everyMs = Option.isSome(o.every) ? yield* parseEvery(o.every.value) : undefined
        const spec = yield* Scheduler.prepare(stages, {
          name: o.name,
          stage: o.stage,
          payload,
          cron: Option.getOrUndefined(o.cron),
          everyMs,
          timeZone: o.tz,
          orgId: Option.getOrNull(o.org),
          enabled: !o.disabled,
          catchUp: o.catchUp,
          backfillLimit: o.catchUp === "backfill" ? o.backfill : undefined
        })
        const s = yield* schedules.put(spec)
        yield* Effect.logInfo("schedule saved").pipe(Effect.annotateLogs({ schedule: s.name, org: s.orgId }))
        if (o.json) return yield* Output.json(s)
        yield* Output.line(`${s.name}: ${timingText(s)}, next tick ${s.enabled ? s.nextTickAt.toISOString() : "(disabled)"}`)
      })
    )
).pipe(Command.withDescription("Add a schedule, or replace the one of that name: --stage S and --cron \"EXPR\" or --every D"))

const remove = Command.make("remove", { name: nameArg, org: orgOption }, (o) =>
  withSchedules((schedules) =>
    schedules.remove(keyOf(o.name, o.org)).pipe(Effect.zipRight(Output.line("removed")))
  )).pipe(Command.withDescription("Remove a schedule (a code-declared one comes back at the next start-up: disable it instead)"))

const toggle = (enabled: boolean) =>
  Command.make(enabled ? "enable" : "disable", { name: nameArg, org: orgOption }, (o) =>
    withSchedules((schedules) =>
      schedules.setEnabled(keyOf(o.name, o.org), enabled).pipe(
        Effect.flatMap((s) => Output.line(enabled ? `enabled; next tick ${s.nextTickAt.toISOString()}` : "disabled"))
      )
    )).pipe(Command.withDescription(
      enabled ? "Enable a schedule: it runs from its next tick after now (missed ticks are not fired)" : "Disable a schedule (kept across restarts)"
    ))

const runNow = Command.make("run-now", { name: nameArg, org: orgOption }, (o) =>
  withSchedules((schedules) =>
    schedules.runNow(keyOf(o.name, o.org)).pipe(Effect.flatMap((r) => Output.line(r.id)))
  )).pipe(Command.withDescription("Enqueue the schedule's job now, outside its ticks; prints the job id"))

export const schedules = Command.make("schedules").pipe(
  Command.withDescription("Recurring jobs: list, add, remove, enable, disable, run-now"),
  Command.withSubcommands([list, add, remove, toggle(true), toggle(false), runNow])
)
