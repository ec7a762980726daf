/**
 * The one source of everything the dashboard shows live, shared by every open page of a server: a single
 * read (Reads.snapshot: depth per stage and org, workers, the last hour of per-minute counts, the jobs open job
 * pages watch; on the read replica when one is configured) run by one fiber, never by a viewer. It runs only while someone watches: soon
 * after something happened (a NOTIFY of new jobs, or of the event log while someone watches, an event of this
 * process's jobs bus, a new viewer), at most once
 * per `minInterval`, and otherwise once per `idleInterval`. So twenty open dashboards cost the database what
 * one does: one statement per idle interval. Viewers get the snapshot filtered to what their key may see.
 */
import { Config, Context, Duration, Effect, Layer, Option, Queue as Q, RcRef, Ref, Stream, SubscriptionRef } from "effect"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as Events from "pgfiber/internal/runtime/Events.js"
import * as Waker from "pgfiber/internal/runtime/Waker.js"

export interface LiveOptions {
  /** The least time between two snapshots, however busy the queue. */
  readonly minInterval: Duration.Duration
  /** How often a snapshot is taken while viewers watch and nothing happens. */
  readonly idleInterval: Duration.Duration
  /** How many minutes of per-minute counts the charts show. */
  readonly minutes: number
}

export const config: Config.Config<LiveOptions> = Config.all({
  minInterval: Millis.config("DASHBOARD_LIVE_MIN_MS", { min: 100, max: 60_000, fallback: 1000 }),
  idleInterval: Millis.config("DASHBOARD_LIVE_IDLE_MS", { min: 1000, max: 3_600_000, fallback: 10_000 }),
  minutes: Config.succeed(60)
})

export const defaults: LiveOptions = { minInterval: Duration.seconds(1), idleInterval: Duration.seconds(10), minutes: 60 }

export interface Snapshot {
  readonly at: Date
  readonly row: Queue.LiveSnapshot
  /** The jobs this snapshot looked for: one not in `row.watched` has left the jobs table. */
  readonly looked: ReadonlySet<string>
}

export class Live extends Context.Tag("pgfiber/dashboard/Live")<Live, {
  /** Snapshots as they are taken, the latest first, for the life of the stream; `watch` adds a job to them. */
  readonly changes: (watch?: string | undefined) => Stream.Stream<Snapshot, never, never>
  /** A snapshot no older than the minimum interval (taken now if need be; shared by concurrent callers). */
  readonly latest: Effect.Effect<Snapshot, Queue.QueueError>
  /** A snapshot taken now (after an action that changed what it shows), which every viewer then gets too. */
  readonly fresh: Effect.Effect<Snapshot, Queue.QueueError>
  /** Statements run so far (for tests and the bench). */
  readonly statements: Effect.Effect<number>
  readonly viewers: Effect.Effect<number>
}>() {}

export const make = (options: LiveOptions) =>
  Effect.gen(function*() {
    const reads = yield* Reads.Reads
    const queue = yield* Queue.Queue
    const bus = yield* Events.current
    const current = yield* SubscriptionRef.make<Snapshot | null>(null)
    const dirty = yield* Q.sliding<void>(1)
    const viewersChanged = yield* Q.sliding<void>(1)
    const viewers = yield* Ref.make(0)
    const watched = new Map<string, number>()
    const lock = yield* Effect.makeSemaphore(1)
    let statements = 0

    const markDirty = () => Q.unsafeOffer(dirty, undefined)

    const take = Effect.gen(function*() {
      statements++
      const looked = new Set(watched.keys())
      const row = yield* reads.snapshot([...looked], options.minutes)
      const snapshot: Snapshot = { at: new Date(), row, looked }
      yield* SubscriptionRef.set(current, snapshot)
      return snapshot
    })

    const latest = lock.withPermits(1)(
      Effect.flatMap(SubscriptionRef.get(current), (s) =>
        s !== null && Date.now() - s.at.getTime() < Duration.toMillis(options.minInterval) ? Effect.succeed(s) : take)
    )

    // while anyone watches: a snapshot, then a pause of at least minInterval, then wait for news or the idle interval
    const loop = Effect.gen(function*() {
      if ((yield* Ref.get(viewers)) === 0) {
        yield* Q.take(viewersChanged)
        return
      }
      yield* latest.pipe(Effect.catchAll((e) => Effect.logWarning("dashboard snapshot failed", e.message)))
      yield* Effect.sleep(options.minInterval)
      const rest = Duration.subtract(options.idleInterval, options.minInterval)
      yield* Effect.raceFirst(Q.take(dirty), Effect.sleep(rest))
    }).pipe(
      Effect.catchAllCause((cause) => Effect.logWarning("dashboard live loop failed; continuing", cause).pipe(Effect.zipRight(Effect.sleep("1 second")))),
      Effect.forever,
      Effect.annotateLogs({ component: "dashboard-live" })
    )
    yield* Effect.forkScoped(loop)

    // new jobs (the insert trigger's NOTIFY): heard through the worker's Waker on the process's one LISTEN
    // connection; a server that runs no worker listens itself (then that is its only LISTEN connection)
    const waker = yield* Effect.serviceOption(Waker.Waker)
    const ownListen = Option.isSome(waker) ? undefined : yield* queue.listen({ onWake: markDirty, onListening: markDirty })
    if (Option.isSome(waker)) yield* waker.value.observe(markDirty)
    // and, while someone watches, the event log's notifications (jobs claimed and settled in any process), on the
    // same connection; an observer of its own (the Waker's observers are a set)
    const eventsHeard = () => markDirty()
    const hearingEvents = yield* RcRef.make({
      acquire: Option.isSome(waker) ? waker.value.observe(eventsHeard, { events: true }) : ownListen!.followEvents
    })
    // jobs this process enqueued, started or settled (the events bus): the view refreshes within minInterval
    yield* Effect.forkScoped(bus.subscribe().pipe(Stream.runForEach(() => Effect.sync(markDirty))))

    const join = (watch: string | undefined) =>
      Effect.acquireRelease(
        Effect.gen(function*() {
          if (watch !== undefined) watched.set(watch, (watched.get(watch) ?? 0) + 1)
          yield* Ref.update(viewers, (n) => n + 1)
          Q.unsafeOffer(viewersChanged, undefined)
          markDirty()
        }),
        () =>
          Effect.gen(function*() {
            if (watch !== undefined) {
              const n = (watched.get(watch) ?? 1) - 1
              if (n <= 0) watched.delete(watch)
              else watched.set(watch, n)
            }
            yield* Ref.update(viewers, (n) => n - 1)
          })
      ).pipe(Effect.zipLeft(RcRef.get(hearingEvents)))

    const changes = (watch?: string | undefined): Stream.Stream<Snapshot> =>
      Stream.unwrapScoped(
        Effect.map(join(watch), () =>
          current.changes.pipe(
            // a watched job is only known to snapshots taken since it was added
            Stream.filter((s): s is Snapshot => s !== null && (watch === undefined || s.looked.has(watch)))
          ))
      )

    return Live.of({
      changes,
      latest,
      fresh: lock.withPermits(1)(take),
      statements: Effect.sync(() => statements),
      viewers: Ref.get(viewers)
    })
  })

export const layer = (options: LiveOptions = defaults) => Layer.scoped(Live, make(options))
