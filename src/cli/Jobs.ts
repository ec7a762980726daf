/**
 * Operator commands on the queue: `enqueue`, `jobs list|history|show|cancel`, `dlq list|show|retry|resolve|purge`,
 * `stats`, `stages list|pause|resume|purge`. They act as the service's own role (every org), print results on stdout and logs on stderr.
 */
import { Args, Command, Options } from "@effect/cli"
import { Duration, Effect, Option } from "effect"
import type * as Db from "../layers/Db.js"
import * as Queue from "../queue/Queue.js"
import type * as ApiKeys from "../auth/ApiKeys.js"
import * as Submit from "../runtime/Submit.js"
import * as Env from "./Env.js"
import { Conflict, NotFound, UsageError } from "./Failure.js"
import * as Output from "./Output.js"

type OpsServices = Db.Db | Queue.Queue | ApiKeys.ApiKeys | Submit.KnownStages

/** Runs an operator command on the ops layers (no migration), its logs on stderr. */
export const operator = <A, E>(run: (stages: ReadonlyArray<Env.KnownStage>) => Effect.Effect<A, E, OpsServices>) =>
  Output.logsToStderr(
    Effect.gen(function*() {
      const stages = yield* Env.knownStages
      return yield* run(stages).pipe(Effect.provide(Env.layerOps(stages)))
    })
  )

const jsonFlag = Options.boolean("json").pipe(Options.withDescription("Print JSON instead of a table"))
const idArg = (what: string) => Args.text({ name: "id" }).pipe(Args.withDescription(`The ${what}'s id`))
const optionalText = (name: string, description: string) =>
  Options.text(name).pipe(Options.optional, Options.withDescription(description))
const limitOption = Options.integer("limit").pipe(
  Options.withDefault(50),
  Options.withDescription("At most this many rows (1..10000)")
)
const afterOption = optionalText("after", "Only ids greater than this (keyset pagination)")

const parseJson = (text: string) =>
  Effect.try({
    try: () => JSON.parse(text) as unknown,
    catch: (e) => new UsageError({ message: `payload is not valid JSON: ${e instanceof Error ? e.message : String(e)}` })
  })

// ---------------------------------------------------------------------------------------------
// enqueue

export const enqueue = Command.make(
  "enqueue",
  {
    stage: Args.text({ name: "stage" }).pipe(Args.withDescription("The stage to run the job")),
    payload: Args.text({ name: "json" }).pipe(
      Args.withDefault("{}"),
      Args.withDescription("The payload as JSON, validated by the stage's Schema (default {})")
    ),
    org: optionalText("org", "The org the job belongs to (row-level security scopes it to that org's API keys)"),
    subject: optionalText("subject", "The subject id (the call or document the job works on)"),
    priority: optionalText("priority", "fast, normal, bulk, or 0..100 (lower runs first)"),
    delay: Options.integer("delay-ms").pipe(Options.optional, Options.withDescription("Run no sooner than this many ms from now")),
    maxAttempts: Options.integer("max-attempts").pipe(Options.optional, Options.withDescription("Attempts before dead-lettering")),
    timeout: Options.integer("timeout-ms").pipe(Options.optional, Options.withDescription("This job's timeout in ms, overriding its stage's")),
    dedupeKey: optionalText("dedupe-key", "Unique among queued and running jobs: a duplicate returns the live job's id"),
    dedupeMode: Options.choice("dedupe-mode", ["first", "replace", "debounce"]).pipe(
      Options.optional,
      Options.withDescription("What a duplicate does to the still-queued live job: first (default: nothing), replace (payload and run time), debounce (run time only later)")
    ),
    json: jsonFlag
  },
  (o) =>
    operator((stages) =>
      Effect.gen(function*() {
        const payload = yield* parseJson(o.payload)
        const priority = Option.map(o.priority, (p) => (/^\d+$/.test(p) ? Number(p) : (p as Queue.Priority)))
        const result = yield* Submit.submit(stages, {
          stage: o.stage,
          payload,
          orgId: Option.getOrUndefined(o.org),
          subjectId: Option.getOrUndefined(o.subject),
          priority: Option.getOrUndefined(priority),
          delay: Option.getOrUndefined(Option.map(o.delay, Duration.millis)),
          maxAttempts: Option.getOrUndefined(o.maxAttempts),
          dedupeKey: Option.getOrUndefined(o.dedupeKey),
          dedupeMode: Option.getOrUndefined(o.dedupeMode),
          timeout: Option.getOrUndefined(Option.map(o.timeout, Duration.millis))
        })
        if (o.json) return yield* Output.json(result)
        if (result.deduped) yield* Output.note(`a live job with that dedupe key exists: ${result.id}`)
        yield* Output.line(result.id)
      })
    )
).pipe(Command.withDescription("Enqueue a job: pgfiber enqueue <stage> '<json>'; prints the job id"))

// ---------------------------------------------------------------------------------------------
// jobs

const statusOption = Options.choice("status", Queue.liveStatuses).pipe(
  Options.optional,
  Options.withDescription("Only jobs in this state")
)

const jobsList = Command.make(
  "list",
  { stage: optionalText("stage", "Only this stage's jobs"), status: statusOption, limit: limitOption, after: afterOption, json: jsonFlag },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const queue = yield* Queue.Queue
        const jobs = yield* queue.list({
          stage: Option.getOrUndefined(o.stage),
          status: Option.getOrUndefined(o.status),
          limit: o.limit,
          afterId: Option.getOrUndefined(o.after)
        })
        const now = Date.now()
        yield* Output.items(
          o.json,
          jobs,
          [
            { header: "ID", align: "right" },
            { header: "STAGE" },
            { header: "STATUS" },
            { header: "ATTEMPTS", align: "right" },
            { header: "DUE IN", align: "right" },
            { header: "PROGRESS", align: "right" },
            { header: "ORG" },
            { header: "LAST ERROR" }
          ],
          (j) => [
            j.id,
            j.stage,
            j.status,
            `${j.attempts}/${j.maxAttempts}`,
            j.status === "queued" ? Output.age(j.availableAt.getTime() - now) : "",
            progressText(j),
            j.orgId ?? "",
            Output.truncate(j.lastError)
          ]
        )
      })
    )
).pipe(Command.withDescription("List live jobs (finished ones: jobs history)"))

const progressText = (j: Queue.Job) =>
  j.progress === null ? "" : `${j.progress}${j.progressMessage ? ` ${Output.truncate(j.progressMessage, 30)}` : ""}`

const jobsHistory = Command.make(
  "history",
  {
    stage: optionalText("stage", "Only this stage's jobs"),
    status: Options.choice("status", ["completed", "dead", "cancelled"]).pipe(Options.optional, Options.withDescription("Only jobs that finished so")),
    limit: limitOption,
    before: optionalText("before", "Only ids smaller than this (keyset pagination, newest first)"),
    json: jsonFlag
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const queue = yield* Queue.Queue
        const jobs = yield* queue.history.list({
          stage: Option.getOrUndefined(o.stage),
          status: Option.getOrUndefined(o.status),
          limit: o.limit,
          beforeId: Option.getOrUndefined(o.before)
        })
        yield* Output.items(
          o.json,
          jobs,
          [
            { header: "ID", align: "right" },
            { header: "STAGE" },
            { header: "STATUS" },
            { header: "ATTEMPTS", align: "right" },
            { header: "FINISHED" },
            { header: "LAST RUN", align: "right" },
            { header: "ORG" },
            { header: "LAST ERROR" }
          ],
          (j) => [
            j.id,
            j.stage,
            j.status,
            String(j.attempts),
            j.finishedAt?.toISOString() ?? "",
            j.lastRunMs === null ? "" : `${Math.round(j.lastRunMs)} ms`,
            j.orgId ?? "",
            Output.truncate(j.lastError)
          ]
        )
      })
    )
).pipe(Command.withDescription("List finished jobs kept for their stage's retention (PGFIBER_RETAIN_COMPLETED), newest first"))

const jobsShow = Command.make("show", { id: idArg("job") }, ({ id }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const job = yield* queue.get(id)
      if (job === null) {
        return yield* new NotFound({ message: `job ${id} not found (finished jobs are kept for their stage's retention, then pruned; see dlq list)` })
      }
      const dependencies = yield* queue.dependencies(id)
      yield* Output.json({ ...job, dependencies })
    })
  )).pipe(Command.withDescription(
    "Print one job as JSON, live or finished (status, output, progress, started/finished times, errors, the parents it waits on and its children)"
  ))

const jobsCancel = Command.make("cancel", { id: idArg("job") }, ({ id }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const outcome = yield* queue.cancel(id)
      if (outcome === "not-found") return yield* new NotFound({ message: `job ${id} not found` })
      yield* Effect.logInfo("job cancelled").pipe(Effect.annotateLogs({ jobId: id, outcome }))
      yield* Output.line(outcome)
    })
  )).pipe(Command.withDescription("Cancel a job: a queued one is removed, a running one stops at its next heartbeat"))

export const jobs = Command.make("jobs").pipe(
  Command.withDescription("Inspect and cancel jobs"),
  Command.withSubcommands([jobsList, jobsHistory, jobsShow, jobsCancel])
)

// ---------------------------------------------------------------------------------------------
// dead letters

const dlqList = Command.make(
  "list",
  {
    stage: optionalText("stage", "Only this stage's dead letters"),
    all: Options.boolean("all").pipe(Options.withDescription("Include resolved and retried ones")),
    limit: limitOption,
    after: afterOption,
    json: jsonFlag
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const queue = yield* Queue.Queue
        const list = yield* queue.deadLetters.list({
          stage: Option.getOrUndefined(o.stage),
          unresolvedOnly: !o.all,
          limit: o.limit,
          afterId: Option.getOrUndefined(o.after)
        })
        yield* Output.items(
          o.json,
          list,
          [
            { header: "ID", align: "right" },
            { header: "JOB", align: "right" },
            { header: "STAGE" },
            { header: "ORG" },
            { header: "DEAD AT" },
            { header: "ATTEMPTS", align: "right" },
            { header: "RESOLUTION" },
            { header: "REASON" }
          ],
          (d) => [
            d.id,
            d.jobId,
            d.stage,
            d.orgId ?? "",
            d.deadAt.toISOString().replace(/\.\d+Z$/, "Z"),
            String(d.attempts),
            d.resolutionStatus === "retried" ? `retried → ${d.retriedJobId}` : d.resolutionStatus ?? "",
            Output.truncate(d.reason)
          ]
        )
      })
    )
).pipe(Command.withDescription("List dead letters (unresolved ones unless --all)"))

const dlqShow = Command.make("show", { id: idArg("dead letter") }, ({ id }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const dl = yield* queue.deadLetters.get(id)
      if (dl === null) return yield* new NotFound({ message: `dead letter ${id} not found` })
      yield* Output.json(dl)
    })
  )).pipe(Command.withDescription("Print one dead letter as JSON, with its whole error history"))

const dlqRetry = Command.make("retry", { id: idArg("dead letter") }, ({ id }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const jobId = yield* queue.deadLetters.retry(id).pipe(
        Effect.catchTags({
          JobNotFound: (e) => Effect.fail(new NotFound({ message: e.message })),
          InvalidJob: (e) => Effect.fail(new Conflict({ message: e.message }))
        })
      )
      yield* Effect.logInfo("dead letter retried").pipe(Effect.annotateLogs({ deadLetterId: id, jobId }))
      yield* Output.line(jobId)
    })
  )).pipe(Command.withDescription("Enqueue a dead letter's payload again as a fresh job (attempts 0); prints the new job id"))

const dlqResolve = Command.make(
  "resolve",
  { id: idArg("dead letter"), notes: optionalText("notes", "Why it needs no retry (kept with the dead letter)") },
  ({ id, notes }) =>
    operator(() =>
      Effect.gen(function*() {
        const queue = yield* Queue.Queue
        yield* queue.deadLetters.resolve(id, Option.getOrUndefined(notes)).pipe(
          Effect.catchTag("JobNotFound", (e) => Effect.fail(new NotFound({ message: e.message })))
        )
        yield* Effect.logInfo("dead letter resolved").pipe(Effect.annotateLogs({ deadLetterId: id }))
        yield* Output.line("resolved")
      })
    )
).pipe(Command.withDescription("Mark a dead letter handled without retrying it"))

const dlqPurge = Command.make(
  "purge",
  {
    olderThan: Options.text("older-than").pipe(
      Options.optional,
      Options.withDescription("Only dead letters older than this, e.g. \"30 days\", \"12 hours\" (default: all)")
    ),
    includeUnresolved: Options.boolean("include-unresolved").pipe(
      Options.withDescription("Also delete unresolved dead letters (default: only resolved and retried ones)")
    )
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const queue = yield* Queue.Queue
        const olderThan = yield* Option.match(o.olderThan, {
          onNone: () => Effect.succeed(undefined),
          onSome: (text) =>
            Option.match(Duration.decodeUnknown(text), {
              onNone: () => Effect.fail(new UsageError({ message: `--older-than: "${text}" is not a duration (e.g. "30 days")` })),
              onSome: Effect.succeed
            })
        })
        const purged = yield* queue.deadLetters.purge({ olderThan, includeUnresolved: o.includeUnresolved })
        yield* Effect.logInfo("dead letters purged").pipe(Effect.annotateLogs({ purged }))
        yield* Output.line(String(purged))
      })
    )
).pipe(Command.withDescription("Delete handled dead letters; prints how many"))

export const dlq = Command.make("dlq").pipe(
  Command.withDescription("The dead-letter workflow: list, show, retry, resolve, purge"),
  Command.withSubcommands([dlqList, dlqShow, dlqRetry, dlqResolve, dlqPurge])
)

// ---------------------------------------------------------------------------------------------
// stats

export const stats = Command.make("stats", { json: jsonFlag }, ({ json }) =>
  operator((stages) =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const rows = yield* queue.stats
      const all = Queue.statsForStages(rows, stages.map((s) => s.name))
      if (json) return yield* Output.json(all)
      const sum = (f: (s: Queue.StageStats) => number) => String(all.reduce((n, s) => n + f(s), 0))
      const n = (v: number) => String(v)
      yield* Output.line(Output.table(
        [
          { header: "STAGE" },
          { header: "READY", align: "right" },
          { header: "SCHEDULED", align: "right" },
          { header: "RUNNING", align: "right" },
          { header: "CANCELLING", align: "right" },
          { header: "DEAD", align: "right" },
          { header: "OLDEST READY", align: "right" },
          { header: "PAUSED" },
          { header: "NOTE" }
        ],
        [
          ...all.map((s) => [
            s.stage, n(s.ready), n(s.scheduled), n(s.running), n(s.cancelling), n(s.deadLetters), Output.age(s.oldestReadyAgeMs),
            s.paused ? "paused" : "",
            s.rateLimited ? "rate limited" : ""
          ]),
          [
            "total",
            sum((s) => s.ready),
            sum((s) => s.scheduled),
            sum((s) => s.running),
            sum((s) => s.cancelling),
            sum((s) => s.deadLetters),
            Output.age(Math.max(0, ...all.map((s) => s.oldestReadyAgeMs))),
            ""
          ]
        ]
      ))
    })
  )).pipe(Command.withDescription("Queue depth per stage and state, the oldest ready job's age (lag), unresolved dead letters, paused stages"))

// ---------------------------------------------------------------------------------------------
// stages: pause, resume, purge (every process hears a pause at once, through NOTIFY)

const stageArg = Args.text({ name: "stage" }).pipe(Args.withDescription("The stage's name"))

const knownStage = (stages: ReadonlyArray<Env.KnownStage>, name: string) =>
  stages.some((s) => s.name === name)
    ? Effect.void
    : Effect.fail(new NotFound({ message: `unknown stage ${JSON.stringify(name)}; known: ${stages.map((s) => s.name).sort().join(", ")}` }))

const stagesList = Command.make("list", { json: jsonFlag }, ({ json }) =>
  operator((stages) =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const controls = yield* queue.stageControls.list
      const names = [...new Set([...stages.map((s) => s.name), ...controls.map((c) => c.stage)])].sort()
      const rows = names.map((stage) => {
        const c = controls.find((x) => x.stage === stage)
        return { stage, paused: c?.paused ?? false, changedBy: c?.changedBy ?? null, changedAt: c?.changedAt ?? null }
      })
      yield* Output.items(
        json,
        rows,
        [{ header: "STAGE" }, { header: "STATE" }, { header: "CHANGED" }, { header: "BY" }],
        (r) => [r.stage, r.paused ? "paused" : "running", r.changedAt?.toISOString() ?? "", r.changedBy ?? ""]
      )
    })
  )).pipe(Command.withDescription("Each stage's state: running or paused"))

const setPaused = (paused: boolean) => ({ stage }: { readonly stage: string }) =>
  operator((stages) =>
    Effect.gen(function*() {
      yield* knownStage(stages, stage)
      const queue = yield* Queue.Queue
      yield* queue.stageControls.setPaused(stage, paused, "cli")
      yield* Effect.logInfo(paused ? "stage paused" : "stage resumed").pipe(Effect.annotateLogs({ stage }))
      yield* Output.line(paused ? "paused" : "resumed")
    })
  )

const stagesPause = Command.make("pause", { stage: stageArg }, setPaused(true)).pipe(
  Command.withDescription("Pause a stage in every process: nothing of it is claimed until resumed; running jobs finish, enqueues succeed")
)
const stagesResume = Command.make("resume", { stage: stageArg }, setPaused(false)).pipe(
  Command.withDescription("Resume a paused stage: every worker that runs it claims again at once")
)
const stagesPurge = Command.make(
  "purge",
  { stage: stageArg, yes: Options.boolean("yes").pipe(Options.withDescription("Confirm: the queued jobs are deleted, not archived")) },
  ({ stage, yes }) =>
    operator((stages) =>
      Effect.gen(function*() {
        yield* knownStage(stages, stage)
        if (!yes) {
          return yield* new UsageError({ message: `purge deletes every queued job of ${stage} (running ones finish); add --yes to confirm` })
        }
        const queue = yield* Queue.Queue
        const purged = yield* queue.stageControls.purge(stage)
        yield* Effect.logInfo("stage purged").pipe(Effect.annotateLogs({ stage, purged }))
        yield* Output.line(String(purged))
      })
    )
).pipe(Command.withDescription("Delete a stage's queued jobs (needs --yes); prints how many"))

export const stagesCommand = Command.make("stages").pipe(
  Command.withDescription("Pause, resume or purge a stage across every process"),
  Command.withSubcommands([stagesList, stagesPause, stagesResume, stagesPurge])
)
