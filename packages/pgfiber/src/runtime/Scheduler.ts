/**
 * The Scheduler: turns schedules' ticks into jobs from inside a worker, with no timer or poll of its own.
 * It keeps every enabled schedule's next tick in memory and hands the earliest to the Waker as one more due
 * time (`Waker.DueSource`); when it falls due, `Schedules.fireDue` enqueues the tick's job exactly once across
 * every process (the cursor's compare-and-set, see Schedules.ts). A change to the schedules table NOTIFYs
 * `$schedules` on the jobs channel, and every running worker reloads and re-arms.
 *
 * The database's clock decides what is due: each firing learns it, and the in-memory due times are corrected
 * by the difference, so a host whose clock runs ahead does not spin asking for ticks that are not due yet.
 */
import { Clock, Duration, Effect, Layer, Queue as Q } from "effect"
import type * as Queue from "../queue/Queue.js"
import * as Schedules from "../queue/Schedules.js"
import type * as Stage from "./Stage.js"
import * as Submit from "./Submit.js"
import * as Waker from "./Waker.js"

/** The NOTIFY payload a schedules change sends (migrations/0009): no stage can be called this. */
export const topic = "$schedules"

/** After a failed firing or reload, wait this long before the next try (the sweep also retries). */
const retryAfter = Duration.seconds(5)

export const make = (declared: ReadonlyArray<Schedules.ScheduleSpec>) =>
  Effect.gen(function*() {
    const schedules = yield* Schedules.Schedules
    const waker = yield* Waker.Waker
    // code-declared schedules first, so the first load sees them; a bad one fails start-up with its reason
    if (declared.length > 0) yield* schedules.declare(declared)

    let nextTicks: ReadonlyArray<number> = []
    /** The database's clock minus ours, learnt at each firing. */
    let skewMs = 0
    let notBefore = 0

    const load = Effect.gen(function*() {
      const all = yield* schedules.list()
      nextTicks = all.filter((s) => s.enabled).map((s) => s.nextTickAt.getTime())
    })

    const backOff = (what: string) => (cause: unknown) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.zipRight(
          Effect.sync(() => (notBefore = now + Duration.toMillis(retryAfter))),
          Effect.logWarning(`scheduler: ${what} failed; retrying in ${Duration.format(retryAfter)}`, cause)
        ))

    const reloads = yield* Q.sliding<void>(1)
    yield* Effect.forkScoped(
      Q.take(reloads).pipe(
        Effect.zipRight(load),
        Effect.zipRight(waker.rearm),
        Effect.catchAllCause(backOff("loading schedules")),
        Effect.forever,
        Effect.annotateLogs({ component: "scheduler" })
      )
    )

    const fire = Effect.gen(function*() {
      const started = yield* Clock.currentTimeMillis
      const result = yield* schedules.fireDue()
      skewMs = result.now.getTime() - started
      for (const f of result.fired) {
        yield* Effect.logDebug("schedule fired").pipe(
          Effect.annotateLogs({ schedule: f.name, org: f.orgId, ticks: f.ticks.map((t) => t.toISOString()), jobIds: f.jobIds, skipped: f.skipped })
        )
        if (f.skipped > 0) yield* Effect.logInfo(`schedule ${f.name}: ${f.skipped} missed tick(s) not fired (catch-up policy)`)
      }
      // the cursors moved (ours or another process's): read them back
      yield* load
      // a cursor that did not move (its expression cannot be computed, its job is refused): not again at once
      if (nextTicks.some((t) => t <= result.now.getTime())) {
        notBefore = (yield* Clock.currentTimeMillis) + Duration.toMillis(retryAfter)
      }
    }).pipe(
      Effect.catchAllCause(backOff("firing due schedules")),
      Effect.annotateLogs({ component: "scheduler" })
    )

    yield* waker.registerDue({
      topic,
      refresh: () => Q.unsafeOffer(reloads, undefined),
      dueInMs: (now) => {
        if (nextTicks.length === 0) return null
        const due = Math.min(...nextTicks) - (now + skewMs)
        return Math.max(due, notBefore - now, 0)
      },
      fire
    })
  })

/** Runs the scheduler in a worker; `declared` are the schedules defined in code, upserted at start-up. */
export const layer = (declared: ReadonlyArray<Schedules.ScheduleSpec> = []) => Layer.scopedDiscard(make(declared))

/**
 * A schedule from an operator or a tenant, held to the same rules as a submitted job (Submit.prepare): a stage
 * this build knows (a public one for a tenant), a payload its Schema decodes (stored as the Schema encodes it), the stage's priority and
 * attempts unless given. Shared by `pgfiber schedules add` and `POST /schedules`.
 */
export const prepare = (
  stages: ReadonlyArray<Stage.Any>,
  spec: Schedules.ScheduleSpec,
  caller: "tenant" | "operator" = "operator"
): Effect.Effect<Schedules.ScheduleSpec, Queue.InvalidJob> =>
  Effect.map(
    Submit.prepare(stages, {
      caller,
      stage: spec.stage,
      payload: spec.payload,
      orgId: spec.orgId,
      priority: spec.priority,
      maxAttempts: spec.maxAttempts
    }),
    (job) => ({ ...spec, payload: job.payload, priority: job.priority, maxAttempts: job.maxAttempts })
  )
