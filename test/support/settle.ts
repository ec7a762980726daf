/**
 * Settling jobs in tests the way the runtime does: through `Queue.settle`, the queue's only way to write an
 * outcome. A test that claims jobs and finishes them by hand says which outcome with one of these.
 */
import { Effect } from "effect"
import * as Outcome from "../../packages/pgfiber/src/queue/Outcome.js"
import type * as Queue from "../../packages/pgfiber/src/queue/Queue.js"

type Q = Queue.Queue["Type"]

/** Settles one outcome; `onDead`, when given, runs as a stage's onDeadLetter does: in a savepoint, its failure logged. */
export const settleOne = (q: Q, outcome: Outcome.Outcome, onDead?: Effect.Effect<void, unknown>) =>
  Effect.map(
    q.settle([outcome], {
      onDeadLettered: onDead === undefined
        ? undefined
        : () => Effect.catchAllCause(q.savepoint(onDead), (cause) => Effect.logError("onDeadLetter failed", cause))
    }),
    (settled) => settled[0]!
  )

/** Completes the jobs (no follow-ups) in one settle; answers the ids whose lease still held, as the settler counts them. */
export const completeAll = (q: Q, leases: ReadonlyArray<Queue.Lease>) =>
  Effect.map(
    q.settle(leases.map((l) => Outcome.complete(l))),
    (settled) => leases.filter((_, i) => settled[i] === "completed").map((l) => l.id)
  )
