/**
 * Every job's events, from every process, to anyone here who follows them: the event log (queue/EventLog.ts)
 * read forward by cursor, woken by the `pgfiber:events` NOTIFY that each logging statement sends on the jobs
 * channel. The NOTIFY is heard on the process's one LISTEN connection (the Waker's; a process with no worker
 * listens once itself, for every follower), so a follower costs no connection, and nothing is read while nothing
 * happens: a follower reads when woken, and polls (backing off to `heldPollMax`) only while the log says events
 * wait for an older transaction to end, since that transaction may write no event and so NOTIFY nothing.
 *
 * Order: a follower gets events in the log's read order, which keeps each job's order (its enqueue commits
 * before its claim can see it, and so on). Resume: start after any event id within the retention.
 */
import { Chunk, Context, Duration, Effect, Layer, Option, Queue as Q, Stream } from "effect"
import * as EventLog from "../queue/EventLog.js"
import * as Queue from "../queue/Queue.js"
import * as Waker from "./Waker.js"

/** The NOTIFY payload of a statement that logged events (migration 0020). */
export const topic = "pgfiber:events"

export interface FollowOptions {
  /** Where to start: "now" (default), "beginning" (everything kept), or after this event id (Last-Event-ID). */
  readonly from?: "now" | "beginning" | { readonly after: string } | undefined
  /** Events per read. */
  readonly pageSize?: number | undefined
  /**
   * Runs once the follower has its cursor (and hears wake-ups): from here on, every event logged is delivered.
   * A caller that starts work of its own only once following (a CLI's readiness line) waits for this.
   */
  readonly onFollowing?: Effect.Effect<void> | undefined
}

export class EventFeed extends Context.Tag("pgfiber/EventFeed")<EventFeed, {
  /** The log's events that pass `filter`, from `options.from` on, until the stream ends. */
  readonly follow: (filter: EventLog.Filter, options?: FollowOptions) => Stream.Stream<EventLog.LoggedEvent, EventLog.EventLogError>
  /** Followers now (for tests and health). */
  readonly followers: () => number
}>() {}

/** The slowest look while events are held back by an older transaction (it starts at 20 ms and doubles). */
export const heldPollMax = Duration.seconds(1)

/**
 * The least time between two reads of one follower that is caught up: a busy queue sends a NOTIFY per claim and
 * settle, and reading after each would cost a statement each; waiting this long gathers them into one page.
 */
export const minReadSpacing = Duration.millis(25)

export const make = Effect.gen(function*() {
  const log = yield* EventLog.EventLog
  const queue = yield* Queue.Queue
  const wakes = new Set<() => void>()
  const hear = (t: string) => {
    // "" is a reconnect of the listener: notifications may have been missed
    if (t === topic || t === "") wakes.forEach((wake) => wake())
  }
  const waker = yield* Effect.serviceOption(Waker.Waker)
  if (Option.isSome(waker)) yield* waker.value.observe(hear)
  else yield* queue.listen({ onWake: hear, onListening: () => hear("") })

  const follow = (filter: EventLog.Filter, options: FollowOptions = {}) =>
    Stream.unwrapScoped(
      Effect.gen(function*() {
        const woken = yield* Q.sliding<void>(1)
        const wake = () => Q.unsafeOffer(woken, undefined)
        // hear wake-ups before taking the cursor, so nothing logged after it goes unread
        yield* Effect.acquireRelease(Effect.sync(() => wakes.add(wake)), () => Effect.sync(() => wakes.delete(wake)))
        const from = options.from ?? "now"
        let cursor = from === "now"
          ? yield* log.now
          : from === "beginning"
          ? EventLog.beginning
          : yield* log.after(from.after, filter)
        if (options.onFollowing) yield* options.onFollowing
        let caughtUp = false
        let held = false
        let heldWaitMs = 20
        const pageSize = options.pageSize ?? 1000
        let lastReadAt = 0
        const waitForNews = Effect.gen(function*() {
          if (!held) {
            heldWaitMs = 20
            yield* Q.take(woken)
          } else {
            yield* Effect.raceFirst(Q.take(woken), Effect.sleep(Duration.millis(heldWaitMs)))
            heldWaitMs = Math.min(heldWaitMs * 2, Duration.toMillis(heldPollMax))
          }
          const since = Date.now() - lastReadAt
          if (since < Duration.toMillis(minReadSpacing)) yield* Effect.sleep(Duration.millis(Duration.toMillis(minReadSpacing) - since))
          yield* Q.takeAll(woken)
        })
        const next = Effect.gen(function*() {
          for (;;) {
            if (caughtUp) yield* waitForNews
            lastReadAt = Date.now()
            const page = yield* log.read(cursor, filter, pageSize)
            cursor = page.next
            caughtUp = !page.full
            held = page.held
            if (page.events.length > 0) return page.events
          }
        })
        return Stream.repeatEffectChunk(Effect.map(next, Chunk.fromIterable))
      })
    )

  return EventFeed.of({ follow, followers: () => wakes.size })
})

/** Needs the EventLog and the Queue (its LISTEN, when no Waker is provided); uses the Waker's when there is one. */
export const layer = Layer.scoped(EventFeed, make)

/** Follows the log through the provided feed. */
export const follow = (filter: EventLog.Filter, options?: FollowOptions) =>
  Stream.unwrap(Effect.map(EventFeed, (feed) => feed.follow(filter, options)))
