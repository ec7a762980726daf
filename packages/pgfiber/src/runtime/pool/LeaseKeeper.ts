/**
 * The lease keeper: keeps a pool's leases alive and its handlers within their time, from two loops for the whole
 * pool (not a timer per job).
 * - heartbeat: one statement extends every held lease, every third of the lease; the handlers' latest progress
 *   rides on it (at most once a second per job). A lease not extended was lost (the job was cancelled, or its
 *   lease expired and was reaped): a running job's handler is interrupted, a waiting one is released unstarted.
 * - watchdog: interrupts a handler past its timeout (the job's own, else the stage's), looking at least once a
 *   second.
 */
import { Clock, Duration, Effect, Fiber, Scope } from "effect"
import * as Queue from "../../queue/Queue.js"
import * as Stage from "../Stage.js"
import type * as Held from "./Held.js"

export const start = (
  stage: Stage.Any,
  held: Held.Held,
  /** Releases jobs that never started (a waiting job whose lease was lost). */
  release: (entries: ReadonlyArray<Held.Entry>) => void
): Effect.Effect<void, never, Queue.Queue | Scope.Scope> =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const clock = yield* Effect.clock
    const heartbeatEvery = Stage.heartbeatEvery(stage.leaseFor)
    const timeoutMs = Duration.toMillis(stage.timeout)

    yield* Effect.forkScoped(
      Effect.gen(function*() {
        yield* Effect.sleep(heartbeatEvery)
        if (held.size === 0) return
        // progress rides on the beat: each job's latest report, written at most once a second
        const now = clock.unsafeCurrentTimeMillis()
        const entries = [...held.entries()]
        const taken: Array<[Held.Entry, Queue.Progress]> = []
        const leases = entries.map((e): Queue.Beat => {
          if (e.reported === undefined || e.mode !== "running" || now - e.reportedAt < 1000) return e.lease
          const reported = e.reported
          taken.push([e, reported])
          e.reported = undefined
          e.reportedAt = now
          return { ...e.lease, reported }
        })
        const extended = new Set(yield* queue.heartbeat(leases, stage.leaseFor).pipe(
          // not written: the reports go with the next beat, or with the outcome (unless a newer one came)
          Effect.tapErrorCause(() => Effect.sync(() => taken.forEach(([e, reported]) => e.reported ??= reported)))
        ))
        for (const entry of entries) {
          // a settling job's outcome may have been committed after this heartbeat read its lease; an entry a newer
          // claim of the same job superseded meanwhile was stopped then (Executor.accept)
          if (extended.has(entry.lease.id) || entry.mode === "settling" || held.get(entry.lease.id) !== entry) continue
          entry.leaseLost = true
          const fiber = entry.slot?.fiber
          if (entry.mode === "running" && fiber) {
            yield* Effect.logWarning("lease lost (cancelled or expired); stopping the job").pipe(
              Effect.annotateLogs({ stage: stage.name, jobId: entry.lease.id })
            )
            yield* Fiber.interruptFork(fiber)
          } else if (entry.mode === "waiting") release([entry])
        }
      }).pipe(
        Effect.catchAllCause((cause) => Effect.logWarning("heartbeat failed", cause)),
        Effect.forever
      )
    )

    yield* Effect.forkScoped(
      Effect.gen(function*() {
        yield* Effect.sleep(Duration.millis(Math.min(1000, Math.max(10, timeoutMs / 4))))
        const now = yield* Clock.currentTimeMillis
        for (const entry of held.entries()) {
          const fiber = entry.slot?.fiber
          if (entry.mode === "running" && fiber && !entry.timedOut && now - entry.startedAt >= entry.timeoutMs) {
            entry.timedOut = true
            yield* Fiber.interruptFork(fiber)
          }
        }
      }).pipe(Effect.forever)
    )
  })
