/**
 * The Queue service: every way a producer, a worker or an operator touches jobs. Two implementations stand
 * behind this one tag and pass one contract suite: `PgQueue` (the product) and `MemoryQueue` (unit tests).
 */
import { Config, Context, Duration, Effect, Either, Schema, Scope } from "effect"
import * as ConfigError from "effect/ConfigError"
import type {
  CancelOutcome,
  DeadLetter,
  Batch,
  BatchOptions,
  DeadLetterListOptions,
  Dependencies,
  Beat,
  EnqueueResult,
  HistoryListOptions,
  InvalidJob,
  Job,
  JobId,
  JobNotFound,
  ListOptions,
  NewJob,
  Retention,
  StageControl,
  StageStats
} from "./Job.js"

import type * as Bulk from "./Bulk.js"
import type * as Limits from "./Limits.js"
import type * as Registry from "./Registry.js"
import type { Outcome, Settled, SettleOptions } from "./Outcome.js"

export * from "./Job.js"
export * as Outcome from "./Outcome.js"
export * as Limits from "./Limits.js"
export * as Bulk from "./Bulk.js"
export * as Registry from "./Registry.js"

/**
 * The queue's storage failed `operation` ("Queue.claim", "Reads.browse"): callers of the Queue match this, never the
 * storage's own error. `unavailable`: the database could not be reached (try again later); `code`: the SQLSTATE (or
 * the driver's connection code) when there is one, e.g. 40P01 for a transaction rolled back for another's sake.
 * `cause`: the storage's error, for the log; as stored or sent it is its name and message only (`Schema.Defect`).
 */
export class QueueError extends Schema.TaggedError<QueueError>()("QueueError", {
  operation: Schema.String,
  message: Schema.String,
  code: Schema.optional(Schema.String),
  unavailable: Schema.Boolean,
  cause: Schema.optional(Schema.Defect)
}) {}

export interface ClaimOptions {
  readonly workerId: string
  readonly leaseFor: Duration.Duration
  /** The stage's limits from code and configuration (run-time overrides apply over them); default: fair only. */
  readonly shares?: Limits.Shares | undefined
}

export interface Wakeups {
  /** A job was inserted (or made ready again) for this stage. */
  readonly onWake: (stage: string) => void
  /** The listener (re)connected: notifications may have been missed, so catch up. */
  readonly onListening: () => void
  /** The listener's connection dropped (or LISTEN failed): no notification arrives until `onListening`. */
  readonly onDown?: (reason: string) => void
}

/**
 * What a subscription can do on its own LISTEN connection (a session, direct to the database also behind a
 * pooler): hold each stage's wake lead (a session-level advisory lock, released when the connection drops) and
 * send a notification to every listener.
 */
export interface Listening {
  /** Tries to take the wake lead of each stage; answers the stages this subscription now leads. */
  readonly tryLead: (stages: ReadonlyArray<string>) => Effect.Effect<ReadonlyArray<string>, QueueError>
  /** Gives a stage's lead up. */
  readonly unlead: (stage: string) => Effect.Effect<void, QueueError>
  /** NOTIFYs every listener with this topic. */
  readonly notify: (topic: string) => Effect.Effect<void, QueueError>
  /**
   * While in scope, the subscription also hears the event log's notifications (`eventsTopic`, to `onWake`) on the
   * same connection: they have a channel of their own (migration 0027), so that workers that do not follow the
   * log never hear them. Returns once they are heard (or at once while the connection is down: its reconnect
   * then listens for them before `onListening`). At most one at a time per subscription.
   */
  readonly followEvents: Effect.Effect<void, never, Scope.Scope>
}

export interface NextWake {
  /** A queued job of one of the stages falls due. */
  readonly jobDueInMs: number | null
  /** The stages (of those asked about) with a job due now. */
  readonly dueNow: ReadonlyArray<string>
  /** Some in-flight job's lease (any stage, any worker) expires: the reaper's cue. */
  readonly leaseExpiresInMs: number | null
}

export interface ReapResult {
  readonly requeued: number
  readonly deadLettered: number
  readonly removedCancelled: number
  /** False when another process held the reaper lock. */
  readonly ran: boolean
}

export class Queue extends Context.Tag("pgfiber/Queue")<Queue, {
  /** Writes the jobs (in the caller's transaction when inside `transaction`); all or none. */
  readonly enqueue: (jobs: ReadonlyArray<NewJob>) => Effect.Effect<ReadonlyArray<EnqueueResult>, InvalidJob | QueueError>
  /** Runs `effect` so its enqueues commit (and notify) together with it, or not at all. */
  readonly transaction: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | QueueError, R>
  /** Leases up to `limit` due jobs of a stage: priority, then available_at, then id; SKIP LOCKED. */
  readonly claim: (stage: string, limit: number, options: ClaimOptions) => Effect.Effect<ReadonlyArray<Job>, QueueError>
  /**
   * `claim`, with what the stage's limits did: within the most urgent ready priority, orgs take turns (each
   * org's r-th job before any org's (r+1)-th, at most ceil(limit / orgs) each); caps count running leases in
   * every process; a token bucket is spent per claimed job. Says when the bucket or a cap left jobs waiting.
   */
  readonly claimBatch: (stage: string, limit: number, options: ClaimOptions) => Effect.Effect<Limits.ClaimResult<Job>, QueueError>
  /**
   * Run-time overrides of stages' limits, shared by every process: a change NOTIFYs `limitsTopic`, and each
   * process's claims use it from their next claim (within 10 s should the notification be missed).
   */
  readonly limits: {
    readonly list: Effect.Effect<ReadonlyMap<string, Limits.Override>, QueueError>
    /** Merges the given fields into the stage's override (null fields are left as they are). */
    readonly set: (stage: string, override: Partial<Limits.Override>) => Effect.Effect<Limits.Override, QueueError>
    /** Drops the stage's override and its token bucket; false when there was none. */
    readonly clear: (stage: string) => Effect.Effect<boolean, QueueError>
    /** Some process changed the overrides (their NOTIFY), or may have (LISTEN reconnected): read them again at the next claim. */
    readonly changed: () => void
  }
  /**
   * Extends the leases still held, writing any progress reported with them; returns the ids that were (others
   * were fenced out or cancelled).
   */
  readonly heartbeat: (leases: ReadonlyArray<Beat>, leaseFor: Duration.Duration) => Effect.Effect<ReadonlyArray<JobId>, QueueError>
  /**
   * Writes a batch of outcomes of every kind in one statement, each fenced by its job's lease (follow-ups
   * enqueued and `onDeadLettered` run in the same transaction); one result per outcome, in order.
   */
  readonly settle: (outcomes: ReadonlyArray<Outcome>, options?: SettleOptions) => Effect.Effect<ReadonlyArray<Settled>, QueueError>
  /** Inside a transaction, runs `effect` so that when it fails its writes alone roll back; else its own transaction. */
  readonly savepoint: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | QueueError, R>
  /**
   * Requeues jobs whose lease expired (their worker died), spending an attempt; one reaper at a time. A job
   * whose last attempt that was is requeued too (attempts = max): its stage's claim dead-letters it, so the
   * stage's onDeadLetter runs; `deadLettered` is always 0.
   */
  readonly reapExpired: Effect.Effect<ReapResult, QueueError>
  /**
   * When something next needs doing, in ms from now by the database clock (0 when overdue; null: nothing).
   * `seenBy`: the same statement marks that process's registered stages seen (the safety sweep's refresh).
   */
  readonly nextWake: (stages: ReadonlyArray<string>, options?: { readonly seenBy?: string | undefined }) => Effect.Effect<NextWake, QueueError>
  /** Queued: removed. Running: marked cancelled; its worker stops it at the next heartbeat. */
  readonly cancel: (id: JobId) => Effect.Effect<CancelOutcome, QueueError>
  /**
   * "Run now": a queued job whose run time is later becomes due now (its stage's workers are woken).
   * `not-delayed`: it is running, cancelled or already due; `not-found`: no live job (or not the caller's org's).
   */
  readonly runNow: (id: JobId) => Effect.Effect<"due" | "not-delayed" | "not-found", QueueError>
  /** A live job, or a finished one from the kept history (until its retention passes); null: neither. */
  readonly get: (id: JobId) => Effect.Effect<Job | null, QueueError>
  /**
   * A job's parents (what it waits on, with their outputs once completed and kept) and children (what waits on
   * it), each with its status now; null when the job is neither live nor in the history.
   */
  readonly dependencies: (id: JobId) => Effect.Effect<Dependencies | null, QueueError>
  /** Groups of jobs with callbacks enqueued exactly once when the group has finished (see `Batch`). */
  readonly batches: {
    /** A new batch (of the given org), with its first jobs; sealed unless `open`. */
    readonly create: (options: BatchOptions) => Effect.Effect<{ readonly id: string; readonly jobs: ReadonlyArray<EnqueueResult> }, InvalidJob | QueueError>
    /** Enqueues jobs into an open batch (as `enqueue` with `batchId`); a sealed or unknown one refuses. */
    readonly add: (id: string, jobs: ReadonlyArray<NewJob>) => Effect.Effect<ReadonlyArray<EnqueueResult>, InvalidJob | QueueError>
    /** No more jobs join; if all have finished, its callbacks are enqueued now. Sealing twice is harmless. */
    readonly seal: (id: string) => Effect.Effect<Batch, JobNotFound | QueueError>
    readonly get: (id: string) => Effect.Effect<Batch | null, QueueError>
  }
  readonly list: (options?: ListOptions) => Effect.Effect<ReadonlyArray<Job>, QueueError>
  readonly stats: Effect.Effect<ReadonlyArray<StageStats>, QueueError>
  readonly deadLetters: {
    readonly list: (options?: DeadLetterListOptions) => Effect.Effect<ReadonlyArray<DeadLetter>, QueueError>
    readonly get: (id: string) => Effect.Effect<DeadLetter | null, QueueError>
    /** Enqueues the payload again as a fresh job (attempts 0) and marks the dead letter retried. */
    readonly retry: (id: string) => Effect.Effect<JobId, JobNotFound | InvalidJob | QueueError>
    readonly resolve: (id: string, notes?: string) => Effect.Effect<void, JobNotFound | QueueError>
    /** Deletes resolved/retried dead letters older than `olderThan` (all resolved ones when omitted). */
    readonly purge: (options?: { readonly olderThan?: Duration.Duration; readonly includeUnresolved?: boolean }) => Effect.Effect<number, QueueError>
  }
  /** Finished jobs kept for their stage's retention (completed, dead-lettered, cancelled). */
  readonly history: {
    /** Newest first. */
    readonly list: (options?: HistoryListOptions) => Effect.Effect<ReadonlyArray<Job>, QueueError>
    /**
     * Deletes finished jobs whose retention has passed, `batch` rows per statement (each its own short
     * transaction), at most `maxBatches` statements; returns how many went.
     */
    readonly prune: (options?: { readonly batch?: number; readonly maxBatches?: number }) => Effect.Effect<number, QueueError>
  }
  /** Per-stage control, shared by every process: paused stages claim nothing until resumed. */
  readonly stageControls: {
    readonly list: Effect.Effect<ReadonlyArray<StageControl>, QueueError>
    /** Pauses (or resumes) the stage everywhere: every listening worker hears it at once. */
    readonly setPaused: (stage: string, paused: boolean, by?: string) => Effect.Effect<void, QueueError>
    /**
     * Deletes the stage's queued jobs (running ones finish); each is kept in the history as `cancelled` (for its
     * stage's retention), its last error saying who purged it (`by`). Returns how many.
     */
    readonly purge: (stage: string, by?: string) => Effect.Effect<number, QueueError>
  }
  /** The stage registry: which stages exist, declared by the processes that run them (`Registry`). */
  readonly registry: {
    /** Records (or refreshes) a process's stages: one statement. */
    readonly register: (presence: Registry.Presence, stages: ReadonlyArray<Registry.StageEntry>) => Effect.Effect<void, QueueError>
    /** The process no longer runs these stages (clean shutdown). */
    readonly unregister: (workerId: string, stages: ReadonlyArray<string>) => Effect.Effect<void, QueueError>
    /** Every registered stage with its processes, by name. */
    readonly list: Effect.Effect<ReadonlyArray<Registry.RegisteredStage>, QueueError>
  }
  /**
   * Actions on the live jobs a filter chooses (Bulk.ts). Under `Db.forOrg` (a tenant) each batch is its own
   * transaction under row-level security, so only that org's jobs are counted or changed.
   */
  readonly bulk: {
    /** How many live jobs the action would change now; nothing is changed. */
    readonly preview: (filter: Bulk.JobFilter, action: Bulk.BulkAction) => Effect.Effect<number, QueueError>
    /** Applies the action in batches to the jobs that match it (none enqueued after it started), and records it. */
    readonly apply: (filter: Bulk.JobFilter, action: Bulk.BulkAction, options: Bulk.BulkOptions) => Effect.Effect<Bulk.BulkResult, QueueError>
    /** Recorded actions, newest first. */
    readonly actions: (options?: { readonly limit?: number | undefined }) => Effect.Effect<ReadonlyArray<Bulk.ActionRecord>, QueueError>
  }
  /** Subscribes to wake-ups for the life of the scope (one LISTEN connection for Postgres). */
  readonly listen: (wakeups: Wakeups) => Effect.Effect<Listening, never, Scope.Scope>
}>() {}

export interface QueueOptions {
  readonly maxPayloadBytes?: number
  /** When set, enqueues to stages outside it and outside the stage registry are refused. */
  readonly knownStages?: ReadonlyArray<string>
  /** How long finished jobs stay readable; default from PGFIBER_RETAIN_COMPLETED (7 days). */
  readonly retention?: Retention
}

/** The NOTIFY payload of a statement that wrote to the event log, on the events channel (migrations 0020, 0027). */
export const eventsTopic = "pgfiber:events"

/** The NOTIFY payload (on the jobs channel) that says a stage was paused or resumed. */
export const stageControlsTopic = "pgfiber:stages"

/**
 * The NOTIFY payload (on the jobs channel) that says jobs were written that are not due yet: every Waker re-arms
 * its next-due timer (the insert trigger of 0017, a replacing enqueue). Workers do not ask after each claim.
 */
export const laterTopic = "pgfiber:later"

/**
 * The NOTIFY payload (on the jobs channel) that says a stage's run-time limits changed (migration 0026's trigger on
 * `stage_limits`): every process reads the overrides again, and its pools held back by a limit claim again.
 */
export const limitsTopic = "pgfiber:limits"

/**
 * A stage's wake leader asks the other processes to claim too (its claim came back full, or a job came while it
 * had no free slot): the topic `pgfiber:more:<stage>`.
 */
export const moreTopicPrefix = "pgfiber:more:"

/** A retention from text: "0" (delete at once), or a duration such as "7 days", "12 hours", "30 minutes". */
export const parseRetention = (text: string): Either.Either<Duration.Duration, string> => {
  const t = text.trim()
  if (/^0+(\.0+)?$/.test(t)) return Either.right(Duration.zero)
  const d = Duration.decodeUnknown(t)
  return d._tag === "Some" && Duration.isFinite(d.value)
    ? Either.right(d.value)
    : Either.left(`"${text}" is not 0 or a duration such as "7 days", "12 hours"`)
}

/** `PGFIBER_RETAIN_COMPLETED`: how long finished jobs stay readable, for stages that set no retention of their own. */
export const retentionConfig: Config.Config<Duration.Duration> = Config.string("PGFIBER_RETAIN_COMPLETED").pipe(
  Config.mapOrFail((text) => Either.mapLeft(parseRetention(text), (m) => ConfigError.InvalidData([], m))),
  Config.withDefault(Duration.days(7))
)

/** The queue's retention: the options' when given, else the configured default. */
export const resolveRetention = (options: QueueOptions): Effect.Effect<Retention & { readonly default: Duration.Duration }> =>
  options.retention?.default !== undefined
    ? Effect.succeed({ ...options.retention, default: options.retention.default })
    : Effect.map(Effect.orDie(retentionConfig), (d) => ({ ...options.retention, default: d }))

/** Retention as the statements take it: the default in ms and a JSON object of stage → ms. */
export const retentionParams = (r: Retention & { readonly default: Duration.Duration }) => ({
  defaultMs: Math.max(0, Duration.toMillis(r.default)),
  byStage: JSON.stringify(Object.fromEntries(Object.entries(r.stages ?? {}).map(([k, v]) => [k, Math.max(0, Duration.toMillis(v))])))
})

export const enqueueOne = (job: NewJob) =>
  Effect.flatMap(Queue, (q) => Effect.map(q.enqueue([job]), (r) => r[0]!))

/** A flow: a job and the children it waits for (each a flow in turn), enqueued together by `enqueueFlow`. */
export interface FlowNode {
  readonly job: NewJob
  readonly children?: ReadonlyArray<FlowNode> | undefined
}

/** The ids `enqueueFlow` gave a flow's jobs, in its shape. */
export interface FlowIds {
  readonly id: JobId
  readonly children: ReadonlyArray<FlowIds>
}

/**
 * Enqueues a tree in one transaction, leaves first: each job waits (`dependsOn`, `onFailure` as given in
 * `childPolicy`, default cancel) on its children, so a parent runs after all of them and reads their outputs
 * (`Queue.dependencies`, or the runtime's `Flow.childOutputs` decoded by the children's stages). A node's
 * childless children go in one batch.
 */
export const enqueueFlow = (
  flow: FlowNode,
  childPolicy: import("./Job.js").OnParentFailure = "cancel"
): Effect.Effect<FlowIds, InvalidJob | QueueError, Queue> =>
  Effect.flatMap(Queue, (q) => {
    const node = (n: FlowNode): Effect.Effect<FlowIds, InvalidJob | QueueError> =>
      Effect.gen(function*() {
        const children = n.children ?? []
        const leaves = children.filter((c) => (c.children ?? []).length === 0)
        const leafIds = leaves.length === 0 ? [] : yield* q.enqueue(leaves.map((c) => c.job))
        const inner = new Map<FlowNode, FlowIds>()
        for (const c of children) if (!leaves.includes(c)) inner.set(c, yield* node(c))
        const ids = children.map((c): FlowIds =>
          inner.get(c) ?? { id: leafIds[leaves.indexOf(c)]!.id, children: [] })
        const dependsOn = [...(n.job.dependsOn ?? []), ...ids.map((c) => ({ id: c.id, onFailure: childPolicy }))]
        const [written] = yield* q.enqueue([{ ...n.job, dependsOn }])
        return { id: written!.id, children: ids }
      })
    return q.transaction(node(flow))
  })
