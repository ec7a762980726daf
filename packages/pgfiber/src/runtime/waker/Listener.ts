/**
 * What the LISTEN connection tells the Waker, in the order it told it: the connection's callbacks (porsager's,
 * outside any fiber) only offer what they heard to a queue, and one fiber takes it from there, so each change of
 * the Waker's state, its logs and its metrics run as Effects, one after another. A NOTIFY goes to its stage's pool
 * (through the lead), to the timer (`pgfiber:later`), to the limits (`pgfiber:limits`), to a due source (its topic)
 * or to the observers; a drop of the connection is `down` (the sweep starts polling); its return is `listening`
 * and a catch-up, since notifications may have been missed in between.
 */
import { Duration, Effect, Queue as Q } from "effect"
import * as Metrics from "../Metrics.js"
import * as Queue from "../../queue/Queue.js"
import type { Lead } from "./Lead.js"
import type { WakerState } from "./State.js"

export type Heard =
  | { readonly _tag: "Notified"; readonly topic: string }
  | { readonly _tag: "Down"; readonly reason: string }
  | { readonly _tag: "Up" }

const up: Heard = { _tag: "Up" }

/** The connection's callbacks: each offers what it heard, nothing more. */
export const wakeups = (heard: Q.Enqueue<Heard>): Queue.Wakeups => ({
  onWake: (topic) => void Q.unsafeOffer(heard, { _tag: "Notified", topic }),
  onDown: (reason) => void Q.unsafeOffer(heard, { _tag: "Down", reason }),
  onListening: () => void Q.unsafeOffer(heard, up)
})

export interface ListenerParts {
  readonly state: WakerState
  readonly lead: Lead
  readonly limits: Queue.Queue["Type"]["limits"]
  readonly rearm: Effect.Effect<void>
  /** The sweep's cue that the listener changed mode. */
  readonly listenerChanged: Q.Enqueue<void>
  /** Every pool claims, every observer hears "", every due source refreshes. */
  readonly catchUp: () => void
  readonly fork: (effect: Effect.Effect<void>) => void
  readonly pollInterval: Duration.Duration
}

/** How each thing heard changes the Waker. */
export const handler = (p: ListenerParts) => {
  const { state } = p
  // a stage's limits changed somewhere: the queue reads them again, and the pools they held back claim under the
  // new ones (a lifted rate limit must not wait for the old bucket's next token)
  const limitsChanged = () => {
    p.limits.changed()
    for (const r of state.stages()) if (r.blocked() !== null) r.wake("notify")
  }

  const notified = (topic: string): Effect.Effect<void> => {
    if (topic === Queue.eventsTopic) {
      for (const o of state.eventObservers()) o(topic)
      return Effect.void
    }
    let then: Effect.Effect<void> = Effect.void
    if (topic === Queue.laterTopic) then = p.rearm
    else if (topic === Queue.limitsTopic) limitsChanged()
    else if (topic.startsWith(Queue.moreTopicPrefix)) p.lead.helpAsked(topic.slice(Queue.moreTopicPrefix.length))
    else {
      const r = state.stage(topic)
      if (r !== undefined) p.lead.notified(r)
      else state.source(topic)?.refresh()
    }
    for (const o of state.observers()) o(topic)
    return then
  }

  const down = (reason: string) =>
    Effect.suspend(() =>
      state.down(reason, new Date())
        ? Effect.logWarning(`LISTEN down (${reason}); polling every ${Duration.format(p.pollInterval)} until it is back`).pipe(
          Effect.zipRight(Q.offer(p.listenerChanged, undefined))
        )
        : Effect.void
    )

  const listening = Effect.gen(function*() {
    const { downForMs } = state.up(new Date())
    yield* Metrics.listenerReconnects(Effect.succeed(1))
    if (downForMs !== null) yield* Effect.logInfo(`LISTEN is back after ${(downForMs / 1000).toFixed(1)} s; catching up`)
    yield* Q.offer(p.listenerChanged, undefined)
    // a new connection holds no lead: every pool claims on NOTIFY until it knows whether it leads
    p.fork(p.lead.tryLead(state.stageNames()))
    // catch-up: notifications may have been missed while down (a change of limits among them)
    p.limits.changed()
    p.catchUp()
    yield* p.rearm
  })

  return (heard: Heard): Effect.Effect<void> =>
    Effect.suspend(() => heard._tag === "Notified" ? notified(heard.topic) : heard._tag === "Down" ? down(heard.reason) : listening)
}

/** Handles what was heard so far (none is waiting: returns at once). */
export const drain = (heard: Q.Dequeue<Heard>, handle: (heard: Heard) => Effect.Effect<void>) =>
  Effect.flatMap(Q.takeAll(heard), (all) => Effect.forEach(all, handle, { discard: true })).pipe(Effect.annotateLogs({ component: "waker" }))

/** The fiber that handles what is heard, for the life of the caller's scope; a failure is logged and the next is handled. */
export const loop = (heard: Q.Dequeue<Heard>, handle: (heard: Heard) => Effect.Effect<void>) =>
  Q.takeBetween(heard, 1, Number.POSITIVE_INFINITY).pipe(
    Effect.flatMap((all) =>
      Effect.forEach(all, (h) => handle(h).pipe(Effect.catchAllCause((cause) => Effect.logError("waker: handling what LISTEN heard failed", cause))), {
        discard: true
      })
    ),
    Effect.forever,
    Effect.annotateLogs({ component: "waker" })
  )
