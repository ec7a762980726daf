/**
 * Job lifecycle events, in process: a typed stream of what happens to jobs (enqueued, started, progress,
 * completed, retried, dead-lettered, cancelled) for metrics, the dashboard and users' hooks.
 *
 * The engine publishes and never waits: `publish` is a synchronous offer to each subscriber's own bounded
 * queue, and a subscriber that lags loses the newest events (dropping), counted in
 * `pgfiber_events_dropped_total`; the engine's pace never depends on a subscriber's. With no subscriber a
 * publish is one array-length check: the engine also asks `active()` before building a batch of events, so
 * where it works per batch (the settler, the claim) an idle bus costs nothing per job.
 *
 * Events are facts this process saw: `Enqueued` when this process's enqueue returned (inside a transaction,
 * before it commits), the others when the worker started, reported or settled the run (after the settle
 * committed). Another process's jobs are not seen here: each process has its own bus.
 *
 * A job's events arrive in order: `Enqueued` before `Started`. An enqueue commits before it publishes, and in
 * between this process's own pool can hear the NOTIFY and claim the job (more likely when the enqueue has more to
 * write after its insert: a flow's edges, a batch's totals). So an enqueue runs `holding`: an event other than
 * `Enqueued` published while enqueues are in flight waits in the bus, in order, until those enqueues (not later
 * ones: a steady stream of overlapping enqueues holds nothing for long) have published (at most `maxHeld` events
 * wait; past that the waiting ones go on at once, still in order).
 */
import { Context, Effect, Layer, Metric, Queue as Q, Scope, Stream } from "effect"

/** What every event carries. `attempt` is 1-based (the run in hand); 0 for events outside a run. */
interface Base {
  readonly jobId: string
  readonly stage: string
  readonly orgId: string | null
  readonly attempt: number
  readonly at: Date
}

export interface EventError {
  readonly tag: string
  readonly message: string
}

export type JobEvent =
  | Base & { readonly _tag: "Enqueued"; readonly subjectId: string | null }
  | Base & { readonly _tag: "Started"; readonly workerId: string }
  | Base & { readonly _tag: "Progress"; readonly progress: number; readonly message: string | null }
  | Base & { readonly _tag: "Completed"; readonly seconds: number | null }
  | Base & { readonly _tag: "Retried"; readonly error: EventError; readonly delayMs: number; readonly seconds: number | null }
  | Base & { readonly _tag: "DeadLettered"; readonly error: EventError; readonly seconds: number | null }
  | Base & { readonly _tag: "Cancelled" }

export type Tag = JobEvent["_tag"]

/** Default room per subscriber; a subscriber further behind than this loses the newest events. */
const defaultCapacity = 4096

export const dropped = Metric.counter("pgfiber_events_dropped_total", {
  description: "Job events a lagging in-process subscriber did not receive (its buffer was full)",
  incremental: true
})

export class JobEvents extends Context.Tag("pgfiber/JobEvents")<JobEvents, {
  /** Hands events to every subscriber without waiting; full subscribers drop them (counted). */
  readonly publish: (events: ReadonlyArray<JobEvent>) => void
  /** Someone is subscribed: the engine builds events only then. */
  readonly active: () => boolean
  /** Every event published from now on while the stream runs (its subscription ends with the stream). */
  readonly subscribe: (options?: { readonly capacity?: number }) => Stream.Stream<JobEvent>
  /** The same as a dequeue, subscribed for the life of the scope (to start listening before acting). */
  readonly subscribeScoped: (options?: { readonly capacity?: number }) => Effect.Effect<Q.Dequeue<JobEvent>, never, Scope.Scope>
  /** Events dropped so far in this bus (all subscribers). */
  readonly droppedCount: () => number
  /**
   * Runs an enqueue that publishes its `Enqueued` events: until it ends, other events wait in the bus, so no
   * subscriber sees a job's `Started` before its `Enqueued` (with no subscriber, it runs the effect as it is).
   */
  readonly holding: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}>() {}

/** Most events that wait for enqueues in flight (`holding`); past it they are handed on at once (well under a subscriber's room). */
export const maxHeld = 1_000

export const make = (options: { readonly capacity?: number } = {}) =>
  Effect.sync(() => {
    const subscribers: Array<Q.Queue<JobEvent>> = []
    let droppedTotal = 0
    // enqueues in flight (`holding`, by number, in start order) and the events that wait for them, in publish
    // order, each with the last enqueue started when it was published (it waits for that one and those before)
    let lastHold = 0
    const inFlight = new Set<number>()
    let held: Array<{ readonly event: JobEvent; readonly until: number }> = []
    const deliver = (events: ReadonlyArray<JobEvent>) => {
      let lost = 0
      for (const queue of subscribers) {
        for (const event of events) if (!Q.unsafeOffer(queue, event)) lost++
      }
      if (lost > 0) {
        droppedTotal += lost
        // a counter update is synchronous under the hood; run it without blocking the publisher
        Effect.runSync(Metric.incrementBy(dropped, lost))
      }
    }
    /** Hands on the waiting events whose enqueues have all ended (from the front: `until` never decreases). */
    const flush = () => {
      let oldest = Infinity
      for (const n of inFlight) oldest = Math.min(oldest, n)
      let ready = 0
      while (ready < held.length && held[ready]!.until < oldest) ready++
      if (ready === 0) return
      const going = held.slice(0, ready).map((h) => h.event)
      held = held.slice(ready)
      if (subscribers.length > 0) deliver(going)
    }
    const publish = (events: ReadonlyArray<JobEvent>) => {
      if (subscribers.length === 0 || events.length === 0) return
      if (inFlight.size === 0) {
        flush()
        return deliver(events)
      }
      if (held.length >= maxHeld) {
        // too many waiting (an enqueue that slow gives up the guarantee): hand them on, in order
        const waiting = held.map((h) => h.event)
        held = []
        deliver(waiting)
        return deliver(events)
      }
      // a job's first event never waits; the rest wait behind the enqueues in flight now
      const first = events.filter((e) => e._tag === "Enqueued")
      if (first.length > 0) deliver(first)
      for (const e of events) if (e._tag !== "Enqueued") held.push({ event: e, until: lastHold })
    }
    const holding = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
      Effect.suspend(() => {
        if (subscribers.length === 0) return effect
        const n = ++lastHold
        inFlight.add(n)
        return Effect.ensuring(effect, Effect.sync(() => {
          inFlight.delete(n)
          flush()
        }))
      })
    const subscribeScoped = (o: { readonly capacity?: number } = {}) =>
      Effect.acquireRelease(
        Effect.map(Q.dropping<JobEvent>(Math.max(1, o.capacity ?? options.capacity ?? defaultCapacity)), (queue) => {
          subscribers.push(queue)
          return queue
        }),
        (queue) =>
          Effect.zipRight(
            Effect.sync(() => {
              const i = subscribers.indexOf(queue)
              if (i >= 0) subscribers.splice(i, 1)
            }),
            Q.shutdown(queue)
          )
      ).pipe(Effect.map((queue): Q.Dequeue<JobEvent> => queue))
    return JobEvents.of({
      publish,
      active: () => subscribers.length > 0,
      subscribe: (o) => Stream.unwrapScoped(Effect.map(subscribeScoped(o), (queue) => Stream.fromQueue(queue))),
      subscribeScoped,
      droppedCount: () => droppedTotal,
      holding
    })
  })

export const layer = (options: { readonly capacity?: number } = {}) => Layer.effect(JobEvents, make(options))

/** A bus nobody listens to: what the engine uses when no JobEvents is provided. */
export const none: Context.Tag.Service<JobEvents> = Effect.runSync(make())

/** The provided bus, or the idle one: the engine calls this once when it starts, never per job. */
export const current = Effect.map(Effect.serviceOption(JobEvents), (o) => (o._tag === "Some" ? o.value : none))

/** Subscribes to the provided bus (a stream of nothing when none is provided). */
export const subscribe = (options?: { readonly capacity?: number }) =>
  Stream.unwrap(Effect.map(current, (bus) => bus.subscribe(options)))

/** `Enqueued` events for the jobs a producer's enqueue wrote (deduplicated ones wrote nothing). */
export const enqueued = (
  jobs: ReadonlyArray<{ readonly stage: string; readonly orgId: string | null; readonly subjectId: string | null }>,
  results: ReadonlyArray<{ readonly id: string; readonly deduped: boolean }>,
  at: Date = new Date()
): Array<JobEvent> => {
  const out: Array<JobEvent> = []
  results.forEach((r, i) => {
    const job = jobs[i]
    if (!r.deduped && job) out.push({ _tag: "Enqueued", jobId: r.id, stage: job.stage, orgId: job.orgId, attempt: 0, at, subjectId: job.subjectId })
  })
  return out
}
