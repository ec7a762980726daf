/**
 * A stage, declared once: name, payload Schema, concurrency, lease, handler, retry policy. Enqueueing to it
 * is typed by its Schema; `Worker.layer` turns a list of stages into running pools.
 */
import { Duration, Effect, ParseResult, Schema } from "effect"
import type { JobError } from "../JobError.js"
import type * as Job from "../queue/Job.js"
import * as Limits from "../queue/Limits.js"
import * as Queue from "../queue/Queue.js"
import * as RetryPolicy from "./RetryPolicy.js"

/** What a handler sees of its job besides the payload. */
export interface JobInfo {
  readonly id: string
  readonly stage: string
  /** 1-based: the run in hand. */
  readonly attempt: number
  readonly maxAttempts: number
  readonly polls: number
  readonly orgId: string | null
  readonly subjectId: string | null
  readonly createdAt: Date
  /** When this run was claimed, by the database clock (what a stage's token bucket is measured against). */
  readonly claimedAt: Date
}

/** A handler's success value: plain success, or success that hands off follow-up jobs atomically. */
export interface Completion {
  readonly _tag: "Completion"
  readonly followUps: ReadonlyArray<Job.NewJob>
}

export const complete = (followUps: ReadonlyArray<Job.NewJob> = []): Completion => ({ _tag: "Completion", followUps })

/** A job that died for good, as its stage's `onDeadLetter` sees it. */
export interface DeadLettered {
  readonly job: JobInfo
  /** The message that lands in the dead-letter row. */
  readonly reason: string
  /**
   * What killed it: a typed failure the policy dead-letters (Permanent, a poll budget spent), a defect or a
   * timeout the policy dead-letters, attempts exhausted (the last run failed, or its lease expired), or a
   * payload that fails the stage's Schema.
   */
  readonly kind: "failure" | "defect" | "timeout" | "exhausted" | "invalidPayload"
}

/**
 * Who may submit jobs to a stage: `public` stages tenants may submit over the HTTP API (`POST /jobs`);
 * `internal` ones (pipeline steps, sweeps) only the system (hand-offs, triggers, sweeps) and operators (CLI).
 */
export type Visibility = "public" | "internal"

export interface StageOptions<A, I, R> {
  readonly name: string
  /** Default `internal`: a stage is exposed to tenants only when it says so. */
  readonly visibility?: Visibility
  readonly payload: Schema.Schema<A, I>
  readonly handler: (payload: A, job: JobInfo) => Effect.Effect<void | Completion, JobError, R>
  /** Jobs of this stage run at once in one process. */
  readonly concurrency?: number
  /**
   * The stage's share across every process: `fair` (default true) makes orgs take turns within a priority;
   * `maxRunning` / `maxRunningPerOrg` cap running jobs globally; `rate` is a token bucket ("500/1h", or
   * `{ limit, per, burst, perOrg }`). Configuration and run-time overrides (`pgfiber limits`) apply over these.
   */
  readonly limits?: Limits.StageLimits
  /** How long a claim holds without a heartbeat; a dead worker's job is retried after this. */
  readonly leaseFor?: Duration.DurationInput
  /** A run longer than this is interrupted and counts as a transient failure. */
  readonly timeout?: Duration.DurationInput
  readonly policy?: RetryPolicy.RetryPolicy
  /** Defaults for jobs enqueued through this stage. */
  readonly maxAttempts?: number
  readonly priority?: Job.Priority
  /**
   * Runs when a job of this stage dies for good, whatever the cause, inside the transaction that moves it to
   * the dead-letter table (so `Db.run` joins it) and a savepoint of its own: its writes commit with the dead
   * letter; when it fails, its writes roll back, the failure is logged and the dead letter still commits.
   * A pipeline marks its subject failed here.
   */
  readonly onDeadLetter?: (dead: DeadLettered) => Effect.Effect<void, unknown, R>
}

export interface Stage<A, I, R> {
  readonly name: string
  readonly visibility: Visibility
  readonly payload: Schema.Schema<A, I>
  readonly handler: (payload: A, job: JobInfo) => Effect.Effect<void | Completion, JobError, R>
  readonly concurrency: number
  readonly shares: Limits.Shares
  readonly leaseFor: Duration.Duration
  readonly timeout: Duration.Duration
  readonly policy: RetryPolicy.RetryPolicy
  readonly maxAttempts: number
  readonly priority: Job.Priority
  readonly onDeadLetter: ((dead: DeadLettered) => Effect.Effect<void, unknown, R>) | undefined
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Any = Stage<any, any, any>
export type Requirements<S> = S extends Stage<any, any, infer R> ? R : never

/** A 10 s lease, heartbeated every third of it: a crashed worker's job is requeued about 10 s after its last beat. */
export const defaultLease = Duration.seconds(10)

export const make = <A, I, R>(options: StageOptions<A, I, R>): Stage<A, I, R> => ({
  name: options.name,
  visibility: options.visibility ?? "internal",
  payload: options.payload,
  handler: options.handler,
  concurrency: options.concurrency ?? 4,
  shares: Limits.fromStage(options.limits),
  leaseFor: options.leaseFor ? Duration.decode(options.leaseFor) : defaultLease,
  timeout: options.timeout ? Duration.decode(options.timeout) : Duration.minutes(15),
  policy: options.policy ?? RetryPolicy.defaultPolicy,
  maxAttempts: options.maxAttempts ?? 5,
  priority: options.priority ?? "normal",
  onDeadLetter: options.onDeadLetter
})

export type EnqueueOptions = Omit<Job.NewJob, "stage" | "payload">

/** A NewJob for this stage with its payload encoded by the stage's Schema: for enqueue or as a follow-up. */
export const job = <A, I, R>(stage: Stage<A, I, R>, payload: A, options: EnqueueOptions = {}): Effect.Effect<Job.NewJob, Job.InvalidJob> =>
  Schema.encode(stage.payload)(payload).pipe(
    Effect.mapError((e) => new (Queue.InvalidJob)({ field: "payload", message: ParseResult.TreeFormatter.formatErrorSync(e) })),
    Effect.map((encoded) => ({
      maxAttempts: stage.maxAttempts,
      priority: stage.priority,
      ...options,
      stage: stage.name,
      payload: encoded
    }))
  )

/** Enqueues one job to a stage, typed by its payload Schema. */
export const enqueue = <A, I, R>(stage: Stage<A, I, R>, payload: A, options: EnqueueOptions = {}) =>
  Effect.flatMap(job(stage, payload, options), Queue.enqueueOne)

/** Decodes a stored payload; a failure dead-letters the job with this message. */
export const decodePayload = <A, I, R>(stage: Stage<A, I, R>, payload: unknown) =>
  Schema.decodeUnknown(stage.payload)(payload).pipe(
    Effect.mapError((e) => `payload does not match the ${stage.name} schema: ${ParseResult.TreeFormatter.formatErrorSync(e)}`)
  )
