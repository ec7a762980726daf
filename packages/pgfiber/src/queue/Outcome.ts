/**
 * Outcomes as values: what became of a run, decided by the runtime and written by the queue's `settle`, which
 * takes a batch of them, of every kind, and writes them in one statement fenced by each job's lease. Keeping
 * the decision (a value) apart from the write (a batch) is what lets a pool group-commit every outcome, not
 * only plain completions.
 */
import type { Duration, Effect } from "effect"
import type { Lease, NewJob } from "./Job.js"

/** The error a failed run adds to the job's history (and, when it dies, the dead-letter row's reason). */
export interface OutcomeError {
  readonly tag: string
  readonly message: string
}

export type Outcome = Outcomes & {
  /** The run's length in ms, as the worker measured it (recorded as the job's `last_run_ms`). */
  readonly runMs?: number | undefined
  /**
   * The run's last progress report, when no heartbeat has written it yet (heartbeats write it at most once a
   * second): written with the outcome, so a finished job shows what its handler reported last.
   */
  readonly progress?: { readonly value: number; readonly message: string | null } | undefined
}

type Outcomes =
  /**
   * Done: the job leaves the queue (into the kept history, with its `output`, when its stage keeps any); its
   * follow-ups are enqueued in the same transaction.
   */
  | { readonly _tag: "Complete"; readonly lease: Lease; readonly followUps: ReadonlyArray<NewJob>; readonly output?: unknown }
  /** Spends an attempt and runs again after `delay`; dead-lettered instead when no attempt is left. */
  | { readonly _tag: "Retry"; readonly lease: Lease; readonly delay: Duration.Duration; readonly error: OutcomeError }
  /** A poll that found nothing yet: runs again after `delay`, `polls` counted, no attempt spent. */
  | { readonly _tag: "Reschedule"; readonly lease: Lease; readonly delay: Duration.Duration }
  /**
   * Moves the job to the dead-letter table at once, `error.message` as the reason; a job whose attempts are already
   * spent (requeued by the reaper after its last one) keeps its error history as it is.
   */
  | { readonly _tag: "DeadLetter"; readonly lease: Lease; readonly error: OutcomeError }
  /** Hands the job back untouched (shutdown, a lost lease): queued now, no attempt spent. */
  | { readonly _tag: "Release"; readonly lease: Lease }

export const complete = (lease: Lease, followUps: ReadonlyArray<NewJob> = [], output?: unknown, runMs?: number): Outcome => {
  // fields left out rather than set to undefined: a completion is the value tests and hooks compare
  if (runMs === undefined) return output === undefined ? { _tag: "Complete", lease, followUps } : { _tag: "Complete", lease, followUps, output }
  return output === undefined ? { _tag: "Complete", lease, followUps, runMs } : { _tag: "Complete", lease, followUps, output, runMs }
}
export const retry = (lease: Lease, delay: Duration.Duration, error: OutcomeError): Outcome => ({ _tag: "Retry", lease, delay, error })
export const reschedule = (lease: Lease, delay: Duration.Duration): Outcome => ({ _tag: "Reschedule", lease, delay })
export const deadLetter = (lease: Lease, error: OutcomeError): Outcome => ({ _tag: "DeadLetter", lease, error })
export const release = (lease: Lease): Outcome => ({ _tag: "Release", lease })

/**
 * What settling did, per outcome. `fenced`: the lease had been lost (expired and taken over), nothing was
 * written. A job cancelled while it ran is removed by any outcome but Complete, which reports `released`.
 * A Complete whose follow-ups are invalid dead-letters the job (tag `InvalidFollowUp`) rather than fail
 * the whole batch.
 */
export type Settled = "completed" | "retried" | "rescheduled" | "deadLettered" | "released" | "fenced"

/** A job the settle moved to the dead-letter table: which outcome, and why. */
export interface DeadLettered {
  /** Index of the outcome in the batch. */
  readonly index: number
  readonly reason: string
  /** True when the outcome was a Retry with no attempt left. */
  readonly exhausted: boolean
}

export interface SettleOptions {
  /**
   * Runs inside the settle's transaction after the statement, with the jobs that were dead-lettered, so its
   * writes commit with them (the stages' `onDeadLetter`). Only called when at least one was. A failure here fails
   * the whole settle: a hook whose failure should roll back only its own writes runs in `Queue.savepoint`.
   */
  readonly onDeadLettered?: ((dead: ReadonlyArray<DeadLettered>) => Effect.Effect<void>) | undefined
  /**
   * How long the finished jobs of this batch stay readable in the history (the stage's retention); when
   * omitted, the queue's own retention for each job's stage. Zero: deleted at once.
   */
  readonly retain?: Duration.Duration | undefined
  /** Wake the stage in every process when its jobs settle: a claimer may be waiting for a slot under a cap. */
  readonly wakeFreed?: boolean | undefined
}
