/**
 * Reads: what the faces (HTTP, dashboard, CLI) show and never change — jobs browsed across the live table, the kept
 * history and the dead letters; the live snapshot the dashboard draws; the counts shown before a destructive action
 * is confirmed; and the queue's own lists and stats. Each read says whose rows it may see (`Viewer`): one org's,
 * under that org's row-level security, or every org's, as the owner, for an operator. The viewer is an argument,
 * not the caller's transaction, because the reads may run on a pool of their own (`DATABASE_READ_URL`, a read
 * replica) that never joins a transaction on the primary.
 *
 * Two implementations stand behind this one tag and pass one contract suite: `layer` (Postgres: BrowseSql's and
 * StatsSql's statements, and PgQueue's own reads run on the read pool, rows decoded by the schemas of Job.ts and Rows.ts) and
 * `layerMemory` (over a Queue's reads, for unit tests: it keeps no per-minute counts, so its snapshot's series is
 * empty). Locking: none; plain reads. A replica may lag the primary by its replication delay.
 */
import { Clock, Config, Context, Effect, Layer, Option, Redacted, Schema } from "effect"
import * as Db from "../layers/Db.js"
import * as BrowseSql from "./BrowseSql.js"
import * as Bulk from "./Bulk.js"
import * as EventLog from "./EventLog.js"
import * as EventsSql from "./EventsSql.js"
import {
  type BrowseFilter,
  type BrowseStatus,
  type DeadLetter,
  type HistoryListOptions,
  type Job,
  type JobSummary,
  JobSummaryFromRow,
  type ListOptions,
  LiveSnapshot,
  type StageStats
} from "./Job.js"
import * as PgQueue from "./PgQueue.js"
import { Queue, type QueueError, type QueueOptions } from "./Queue.js"
import * as StatsSql from "./StatsSql.js"

/** Whose rows a read may see: every org's (an operator) or one org's. */
export type Viewer = { readonly _tag: "Operator" } | { readonly _tag: "Org"; readonly orgId: string }
export const operator: Viewer = { _tag: "Operator" }
export const org = (orgId: string): Viewer => ({ _tag: "Org", orgId })

export class Reads extends Context.Tag("pgfiber/Reads")<Reads, {
  /** Live jobs, the kept history and dead letters of jobs no longer in it, as one list, newest id first. */
  readonly browse: (viewer: Viewer, filter: BrowseFilter, limit: number) => Effect.Effect<ReadonlyArray<JobSummary>, QueueError>
  /** Live jobs, oldest id first (Queue.list). */
  readonly list: (viewer: Viewer, options: ListOptions) => Effect.Effect<ReadonlyArray<Job>, QueueError>
  /** Finished jobs kept for their stage's retention, newest first (Queue.history.list). */
  readonly history: (viewer: Viewer, options: HistoryListOptions) => Effect.Effect<ReadonlyArray<Job>, QueueError>
  /** Depth per stage, every org's (Queue.stats). */
  readonly stats: Effect.Effect<ReadonlyArray<StageStats>, QueueError>
  /** The newest dead letter a job became, if any. */
  readonly deadLetterOfJob: (viewer: Viewer, jobId: string) => Effect.Effect<string | null, QueueError>
  /** Open dead letters of a stage and org (null: any), oldest first: the targets of a bulk retry or resolve. */
  readonly openDeadLetterIds: (
    viewer: Viewer,
    filter: { readonly stage: string | null; readonly org: string | null },
    limit: number
  ) => Effect.Effect<ReadonlyArray<string>, QueueError>
  /** How many dead letters a purge with these settings would delete. */
  readonly countPurgeable: (
    viewer: Viewer,
    options: { readonly olderThanMs: number | null; readonly includeUnresolved: boolean }
  ) => Effect.Effect<number, QueueError>
  /** How many queued jobs a stage purge would delete: every org's. */
  readonly countQueued: (stage: string) => Effect.Effect<number, QueueError>
  /**
   * The newest `limit` events of the event log the viewer may see (an operator's `org` narrows to one org), newest
   * first. Postgres only: the memory twin keeps no log, and has none to show.
   */
  readonly recentEvents: (
    viewer: Viewer,
    filter: { readonly org?: string | undefined; readonly stages?: ReadonlyArray<string> | undefined; readonly kinds?: ReadonlyArray<EventLog.Kind> | undefined },
    limit: number
  ) => Effect.Effect<ReadonlyArray<EventLog.LoggedEvent>, QueueError>
  /** Everything the dashboard shows live, every org's; `watched`: the jobs open job pages follow. */
  readonly snapshot: (watched: ReadonlyArray<string>, minutes: number) => Effect.Effect<LiveSnapshot, QueueError>
}>() {}

/** Runs `effect` as the viewer may: as the owner for an operator, else under the org's row-level security. */
const asViewer = (viewer: Viewer) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  viewer._tag === "Operator" ? Db.asOwner(effect) : Db.forOrg(viewer.orgId)(effect)

const decodeSummaries = PgQueue.decodeRows("the browse", JobSummaryFromRow)
const decodeSnapshot = PgQueue.decodeRows("the live snapshot", LiveSnapshot)
const column = <S extends Schema.Schema.Any>(schema: S, name: string) => Schema.propertySignature(schema).pipe(Schema.fromKey(name))
/** `EventLog.LoggedEvent` from a row of EventsSql.recentEvents (its instant a Date, as the driver gives it). */
const decodeEvents = PgQueue.decodeRows("job_events", Schema.Struct({
  ...EventLog.LoggedEvent.fields,
  jobId: column(Schema.String, "job_id"),
  orgId: column(Schema.NullOr(Schema.String), "org_id"),
  subjectId: column(Schema.NullOr(Schema.String), "subject_id"),
  at: Schema.DateFromSelf
}))

/** Reads on `db` (the primary, or a replica with the primary's schema). */
export const makeWith = (db: Db.Db["Type"], options: QueueOptions = {}) =>
  Effect.gen(function*() {
    // PgQueue's own reads (list, history, stats) on this pool: the same statements, not copies
    const queue = yield* PgQueue.make(options).pipe(Effect.provideService(Db.Db, db))
    const count = (rows: ReadonlyArray<{ readonly n: number }>) => rows[0]?.n ?? 0
    // the edge: each read's Db failures become the Queue's error, named by the read (PgQueue's own are named already)
    return Reads.of({
      browse: (viewer, filter, limit) =>
        asViewer(viewer)(db.run((sql) => BrowseSql.browseJobs(sql, filter, limit))).pipe(
          Effect.flatMap(decodeSummaries),
          PgQueue.atEdge("Reads.browse")
        ),
      list: (viewer, o) => asViewer(viewer)(queue.list(o)),
      history: (viewer, o) => asViewer(viewer)(queue.history.list(o)),
      stats: Db.asOwner(queue.stats),
      deadLetterOfJob: (viewer, jobId) =>
        asViewer(viewer)(db.run((sql) => BrowseSql.deadLetterOfJob(sql, jobId))).pipe(
          PgQueue.atEdge("Reads.deadLetterOfJob"),
          Effect.map((rows) => rows[0]?.id ?? null)
        ),
      openDeadLetterIds: (viewer, f, limit) =>
        asViewer(viewer)(db.run((sql) => BrowseSql.openDeadLetterIds(sql, f.stage, f.org, limit))).pipe(
          PgQueue.atEdge("Reads.openDeadLetterIds"),
          Effect.map((rows) => rows.map((r) => r.id))
        ),
      countPurgeable: (viewer, o) =>
        asViewer(viewer)(db.run((sql) => BrowseSql.countPurgeable(sql, o.olderThanMs, o.includeUnresolved))).pipe(
          PgQueue.atEdge("Reads.countPurgeable"),
          Effect.map(count)
        ),
      countQueued: (stage) =>
        Db.asOwner(db.run((sql) => BrowseSql.countQueued(sql, stage))).pipe(PgQueue.atEdge("Reads.countQueued"), Effect.map(count)),
      recentEvents: (viewer, f, limit) =>
        asViewer(viewer)(db.run((sql) =>
          EventsSql.recentEvents(sql, {
            // an org's viewer is held to its org by row-level security, and named here too
            org: viewer._tag === "Org" ? viewer.orgId : f.org ?? null,
            stages: f.stages && f.stages.length > 0 ? f.stages : null,
            kinds: f.kinds && f.kinds.length > 0 ? f.kinds : null
          }, limit)
        )).pipe(Effect.flatMap(decodeEvents), PgQueue.atEdge("Reads.recentEvents")),
      snapshot: (watched, minutes) =>
        Db.asOwner(db.run((sql) => StatsSql.liveSnapshot(sql, watched, minutes))).pipe(
          // its one row
          Effect.flatMap((rows) => decodeSnapshot(rows.slice(0, 1))),
          Effect.flatMap(([snapshot]) =>
            snapshot === undefined ? Effect.fail(new PgQueue.RowMismatch({ message: "the live snapshot returned no row" })) : Effect.succeed(snapshot)),
          PgQueue.atEdge("Reads.snapshot")
        )
    })
  })

/**
 * `DATABASE_READ_URL`: where the reads go (a read replica of the primary, the same schema); unset, the primary.
 * `DB_READ_POOL_MAX`: that pool's most connections.
 */
export const config = Config.all({
  url: Config.option(
    Config.redacted("DATABASE_READ_URL").pipe(
      Config.validate({
        message: "DATABASE_READ_URL must be a postgres:// or postgresql:// URL",
        validation: (url) => /^postgres(ql)?:\/\/\S+$/.test(Redacted.value(url))
      })
    )
  ),
  poolMax: Config.integer("DB_READ_POOL_MAX").pipe(
    Config.validate({ message: "must be between 1 and 1000", validation: (n) => n >= 1 && n <= 1000 }),
    Config.withDefault(5)
  )
})

/**
 * Reads on the replica `DATABASE_READ_URL` names (a pool of its own, probed at start: a bad value fails naming the
 * variable), or on the primary `Db` when it is unset.
 */
export const layerWith = (options: QueueOptions = {}) =>
  Layer.scoped(
    Reads,
    Effect.gen(function*() {
      const primary = yield* Db.Db
      const cfg = yield* config
      const db = Option.isNone(cfg.url) ? primary : yield* Db.make({
        url: cfg.url.value,
        urlName: "DATABASE_READ_URL",
        schema: primary.schema,
        poolMax: cfg.poolMax,
        applicationName: "pgfiber-read"
      })
      return yield* makeWith(db, options)
    })
  )

/** `layerWith()`, one value: provided in several places of one composition, it is built once (one read pool). */
export const layer = layerWith()

// ---- the memory twin: over a Queue's reads (MemoryQueue's state); org scoping applied here, as RLS would ----

const everything = 10_000

const seenBy = (viewer: Viewer) => (orgId: string | null) => viewer._tag === "Operator" || orgId === viewer.orgId

const summaryOfLive = (j: Job, now: number): JobSummary => ({
  id: j.id, stage: j.stage, orgId: j.orgId, subjectId: j.subjectId,
  status: j.status === "queued" && j.availableAt.getTime() > now ? "delayed" : j.status,
  attempts: j.attempts, maxAttempts: j.maxAttempts, createdAt: j.createdAt, updatedAt: j.updatedAt,
  availableAt: j.availableAt, lastError: j.lastError, deadLetterId: null
})

const summaryOfKept = (j: Job): JobSummary => ({
  id: j.id, stage: j.stage, orgId: j.orgId, subjectId: j.subjectId, status: j.status, attempts: j.attempts,
  maxAttempts: j.maxAttempts, createdAt: j.createdAt, updatedAt: j.finishedAt ?? j.updatedAt, availableAt: null,
  lastError: j.lastError, deadLetterId: null
})

const summaryOfDead = (d: DeadLetter): JobSummary => ({
  id: d.jobId, stage: d.stage, orgId: d.orgId, subjectId: d.subjectId, status: "dead", attempts: d.attempts,
  maxAttempts: d.maxAttempts, createdAt: d.jobCreatedAt, updatedAt: d.deadAt, availableAt: null, lastError: d.reason,
  deadLetterId: d.id
})

const liveParts: ReadonlyArray<BrowseStatus> = ["waiting", "queued", "delayed", "running", "cancelled"]
const keptParts: ReadonlyArray<BrowseStatus> = ["completed", "dead", "cancelled"]

const browseMatches = (f: BrowseFilter, payload: unknown, s: JobSummary, viewer: Viewer) =>
  seenBy(viewer)(s.orgId) &&
  (f.stage === null || s.stage === f.stage) &&
  (f.status === null || s.status === f.status) &&
  (f.org === null || s.orgId === f.org) &&
  (f.subject === null || s.subjectId === f.subject) &&
  (f.since === null || s.createdAt >= f.since) &&
  (f.until === null || s.createdAt < f.until) &&
  (f.id === null || BigInt(s.id) === BigInt(f.id)) &&
  (f.before === null || BigInt(s.id) < BigInt(f.before)) &&
  (f.payload === null || f.payload === undefined || Bulk.jsonContains(payload, JSON.parse(f.payload))) &&
  (f.error === null || f.error === undefined || (s.lastError ?? "").toLowerCase().includes(f.error.toLowerCase()))

const makeMemory = (queue: Queue["Type"]) => {
  const allDead = queue.deadLetters.list({ unresolvedOnly: false, limit: everything })
  const browse = (viewer: Viewer, f: BrowseFilter, limit: number) =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const live = f.status === null || liveParts.includes(f.status) ? yield* queue.list({ limit: everything }) : []
      const kept = f.status === null || keptParts.includes(f.status) ? yield* queue.history.list({ limit: everything }) : []
      const keptIds = new Set(kept.map((j) => j.id))
      const dead = f.status === null || f.status === "dead" ? (yield* allDead).filter((d) => !keptIds.has(d.jobId)) : []
      const rows: Array<[JobSummary, unknown]> = [
        ...live.map((j): [JobSummary, unknown] => [summaryOfLive(j, now), j.payload]),
        ...kept.map((j): [JobSummary, unknown] => [summaryOfKept(j), j.payload]),
        ...dead.map((d): [JobSummary, unknown] => [summaryOfDead(d), d.payload])
      ]
      return rows.filter(([s, payload]) => browseMatches(f, payload, s, viewer)).map(([s]) => s)
        .sort((a, b) => (BigInt(b.id) > BigInt(a.id) ? 1 : BigInt(b.id) < BigInt(a.id) ? -1 : 0))
        .slice(0, limit)
    })

  const snapshot = (watched: ReadonlyArray<string>, _minutes: number) =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const live = yield* queue.list({ limit: everything })
      const open = yield* queue.deadLetters.list({ unresolvedOnly: true, limit: everything })
      const depth = new Map<string, { -readonly [K in keyof LiveSnapshot["depth"][number]]: LiveSnapshot["depth"][number][K] }>()
      const at = (stage: string, orgId: string | null) => {
        const key = JSON.stringify([stage, orgId])
        if (!depth.has(key)) {
          depth.set(key, { stage, org: orgId, ready: 0, delayed: 0, running: 0, cancelling: 0, dead: 0, oldest_ready_ms: null })
        }
        return depth.get(key)!
      }
      const workers = new Map<string, { worker: string; stage: string; org: string | null; running: number }>()
      for (const j of live) {
        const d = at(j.stage, j.orgId)
        if (j.status === "running") d.running++
        else if (j.status === "cancelled") d.cancelling++
        else if (j.status === "queued" && j.availableAt.getTime() > now) d.delayed++
        else if (j.status === "queued") {
          d.ready++
          d.oldest_ready_ms = Math.max(d.oldest_ready_ms ?? 0, now - j.availableAt.getTime())
        }
        if (j.status !== "queued" && j.lockedBy !== null) {
          const key = JSON.stringify([j.lockedBy, j.stage, j.orgId])
          const w = workers.get(key) ?? { worker: j.lockedBy, stage: j.stage, org: j.orgId, running: 0 }
          w.running++
          workers.set(key, w)
        }
      }
      for (const d of open) at(d.stage, d.orgId).dead++
      const iso = (d: Date | null) => (d === null ? null : d.toISOString())
      const stats = yield* queue.stats
      const controls = yield* queue.stageControls.list
      return {
        now: new Date(now),
        depth: [...depth.values()],
        workers: [...workers.values()],
        series: [],
        watched: live.filter((j) => watched.includes(j.id)).map((j) => ({
          id: j.id, stage: j.stage, org_id: j.orgId, status: j.status as LiveSnapshot["watched"][number]["status"],
          attempts: j.attempts, max_attempts: j.maxAttempts, polls: j.polls, available_at: iso(j.availableAt),
          locked_by: j.lockedBy, locked_until: iso(j.lockedUntil), last_error: j.lastError, updated_at: j.updatedAt.toISOString(),
          started_at: iso(j.startedAt), progress: j.progress, progress_message: j.progressMessage
        })),
        paused: controls.filter((c) => c.paused).map((c) => c.stage),
        rate_limited: stats.filter((s) => s.rateLimited).map((s) => s.stage)
      } satisfies LiveSnapshot
    })

  return Reads.of({
    browse,
    list: (viewer, o) =>
      Effect.map(queue.list({ ...o, limit: everything }), (jobs) => jobs.filter((j) => seenBy(viewer)(j.orgId)).slice(0, o.limit ?? 100)),
    history: (viewer, o) =>
      Effect.map(queue.history.list({ ...o, limit: everything }), (jobs) => jobs.filter((j) => seenBy(viewer)(j.orgId)).slice(0, o.limit ?? 100)),
    stats: queue.stats,
    deadLetterOfJob: (viewer, jobId) =>
      Effect.map(allDead, (all) =>
        all.filter((d) => d.jobId === jobId && seenBy(viewer)(d.orgId)).sort((a, b) => Number(b.id) - Number(a.id))[0]?.id ?? null),
    openDeadLetterIds: (viewer, f, limit) =>
      Effect.map(queue.deadLetters.list({ unresolvedOnly: true, limit: everything, ...(f.stage === null ? {} : { stage: f.stage }) }), (all) =>
        all.filter((d) => seenBy(viewer)(d.orgId) && (f.org === null || d.orgId === f.org))
          .sort((a, b) => Number(a.id) - Number(b.id)).slice(0, limit).map((d) => d.id)),
    countPurgeable: (viewer, o) =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const all = yield* allDead
        return all.filter((d) =>
          seenBy(viewer)(d.orgId) && (o.includeUnresolved || d.resolutionStatus !== null) &&
          (o.olderThanMs === null || d.deadAt.getTime() < now - o.olderThanMs)
        ).length
      }),
    countQueued: (stage) => Effect.map(queue.list({ stage, status: "queued", limit: everything }), (jobs) => jobs.length),
    recentEvents: () => Effect.succeed([]),
    snapshot
  })
}

/** Reads over the Queue in context (MemoryQueue in unit tests). */
export const layerMemory = Layer.effect(Reads, Effect.map(Queue, makeMemory))
