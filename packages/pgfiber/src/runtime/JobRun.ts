/**
 * One claimed job, run to an outcome value: decode the payload, run the handler, and map its Exit to what
 * should become of the job — success → Complete (+ follow-ups), typed failure → the stage's RetryPolicy,
 * defect or timeout → the Defect entry (transient by default), interruption or a lost lease → Release, a
 * payload that fails its Schema or a job whose attempts are already spent → DeadLetter. Nothing here talks to
 * the queue: the pool's settler writes the values in batches, so a job's fate does not depend on how it was
 * claimed (a pool or `tick`) and costs no round trip of its own.
 */
import { Cause, Data, Duration, Effect, Either, Exit, Option, ParseResult, Schema } from "effect"
import { defaultMaxOutputBytes, type Job, jsonProblem, type Lease } from "../queue/Job.js"
import * as ErrorText from "./ErrorText.js"
import * as Outcome from "../queue/Outcome.js"
import * as Tenancy from "../queue/Tenancy.js"
import * as RetryPolicy from "./RetryPolicy.js"
import * as Stage from "./Stage.js"

/** Raised when a heartbeat finds the lease gone (cancelled, or expired and taken over). */
export class LeaseLost extends Data.TaggedError("LeaseLost")<{}> {}

/** What the run decided, plus what the settler needs to report it once the value is written. */
export interface Decided {
  readonly outcome: Outcome.Outcome
  /** Why the job would die here (read by `onDeadLetter` when the settle dead-letters it). */
  readonly kind: Stage.DeadLettered["kind"]
  /** Logged (with the job's annotations) once the outcome is settled; only the unusual paths have one. */
  readonly note?: string | undefined
}

/** The error's tag decides; anything untagged, or a thrown bug, is a defect (retried as transient). */
export const failureOf = (cause: Cause.Cause<unknown>): RetryPolicy.Failure => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) {
    return { _tag: "Defect", message: `defect: ${Cause.pretty(cause).split("\n").slice(0, 6).join("\n")}` }
  }
  const e = failure.value as { _tag?: string; message?: string }
  switch (e?._tag) {
    case "Transient":
      return { _tag: "Transient", message: e.message ?? "transient failure" }
    case "Permanent":
      return { _tag: "Permanent", message: e.message ?? "permanent failure" }
    case "RateLimited":
      return { _tag: "RateLimited", error: e as never }
    case "NotReady":
      return { _tag: "NotReady", error: e as never }
  }
  return { _tag: "Defect", message: `unexpected failure: ${String(e?.message ?? e)}` }
}

/** The run's own timeout: the job's when it has one, else the stage's. */
export const timeoutOf = (stage: { readonly timeout: Duration.Duration }, job: Job): Duration.Duration =>
  job.timeoutMs !== null ? Duration.millis(job.timeoutMs) : stage.timeout

export const jobInfo = (job: Job, run: Partial<Pick<Stage.JobInfo, "timeout" | "progress">> = {}): Stage.JobInfo => ({
  id: job.id,
  stage: job.stage,
  attempt: job.attempts + 1,
  maxAttempts: job.maxAttempts,
  polls: job.polls,
  orgId: job.orgId,
  subjectId: job.subjectId,
  createdAt: job.createdAt,
  claimedAt: job.updatedAt,
  timeout: run.timeout ?? (job.timeoutMs !== null ? Duration.millis(job.timeoutMs) : Stage.jobInfoDefaults.timeout),
  progress: run.progress ?? Stage.jobInfoDefaults.progress
})

/**
 * The handler's success value as the stage's `output` Schema encodes it: undefined when the stage has no
 * output Schema or the handler returned nothing; a Left (why) when it cannot be stored.
 */
export const encodeOutput = (stage: Stage.Any, raw: unknown): Either.Either<unknown, { tag: string; message: string }> => {
  if (stage.output === undefined || raw === undefined) return Either.right(undefined)
  const encoded = Schema.encodeUnknownEither(stage.output)(raw)
  if (Either.isLeft(encoded)) {
    return Either.left({ tag: "InvalidOutput", message: `output does not match the ${stage.name} output schema: ${ParseResult.TreeFormatter.formatErrorSync(encoded.left)}` })
  }
  const problem = jsonProblem(encoded.right, "output", new Set())
  if (problem) return Either.left({ tag: "InvalidOutput", message: problem })
  const bytes = Buffer.byteLength(JSON.stringify(encoded.right), "utf8")
  if (bytes > defaultMaxOutputBytes) {
    return Either.left({ tag: "OutputTooLarge", message: `output is ${bytes} bytes, over the limit of ${defaultMaxOutputBytes}; store it elsewhere and return its key` })
  }
  return Either.right(encoded.right)
}

export const leaseOf = (job: Job): Lease => ({ id: job.id, lease: job.lease })

/**
 * Tenancy: the handler's database work runs under the job's org (Tenancy.forOrg: row-level security in the worker
 * too, each statement or transaction as the tenant, none held open across outside calls). Jobs with no org run
 * as the owner: the pool's slots are started owner-level (`Tenancy.asOwner`), so they need no wrapper of their own.
 * Settling the outcome stays owner-level.
 */
export const underJobOrg = <A, E, R>(job: Job, handler: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  job.orgId === null ? handler : Tenancy.forOrg(job.orgId)(handler)

/** A failed run, through the stage's policy, to Retry / Reschedule / DeadLetter. */
export const decideFailure = (
  stage: Stage.Any,
  job: Job,
  failure: RetryPolicy.Failure,
  kind: Stage.DeadLettered["kind"]
): Effect.Effect<Decided> =>
  Effect.map(RetryPolicy.decide(stage.policy, failure, job.attempts + 1, job.polls), (decision): Decided => {
    const lease = leaseOf(job)
    // stored with the job, where tenants read it: without the server's paths (the log keeps the full text)
    const message = ErrorText.scrubPaths(failure._tag === "RateLimited" || failure._tag === "NotReady" ? failure.error.message : failure.message)
    switch (decision._tag) {
      case "Retry":
        return { outcome: Outcome.retry(lease, decision.delay, { tag: failure._tag, message }), kind }
      case "Reschedule":
        return { outcome: Outcome.reschedule(lease, decision.delay), kind }
      case "DeadLetter":
        return { outcome: Outcome.deadLetter(lease, { tag: failure._tag, message: ErrorText.scrubPaths(decision.reason) }), kind }
    }
  })

/**
 * A job claimed with no attempt left (its last run's lease expired: the reaper requeues such jobs rather than
 * burying them, so that the stage's own `onDeadLetter` runs here): dead-lettered without running.
 */
export const exhaustedOnClaim = (job: Job): Decided | undefined =>
  job.attempts >= job.maxAttempts
    ? {
      outcome: Outcome.deadLetter(leaseOf(job), { tag: "LeaseExpired", message: `${job.lastError ?? "lease expired"} (attempts exhausted)` }),
      kind: "exhausted"
    }
    : undefined

export const invalidPayload = (job: Job, message: string): Decided => ({
  outcome: Outcome.deadLetter(leaseOf(job), { tag: "Permanent", message: ErrorText.scrubPaths(message) }),
  kind: "invalidPayload"
})

/**
 * A handler's success value as an outcome (`decideExit`'s success case, called by the pool's slots without
 * building an Exit). `lease` is the job's, when the caller holds it already.
 */
export const decideSuccess = (stage: Stage.Any, job: Job, value: unknown, runMs?: number, lease: Lease = leaseOf(job)): Decided => {
  // the common case, a handler that returns nothing to store: no output to encode, no follow-ups to check
  if ((stage.output === undefined || value === undefined) && !Stage.isCompletion(value)) {
    return { outcome: Outcome.complete(lease, [], undefined, runMs), kind: "defect" }
  }
  const completion = Stage.isCompletion(value) ? value : undefined
  const output = encodeOutput(stage, completion ? completion.output : value)
  if (Either.isLeft(output)) {
    // retrying would produce the same value: the job dies with the reason
    return { outcome: Outcome.deadLetter(lease, output.left), kind: "failure", note: `dead-lettered: ${output.left.message}` }
  }
  // an org's job hands off within its org: a follow-up without an org takes the job's, another org is refused
  const followUps = (completion ? completion.followUps : []).map((f) =>
    f.orgId === undefined && job.orgId !== null ? { ...f, orgId: job.orgId } : f
  )
  const foreign = job.orgId === null ? undefined : followUps.find((f) => f.orgId !== job.orgId)
  if (foreign !== undefined) {
    const message = `follow-up to ${foreign.stage} names another org than the job's`
    return { outcome: Outcome.deadLetter(lease, { tag: "InvalidFollowUp", message }), kind: "defect", note: `dead-lettered: ${message}` }
  }
  return { outcome: Outcome.complete(lease, followUps, output.right, runMs), kind: "defect" }
}

/**
 * The handler's Exit as an outcome. `timedOut` and `leaseLost` say why an interruption happened (the pool's
 * watchdog and heartbeat interrupt from outside); any other interruption is shutdown: release.
 */
export const decideExit = (
  stage: Stage.Any,
  job: Job,
  exit: Exit.Exit<unknown, unknown>,
  why: { readonly timedOut: boolean; readonly leaseLost: boolean },
  /** The run's length, carried by a completion's outcome (the other kinds get it from the settler). */
  runMs?: number
): Decided | Effect.Effect<Decided> => {
  if (Exit.isSuccess(exit)) return decideSuccess(stage, job, exit.value, runMs)
  if (Cause.isInterruptedOnly(exit.cause)) {
    if (why.timedOut) {
      const message = `handler timed out after ${Duration.format(timeoutOf(stage, job))}`
      return decideFailure(stage, job, { _tag: "Defect", message }, "timeout").pipe(
        Effect.map((d) => ({ ...d, note: `handler failed: ${message}` }))
      )
    }
    return {
      outcome: Outcome.release(leaseOf(job)),
      kind: "defect",
      note: why.leaseLost ? "lease lost (cancelled or expired); job stopped" : "interrupted; job released"
    }
  }
  const failed = Cause.failureOption(exit.cause)
  if (Option.isSome(failed) && (failed.value as { _tag?: string })?._tag === "LeaseLost") {
    return { outcome: Outcome.release(leaseOf(job)), kind: "defect", note: "lease lost (cancelled or expired); job stopped" }
  }
  const failure = failureOf(exit.cause)
  const decided = decideFailure(stage, job, failure, failure._tag === "Defect" ? "defect" : "failure")
  return failure._tag === "Defect"
    ? Effect.map(decided, (d) => ({ ...d, note: `handler failed: ${failure.message}` }))
    : decided
}
