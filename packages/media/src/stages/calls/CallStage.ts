/**
 * The shape every call stage has, written once. A stage says what is its own (name, payload, attempts, its
 * concurrency/timeout/lease defaults, its limits if it has any, its retry policy, its handler) and gets back
 * what the pipeline uses of it: the job builder the previous stage hands off with, and `make`, which builds
 * the Stage from the tuning options with the fields every call stage sets alike (see CallStore.stageFields).
 */
import type { Effect, Schema } from "effect"
import type * as JobError from "pgfiber/internal/JobError.js"
import type * as Db from "pgfiber/internal/layers/Db.js"
import type * as Limits from "pgfiber/internal/queue/Limits.js"
import type * as RetryPolicy from "pgfiber/internal/runtime/RetryPolicy.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as CallStore from "./CallStore.js"
import type * as Settings from "./Settings.js"

export interface Definition<N extends Settings.CallStageName, P extends Schema.Schema.AnyNoContext, M extends number, R, O> {
  readonly name: N
  readonly payload: P
  /** Attempts a job of this stage gets before it dead-letters; written into every job the builder makes. */
  readonly maxAttempts: M
  /** Concurrency, timeout and lease when `options` do not name this stage. */
  readonly defaults: Parameters<typeof CallStore.stageFields>[2]
  /**
   * The stage's own shares and rate limits, which `options.limits` for the stage replaces. A stage without
   * any runs under the queue's defaults and its configuration unless `options.limits` names it.
   */
  readonly limits?: Limits.StageLimits
  readonly policy: (options: Settings.CallStageOptions) => RetryPolicy.RetryPolicy
  /** The handler, given the options `make` was called with (it resolves its settings from them at run time). */
  readonly handler: (
    payload: Schema.Schema.Type<P>,
    job: Stage.JobInfo,
    options: Settings.CallStageOptions
  ) => Effect.Effect<O | Stage.Completion<O>, JobError.JobError, R>
}

/** A stage's `limits` field: none when neither the options nor the stage have any (the queue's defaults apply). */
const limitsOf = (limits: Limits.StageLimits | undefined) => limits === undefined ? {} : { limits }

export const define = <
  N extends Settings.CallStageName,
  P extends Schema.Schema.AnyNoContext,
  M extends number,
  R,
  O = void
>(definition: Definition<N, P, M, R, O>) => {
  const { handler, limits, maxAttempts, name, payload, policy } = definition
  return {
    name,
    Payload: payload,
    maxAttempts,
    job: CallStore.jobBuilder<Schema.Schema.Type<P>, Schema.Schema.Encoded<P>>(name, payload, maxAttempts),
    policy,
    make: (options: Settings.CallStageOptions = {}) =>
      // Db besides the handler's needs: a dead letter marks the call failed (CallStore.markFailedOnDeath)
      Stage.make<Schema.Schema.Type<P>, Schema.Schema.Encoded<P>, R | Db.Db, O>({
        ...CallStore.stageFields(name, options, definition.defaults),
        payload,
        ...limitsOf(options.limits?.[name] ?? limits),
        maxAttempts,
        policy: policy(options),
        handler: (value: Schema.Schema.Type<P>, job: Stage.JobInfo) => handler(value, job, options)
      })
  }
}
