/**
 * Operator commands on the queue: `enqueue`, `jobs list|history|show|cancel|retry|run-now|priority|actions`, `dlq list|show|retry|resolve|purge`,
 * `stats`, `stages list|pause|resume|purge`. They act as the service's own role (every org), print results on stdout and logs on stderr.
 */
import { Args, Command, Options } from "@effect/cli"
import { Duration, Effect, Option } from "effect"
import type * as Db from "pgfiber/internal/layers/Db.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Bulk from "pgfiber/internal/queue/Bulk.js"
import type * as ApiKeys from "../auth/ApiKeys.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import * as Env from "./Env.js"
import { Conflict, NotFound, UsageError } from "./Failure.js"
import * as Output from "./Output.js"

type OpsServices = Db.Db | Queue.Queue | Reads.Reads | ApiKeys.ApiKeys | Submit.KnownStages

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
    stage: Args.text({ name: "stage" }).pipe(Args.withDescription("The stage to run the job: compiled into this build or registered by any worker")),
    payload: Args.text({ name: "json" }).pipe(
      Args.withDefault("{}"),
      Args.withDescription("The payload as JSON, validated by the stage's Schema, or by the JSON Schema its worker registered (default {})")
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

/** A column of a job table that live and finished jobs show differently: its header and its cell. */
type JobColumn = readonly [Output.Column, (j: Queue.Job) => string]

/**
 * Jobs as `jobs list` and `jobs history` print them (or the JSON list, with --json): id, stage and status first,
 * org and last error last, and between them the columns the listing has of its own.
 */
const printJobs = (json: boolean, jobs: ReadonlyArray<Queue.Job>, between: ReadonlyArray<JobColumn>) =>
  Output.items(
    json,
    jobs,
    [
      { header: "ID", align: "right" },
      { header: "STAGE" },
      { header: "STATUS" },
      ...between.map(([column]) => column),
      { header: "ORG" },
      { header: "LAST ERROR" }
    ],
    (j) => [j.id, j.stage, j.status, ...between.map(([, cell]) => cell(j)), j.orgId ?? "", Output.truncate(j.lastError)]
  )

const jobsList = Command.make(
  "list",
  { stage: optionalText("stage", "Only this stage's jobs"), status: statusOption, limit: limitOption, after: afterOption, json: jsonFlag },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const reads = yield* Reads.Reads
        const jobs = yield* reads.list(Reads.operator, {
          stage: Option.getOrUndefined(o.stage),
          status: Option.getOrUndefined(o.status),
          limit: o.limit,
          afterId: Option.getOrUndefined(o.after)
        })
        const now = Date.now()
        yield* printJobs(o.json, jobs, [
          [{ header: "ATTEMPTS", align: "right" }, (j) => `${j.attempts}/${j.maxAttempts}`],
          [{ header: "DUE IN", align: "right" }, (j) => (j.status === "queued" ? Output.age(j.availableAt.getTime() - now) : "")],
          [{ header: "PROGRESS", align: "right" }, progressText]
        ])
      })
    )
).pipe(Command.withDescription("List live jobs (finished ones: jobs history)"))

const progressText = (j: Queue.Job) =>
  j.progress === null ? "" : `${j.progress}${j.progressMessage ? ` ${Output.truncate(j.progressMessage, 30)}` : ""}`

const jobsHistory = Command.make(
  "history",
  {
    stage: optionalText("stage", "Only this stage's jobs"),
    status: Options.choice("status", Queue.finishedStatuses).pipe(Options.optional, Options.withDescription("Only jobs that finished so")),
    limit: limitOption,
    before: optionalText("before", "Only ids smaller than this (keyset pagination, newest first)"),
    json: jsonFlag
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const reads = yield* Reads.Reads
        const jobs = yield* reads.history(Reads.operator, {
          stage: Option.getOrUndefined(o.stage),
          status: Option.getOrUndefined(o.status),
          limit: o.limit,
          beforeId: Option.getOrUndefined(o.before)
        })
        yield* printJobs(o.json, jobs, [
          [{ header: "ATTEMPTS", align: "right" }, (j) => String(j.attempts)],
          [{ header: "FINISHED" }, (j) => j.finishedAt?.toISOString() ?? ""],
          [{ header: "LAST RUN", align: "right" }, (j) => (j.lastRunMs === null ? "" : `${Math.round(j.lastRunMs)} ms`)]
        ])
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

const cancelOne = (id: string) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const outcome = yield* queue.cancel(id)
      if (outcome === "not-found") return yield* new NotFound({ message: `job ${id} not found` })
      yield* Effect.logInfo("job cancelled").pipe(Effect.annotateLogs({ jobId: id, outcome }))
      yield* Output.line(outcome)
    })
  )

// ---------------------------------------------------------------------------------------------
// bulk actions: jobs cancel|retry|run-now|priority by filter (Queue.bulk), a preview unless --yes

const filterOptions = {
  stage: optionalText("stage", "Only this stage's jobs (any stage with jobs in the database)"),
  status: Options.choice("status", Bulk.filterStatuses).pipe(
    Options.optional,
    Options.withDescription("queued (due now), delayed (queued for later: scheduled or backing off), running")
  ),
  org: optionalText("org", "Only this org's jobs"),
  subject: optionalText("subject", "Only jobs on this subject"),
  where: optionalText("where", "Payload search: a JSON object the payload contains ('{\"customer\":42}') or key=value[,key=value]"),
  error: optionalText("error", "Only jobs whose last error contains this text (case-insensitive)"),
  olderThan: optionalText("older-than", "Only jobs created longer ago than this (30m, 2h, 7d)"),
  newerThan: optionalText("newer-than", "Only jobs created within this much of now (30m, 2h, 7d)"),
  yes: Options.boolean("yes").pipe(Options.withDescription("Do it; without --yes only the number of jobs it would change is printed")),
  json: jsonFlag
}

type FilterFlags = {
  readonly [K in "stage" | "org" | "subject" | "where" | "error" | "olderThan" | "newerThan"]: Option.Option<string>
} & { readonly status: Option.Option<Bulk.FilterStatus> }

const usage = (e: Bulk.InvalidFilter) => new UsageError({ message: e.message })

/** The filter the flags give, or a usage error (exit 2) naming the bad one. */
const filterFromFlags = (o: FilterFlags) =>
  Effect.gen(function*() {
    const age = (field: string, v: Option.Option<string>) =>
      Option.isSome(v) ? Effect.map(Bulk.parseAge(field, v.value), (d) => d as Duration.Duration | undefined) : Effect.succeed(undefined)
    const filter: Bulk.JobFilter = {
      stage: Option.getOrUndefined(o.stage),
      status: Option.getOrUndefined(o.status),
      org: Option.getOrUndefined(o.org),
      subject: Option.getOrUndefined(o.subject),
      payload: Option.isSome(o.where) ? yield* Bulk.parsePayloadSearch(o.where.value) : undefined,
      error: Option.getOrUndefined(o.error),
      olderThan: yield* age("--older-than", o.olderThan),
      newerThan: yield* age("--newer-than", o.newerThan)
    }
    return yield* Bulk.validateFilter(filter)
  }).pipe(Effect.mapError(usage))

const hasCondition = (f: Bulk.JobFilter) =>
  [f.stage, f.status, f.org, f.subject, f.payload, f.error, f.olderThan, f.newerThan].some((v) => v !== undefined)

const verbs: Record<Bulk.ActionKind, string> = {
  cancel: "cancelled",
  retry: "retried now",
  "run-now": "made due now",
  priority: "given the new priority"
}

/** A bulk action from the CLI: the preview count without --yes, the action with it. */
const bulkAction = (o: FilterFlags & { readonly yes: boolean; readonly json: boolean }, action: Bulk.BulkAction) =>
  operator(() =>
    Effect.gen(function*() {
      const filter = yield* filterFromFlags(o)
      if (!hasCondition(filter)) {
        return yield* new UsageError({ message: "name at least one filter (--stage, --status, --org, --subject, --where, --error, --older-than, --newer-than)" })
      }
      yield* Bulk.validateAction(action).pipe(Effect.mapError(usage))
      const queue = yield* Queue.Queue
      if (!o.yes) {
        const matched = yield* queue.bulk.preview(filter, action)
        if (o.json) return yield* Output.json({ action: action.kind, dryRun: true, matched })
        return yield* Output.line(`${matched} job${matched === 1 ? "" : "s"} would be ${verbs[action.kind]}; add --yes to do it`)
      }
      const result = yield* queue.bulk.apply(filter, action, { actor: "cli" })
      yield* Effect.logInfo("bulk action").pipe(Effect.annotateLogs({ action: action.kind, ...result }))
      if (o.json) return yield* Output.json({ action: action.kind, dryRun: false, ...result })
      yield* Output.line(
        `${result.affected} job${result.affected === 1 ? "" : "s"} ${verbs[action.kind]}` +
          (result.cancelling > 0 ? ` (${result.cancelling} running: stopped at their next heartbeat)` : "")
      )
    })
  )

const jobsCancel = Command.make(
  "cancel",
  { id: idArg("job").pipe(Args.optional), ...filterOptions },
  ({ id, ...o }): Effect.Effect<void, unknown, never> => {
    if (Option.isNone(id)) return bulkAction(o, { kind: "cancel" })
    const filtered = [o.stage, o.status, o.org, o.subject, o.where, o.error, o.olderThan, o.newerThan].some(Option.isSome)
    return filtered ? Effect.fail(new UsageError({ message: "give a job id or filters, not both" })) : cancelOne(id.value)
  }
).pipe(Command.withDescription(
  "Cancel a job by id, or every live job a filter matches (a preview count unless --yes): a queued job is removed, a running one stops at its next heartbeat"
))

const jobsRetry = Command.make("retry", filterOptions, (o) => bulkAction(o, { kind: "retry" })).pipe(
  Command.withDescription("Make failed jobs waiting for their next attempt due now (a preview count unless --yes)")
)

const jobsRunNow = Command.make("run-now", filterOptions, (o) => bulkAction(o, { kind: "run-now" })).pipe(
  Command.withDescription("Make jobs queued for later (delayed, scheduled, backing off) due now (a preview count unless --yes)")
)

const jobsPriority = Command.make(
  "priority",
  { priority: Args.text({ name: "priority" }).pipe(Args.withDescription("fast, normal, bulk, or 0..100 (lower runs first)")), ...filterOptions },
  ({ priority, ...o }) => {
    const n = /^\d+$/.test(priority) ? Number(priority) : Queue.namedPriorities[priority as Queue.PriorityName]
    return n === undefined
      ? Effect.fail(new UsageError({ message: `priority "${priority}" is not fast, normal, bulk or 0..100` }))
      : bulkAction(o, { kind: "priority", priority: n })
  }
).pipe(Command.withDescription("Give queued jobs a new priority (a preview count unless --yes)"))

const jobsActions = Command.make("actions", { limit: limitOption, json: jsonFlag }, ({ json, limit }) =>
  operator(() =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const actions = yield* queue.bulk.actions({ limit })
      yield* Output.items(
        json,
        actions,
        [
          { header: "ID", align: "right" },
          { header: "ACTION" },
          { header: "MATCHED", align: "right" },
          { header: "CHANGED", align: "right" },
          { header: "BY" },
          { header: "ORG" },
          { header: "FINISHED" },
          { header: "FILTER" }
        ],
        (a) => [
          a.id,
          a.action === "priority" ? `priority ${a.priority}` : a.action,
          String(a.matched),
          String(a.affected),
          a.actor,
          a.orgId ?? "",
          a.finishedAt === null ? "running" : `${a.finishedAt.toISOString().replace(/\.\d+Z$/, "Z")}${a.interrupted ? " (interrupted)" : ""}`,
          Output.truncate(JSON.stringify(a.filter))
        ]
      )
    })
  )).pipe(Command.withDescription("The bulk actions done (cancel, retry, run-now, priority by filter), newest first: who, what, how many"))

export const jobs = Command.make("jobs").pipe(
  Command.withDescription("Inspect and cancel jobs; cancel, retry, run now or reprioritise them by filter"),
  Command.withSubcommands([jobsList, jobsHistory, jobsShow, jobsCancel, jobsRetry, jobsRunNow, jobsPriority, jobsActions])
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
      const reads = yield* Reads.Reads
      const rows = yield* reads.stats
      const known = yield* StageRegistry.operable(stages)
      const all = Queue.statsForStages(rows, known.map((s) => s.name))
      if (json) return yield* Output.json(all)
      // a registered stage with jobs and no live process: they wait for one
      const noProcess = new Set(known.filter((s) => s.live === false).map((s) => s.name))
      const note = (s: Queue.StageStats) =>
        [s.rateLimited ? "rate limited" : "", noProcess.has(s.stage) && s.ready + s.scheduled > 0 ? "no live process" : ""]
          .filter(Boolean).join(", ")
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
            note(s)
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

/** The stage, compiled in or registered by any worker, or a NotFound listing those that are. */
const knownStage = (stages: ReadonlyArray<Env.KnownStage>, name: string) =>
  Effect.flatMap(StageRegistry.operable(stages), (known) =>
    known.some((s) => s.name === name) ? Effect.void : Effect.fail(new NotFound({ message: StageRegistry.unknownMessage(name, known) })))

const stagesList = Command.make("list", { json: jsonFlag }, ({ json }) =>
  operator((stages) =>
    Effect.gen(function*() {
      const queue = yield* Queue.Queue
      const known = yield* StageRegistry.operable(stages)
      const controls = yield* queue.stageControls.list
      const names = [...new Set([...known.map((s) => s.name), ...controls.map((c) => c.stage)])].sort()
      const rows = names.map((stage) => {
        const c = controls.find((x) => x.stage === stage)
        const k = known.find((x) => x.name === stage)
        return {
          stage,
          paused: c?.paused ?? false,
          changedBy: c?.changedBy ?? null,
          changedAt: c?.changedAt ?? null,
          visibility: k?.visibility ?? null,
          live: k?.live ?? null,
          processes: k?.registered?.processes.map((p) => ({ workerId: p.workerId, concurrency: p.concurrency, live: p.live, lastSeenAt: p.lastSeenAt })) ?? []
        }
      })
      yield* Output.items(
        json,
        rows,
        [{ header: "STAGE" }, { header: "STATE" }, { header: "PROCESSES" }, { header: "CHANGED" }, { header: "BY" }],
        (r) => [
          r.stage,
          r.paused ? "paused" : "running",
          r.live === null ? "not registered" : r.live ? String(r.processes.filter((p) => p.live).length) : "none live",
          r.changedAt?.toISOString() ?? "",
          r.changedBy ?? ""
        ]
      )
    })
  )).pipe(Command.withDescription("Each stage (compiled in or registered by any worker): running or paused, and how many live processes run it"))

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
        const purged = yield* queue.stageControls.purge(stage, "cli")
        yield* Effect.logInfo("stage purged").pipe(Effect.annotateLogs({ stage, purged }))
        yield* Output.line(String(purged))
      })
    )
).pipe(Command.withDescription("Delete a stage's queued jobs (needs --yes); prints how many"))

export const stagesCommand = Command.make("stages").pipe(
  Command.withDescription("Pause, resume or purge a stage across every process"),
  Command.withSubcommands([stagesList, stagesPause, stagesResume, stagesPurge])
)
