/**
 * Every job's events, from every process, to anyone here who follows them: the event log (queue/EventLog.ts)
 * read forward by cursor, woken by the `pgfiber:events` NOTIFY that each logging statement sends on the events
 * channel (migration 0027). The NOTIFY is heard on the process's one LISTEN connection (the Waker's; a process with
 * no worker listens once itself, for every follower), and only while someone here follows: workers that follow
 * nothing never hear it. So a follower costs no connection, and nothing is read while nothing happens.
 *
 * A follower reads by itself only to catch up (from the beginning, after an old id); once caught up it is fed by
 * the process's one shared reader (EventReader.ts), which reads once per wake-up for every follower here and
 * polls only while the log says events wait for an older transaction to end. A follower "from now" that starts
 * while others are fed starts at the reader's place and sends no statement.
 *
 * Order: a follower gets events in the log's read order, which keeps each job's order (its enqueue commits
 * before its claim can see it, and so on). Resume: start after any event id within the retention.
 */
import { Chunk, Context, Effect, Layer, Option, Queue as Q, RcRef, Stream } from "effect"
import * as EventLog from "../queue/EventLog.js"
import * as Queue from "../queue/Queue.js"
import * as EventReader from "./EventReader.js"
import * as Waker from "./Waker.js"

/** The NOTIFY payload of a statement that logged events (migration 0020). */
export const topic = Queue.eventsTopic

export interface FollowOptions {
  /** Where to start: "now" (default), "beginning" (everything kept), or after this event id (Last-Event-ID). */
  readonly from?: "now" | "beginning" | { readonly after: string } | undefined
  /** Events per read while the follower catches up by itself. */
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
  /** Reads the shared reader has made for its followers (one per wake-up, however many followers). */
  readonly reads: () => number
  /** Followers fed by the shared reader now (the others are catching up by themselves). */
  readonly fed: () => number
  /** Reads followers made by themselves, catching up (each sends its own statement). */
  readonly ownReads: () => number
}>() {}

export { heldPollMax, minReadSpacing } from "./EventReader.js"

export const make = Effect.gen(function*() {
  const log = yield* EventLog.EventLog
  const queue = yield* Queue.Queue
  const reader = yield* EventReader.make(log)
  let followers = 0
  let ownReads = 0
  const hear = (t: string) => {
    // "" is a reconnect of the listener: notifications may have been missed
    if (t === topic || t === "") reader.wake()
  }
  // the event log's notifications, heard while anyone here follows: one LISTEN for every follower, on the Waker's
  // connection (or, with no worker here, on one of the feed's own, open only while it has followers)
  const waker = yield* Effect.serviceOption(Waker.Waker)
  const hearing = yield* RcRef.make({
    acquire: Option.isSome(waker)
      ? waker.value.observe(hear, { events: true })
      : Effect.flatMap(queue.listen({ onWake: hear, onListening: () => hear("") }), (l) => l.followEvents)
  })

  const follow = (filter: EventLog.Filter, options: FollowOptions = {}) =>
    Stream.unwrapScoped(
      Effect.gen(function*() {
        const signal = yield* Q.sliding<void>(1)
        const follower: EventReader.Follower = {
          filter,
          mode: "own",
          cursor: EventLog.beginning,
          buffer: [],
          held: false,
          heardAtRead: reader.heard(),
          signal: () => Q.unsafeOffer(signal, undefined)
        }
        yield* Effect.acquireRelease(
          Effect.sync(() => void followers++),
          () => Effect.sync(() => {
            followers--
            reader.detach(follower)
          })
        )
        // before its cursor is placed: every event logged after that is NOTIFYed to this process
        yield* RcRef.get(hearing)
        const from = options.from ?? "now"
        // caught up once its first read by itself finds no more, or at once when fed from the reader's place
        let caughtUp = false
        let wasFed = false
        if (from === "now" && reader.attachAtReader(follower)) caughtUp = wasFed = true
        else {
          follower.heardAtRead = reader.heard()
          follower.cursor = from === "now"
            ? yield* log.now
            : from === "beginning"
            ? EventLog.beginning
            : yield* log.after(from.after, filter)
        }
        if (options.onFollowing) yield* options.onFollowing
        const pageSize = options.pageSize ?? EventReader.pageSize
        const next = Effect.gen(function*() {
          for (;;) {
            if (follower.buffer.length > 0) {
              const events = follower.buffer
              follower.buffer = []
              return events
            }
            if (follower.mode === "fed") {
              yield* Q.take(signal)
              continue
            }
            // sent back by the reader (it fell behind, or a read failed): it reads by itself before it is fed again
            if (wasFed) caughtUp = wasFed = false
            if (caughtUp && reader.attach(follower)) {
              wasFed = true
              continue
            }
            follower.heardAtRead = reader.heard()
            ownReads++
            const page = yield* log.read(follower.cursor, filter, pageSize)
            follower.cursor = page.next
            follower.held = page.held
            caughtUp = !page.full
            if (page.events.length > 0) return page.events
          }
        })
        return Stream.repeatEffectChunk(Effect.map(next, Chunk.unsafeFromArray))
      })
    )

  return EventFeed.of({ follow, followers: () => followers, reads: reader.reads, fed: reader.fed, ownReads: () => ownReads })
})

/** Needs the EventLog and the Queue (its LISTEN, when no Waker is provided); uses the Waker's when there is one. */
export const layer = Layer.scoped(EventFeed, make)

/** Follows the log through the provided feed. */
export const follow = (filter: EventLog.Filter, options?: FollowOptions) =>
  Stream.unwrap(Effect.map(EventFeed, (feed) => feed.follow(filter, options)))
