/**
 * No thundering herd: of the processes running a stage, one is its wake leader (a session-level advisory lock on
 * its LISTEN connection, `Queue.Listening.tryLead`) and claims on the stage's NOTIFY; the others ignore it unless
 * their pool waits for a slot (a capped stage). The leader asks them to claim too (`pgfiber:more:<stage>`, at most
 * every `helpSpacing`) when its claim comes back full or a job comes while it has no free slot. A follower that
 * ignored a NOTIFY tries to take the lead within `leadRetry` (the leader may have died: its lock went with its
 * connection), and a leader that stops hands the lead back and asks for help. Until a process knows whether it
 * leads (at start, after a reconnect), it claims on every NOTIFY, as one process does.
 */
import { Duration, Effect } from "effect"
import * as Queue from "../../queue/Queue.js"
import type { Registration, WakerState } from "./State.js"

export interface Lead {
  /** Tries to take the lead of these stages (while listening); a stage taken from a follower's place catches up. */
  readonly tryLead: (stages: ReadonlyArray<string>) => Effect.Effect<void>
  /** The stage's NOTIFY: its pool claims unless another process leads it. */
  readonly notified: (stage: Registration) => void
  /** Another process's leader asks for help with its stage. */
  readonly helpAsked: (stage: string) => void
  /** A pool's claim came back full: if this process leads the stage, the others are asked to claim too. */
  readonly more: (stage: string) => void
  /** A pool that leaves hands its lead back and asks the others to look (one of them takes the lead on that NOTIFY). */
  readonly handBack: (gone: Registration) => Effect.Effect<void>
}

export interface LeadOptions {
  readonly leadRetry: Duration.Duration
  readonly helpSpacing: Duration.Duration
}

export const make = (
  state: WakerState,
  listening: Queue.Listening,
  fork: (effect: Effect.Effect<void>) => void,
  options: LeadOptions
): Lead => {
  const tryLead = (stages: ReadonlyArray<string>): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (!state.listening || stages.length === 0) return Effect.void
      state.leadTried(stages, Date.now())
      return listening.tryLead(stages).pipe(
        Effect.map((led) => {
          const { nowLeading, stale } = state.leadAnswered(stages, led)
          for (const s of stale) fork(Effect.ignore(listening.unlead(s)))
          // NOTIFYs were ignored while another process led: look now
          for (const r of nowLeading) r.wake("catchUp")
        }),
        Effect.catchAll(() => Effect.void)
      )
    })

  const retryLead = (stage: string) => {
    const r = state.stage(stage)
    if (r === undefined || !state.retryPlanned(stage)) return
    const wait = Math.max(0, r.lastTryAt + Duration.toMillis(options.leadRetry) - Date.now())
    fork(Effect.sleep(Duration.millis(wait)).pipe(
      Effect.zipRight(Effect.suspend(() => (state.stage(stage)?.lead === "follower" ? tryLead([stage]) : Effect.void))),
      Effect.ensuring(Effect.sync(() => state.retryEnded(stage)))
    ))
  }

  const help = (r: Registration) => {
    const now = Date.now()
    if (now - r.lastHelpAt < Duration.toMillis(options.helpSpacing)) return
    state.helped(r.stage, now)
    fork(Effect.ignore(listening.notify(Queue.moreTopicPrefix + r.stage)))
  }

  const notified = (r: Registration) => {
    // a follower leaves the job to the leader, unless its pool waits for a freed slot (a capped stage)
    if (r.lead === "follower" && r.blocked() === null) return retryLead(r.stage)
    r.wake("notify")
    if (r.lead === "leader" && r.busy()) help(r)
  }

  const helpAsked = (stage: string) => {
    const r = state.stage(stage)
    if (r === undefined || r.lead === "leader") return
    r.wake("notify")
    if (r.lead === "follower") retryLead(stage)
  }

  const more = (stage: string) => {
    const r = state.stage(stage)
    if (r?.lead === "leader") help(r)
  }

  const handBack = (gone: Registration) =>
    gone.lead === "leader"
      ? listening.unlead(gone.stage).pipe(
        Effect.zipRight(listening.notify(Queue.moreTopicPrefix + gone.stage)),
        Effect.timeout("2 seconds"),
        Effect.ignore
      )
      : Effect.void

  return { tryLead, notified, helpAsked, more, handBack }
}
