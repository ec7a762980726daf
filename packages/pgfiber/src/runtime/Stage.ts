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
  /** This run's own timeout (the job's, else the stage's). */
  readonly timeout: Duration.Duration
  /**
   * Reports how far the run got: a number (e.g. a percentage) and an optional short message (cut at 200
   * characters). Never waits: the pool writes the latest report with its next heartbeat (at most once a
   * second per job), and publishes a `Progress` event at once to in-process subscribers.
   */
  readonly progress: (value: number, message?: string) => Effect.Effect<void>
  /** When this run was claimed, by the database clock (what a stage's token bucket is measured against). */
  readonly claimedAt: Date
}

/**
 * A handler's success value that hands off follow-up jobs atomically (and, for a stage with an `output`
 * Schema, carries the output too). A handler may also succeed with the output alone, or with nothing.
 */
export interface Completion<O = never> {
  readonly _tag: "Completion"
  readonly followUps: ReadonlyArray<Job.NewJob>
  readonly output?: O
}

export const complete = <O = never>(followUps: ReadonlyArray<Job.NewJob> = [], ...output: [] | [O]): Completion<O> =>
  output.length === 0 ? { _tag: "Completion", followUps } : { _tag: "Completion", followUps, output: output[0] as O }

export const isCompletion = (u: unknown): u is Completion<unknown> =>
  typeof u === "object" && u !== null && (u as { _tag?: unknown })._tag === "Completion"

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

export interface StageOptions<A, I, R, O = void, OI = O> {
  readonly name: string
  /** Default `internal`: a stage is exposed to tenants only when it says so. */
  readonly visibility?: Visibility
  readonly payload: Schema.Schema<A, I>
  /**
   * What a handler's success value is: encoded by this Schema and stored with the job (`output`, returned by
   * `Queue.get` and `GET /jobs/:id`). Without it, a success value is not stored. An encoded output over the
   * payload size limit (256 KiB) dead-letters the job with `OutputTooLarge`.
   */
  readonly output?: Schema.Schema<O, OI>
  readonly handler: (payload: A, job: JobInfo) => Effect.Effect<O | Completion<O>, JobError, R>
  /**
   * How long this stage's finished jobs stay readable (GET /jobs/:id, `pgfiber jobs show`); 0: deleted at
   * once. Default: PGFIBER_RETAIN_COMPLETED (7 days).
   */
  readonly retain?: Duration.DurationInput
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

export interface Stage<A, I, R, O = void> {
  readonly name: string
  readonly visibility: Visibility
  readonly payload: Schema.Schema<A, I>
  /** Encodes the handler's success value for storage; undefined: none is stored. */
  readonly output: Schema.Schema<any, any> | undefined
  readonly handler: (payload: A, job: JobInfo) => Effect.Effect<O | Completion<O>, JobError, R>
  /** The stage's own retention for finished jobs; undefined: the queue's default. */
  readonly retain: Duration.Duration | undefined
  readonly concurrency: number
  readonly shares: Limits.Shares
  readonly leaseFor: Duration.Duration
  readonly timeout: Duration.Duration
  readonly policy: RetryPolicy.RetryPolicy
  readonly maxAttempts: number
  readonly priority: Job.Priority
  readonly onDeadLetter: ((dead: DeadLettered) => Effect.Effect<void, unknown, R>) | undefined
}

export type Any = Stage<any, any, any, any>
export type Requirements<S> = S extends Stage<any, any, infer R, any> ? R : never

/** What a run's JobInfo has besides the job's fields, for calling a handler by hand (tests): no-op progress. */
export const jobInfoDefaults: Pick<JobInfo, "timeout" | "progress"> = {
  timeout: Duration.minutes(15),
  progress: () => Effect.void
}

/**
 * A 3 s lease, heartbeated every quarter of it (750 ms): a killed worker's jobs are requeued about 3 s after its
 * last beat, so they restart within 5 s. A beat is one statement per pool (all its leases), sent only while the
 * pool holds jobs: an idle worker sends none.
 */
export const defaultLease = Duration.seconds(3)

/** How often a pool extends its leases: a quarter of the lease, so three beats can be lost before it expires. */
export const heartbeatEvery = (leaseFor: Duration.Duration) => Duration.millis(Math.max(50, Duration.toMillis(leaseFor) / 4))

export const make = <A, I, R, O = void, OI = O>(options: StageOptions<A, I, R, O, OI>): Stage<A, I, R, O> => ({
  name: options.name,
  visibility: options.visibility ?? "internal",
  payload: options.payload,
  output: options.output,
  handler: options.handler,
  retain: options.retain === undefined ? undefined : Duration.decode(options.retain),
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

/**
 * The outputs of a job's completed parents that ran on `child` (in a flow: the children a parent waited for),
 * decoded by that stage's `output` Schema, in id order. A parent that did not complete (it failed under
 * `continue`) or whose history is gone is not among them.
 */
export const childOutputs = <A, I, R, O>(
  jobId: string,
  child: Stage<A, I, R, O>
): Effect.Effect<ReadonlyArray<{ readonly id: string; readonly output: O }>, Queue.QueueError | ParseResult.ParseError, Queue.Queue> =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const links = (yield* queue.dependencies(jobId))?.parents ?? []
    const done = links.filter((l) => l.stage === child.name && l.status === "completed")
    const decode = child.output === undefined ? (u: unknown) => Effect.succeed(u as O) : Schema.decodeUnknown(child.output as Schema.Schema<O, unknown>)
    return yield* Effect.forEach(done, (l) => Effect.map(decode(l.output), (output) => ({ id: l.id, output })))
  })

/** Decodes a stored payload; a failure dead-letters the job with this message. */
export const decodePayload = <A, I, R>(stage: Stage<A, I, R>, payload: unknown) =>
  Schema.decodeUnknown(stage.payload)(payload).pipe(
    Effect.mapError((e) => `payload does not match the ${stage.name} schema: ${ParseResult.TreeFormatter.formatErrorSync(e)}`)
  )
