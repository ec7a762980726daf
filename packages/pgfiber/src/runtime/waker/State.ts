/**
 * What the Waker knows, as one value, and the only place it changes: the mode of the LISTEN connection, each
 * registered stage's wake-up with this process's lead of it, the due sources, the observers, and what health
 * reports. The Waker's parts (Listener, Lead, Timer, Sweep) read it and change it only through these transitions.
 *
 *   listener:  connecting ──up──► listening ──down──► down ──up──► listening
 *                   └──────────down──────────────────┘   (down ──down──► down: a new reason, the same since)
 *   a stage's lead:  unknown ──answered──► leader | follower ──(down | up)──► unknown
 *
 * Invariants, written once here (`check`):
 * 1. listening ⇔ no `downSince` and no `downReason`; connecting and down have a `downSince`;
 * 2. connecting only before the first time listening (`reconnects` 0), and `reconnects` counts each time up;
 * 3. while not listening every stage's lead is unknown (a lead is a lock on the connection, gone with it);
 * 4. every observer of the event log's notifications is an observer.
 * Each transition checks its own preconditions; with checking on (`PGFIBER_CHECK_INVARIANTS=1`, set for the test
 * suite) every transition also checks the whole value, and a broken invariant is a defect.
 */
import type { Effect } from "effect"
import type * as Queue from "../../queue/Queue.js"
import { checkingByDefault, InvariantBroken } from "../pool/Held.js"

export type ListenerState = "connecting" | "listening" | "down"

export interface Health {
  readonly listener: ListenerState
  /** When the listener last went down, while it is down (or has never come up); null while listening. */
  readonly listenerDownSince: Date | null
  /** Why it is down, while it is. */
  readonly listenerDownReason: string | null
  readonly listenerReconnects: number
  readonly lastReapAt: Date | null
  readonly lastSweepAt: Date | null
  readonly lastReap: Queue.ReapResult | null
}

/** Whether this process leads a stage's wake-ups: unknown until it has tried (and then it claims on every NOTIFY). */
export type Lead = "unknown" | "leader" | "follower"

/** Something besides jobs that falls due (the Scheduler's next tick), known without asking the database. */
export interface DueSource {
  /** A NOTIFY with this payload asks the source to refresh (as does every listener reconnect). */
  readonly topic: string
  readonly refresh: () => void
  /** Ms until `fire` is due, from the source's memory (no statement); null: nothing due. */
  readonly dueInMs: (nowMs: number) => number | null
  /** Runs when due; logs and survives its own failures. */
  readonly fire: Effect.Effect<void>
}

/** Why a pool will not claim now although jobs are ready: until a time (ms since epoch, its next token), or until a slot frees. */
export type Blocked = number | "capacity" | null

/**
 * Why a pool is woken. `timer`: the next-due timer fired for its jobs; the timer then sleeps until asked again, so
 * the pool re-arms it after its claim (what else is due later is the timer's to find). Otherwise (a NOTIFY, a
 * catch-up, a poll while LISTEN is down) the timer already knows what is due later: jobs written for later (an
 * insert, a replacing enqueue, a retry or poll for later, in any process) NOTIFY `laterTopic`, and a catch-up or a
 * poll re-arms it itself. A pool whose block (a limit) lifts re-arms it after its claim too, since the timer left
 * a blocked stage out.
 */
export type WakeReason = "notify" | "timer" | "catchUp"

/** What a pool registers: how to wake it, and what the timer and the lead ask of it. */
export interface Pool {
  readonly wake: (reason: WakeReason) => void
  /** An operator paused the stage: its due jobs are nobody's. */
  readonly paused: () => boolean
  /** Its limits hold it back: ready jobs are not due for it (a token's time is). */
  readonly blocked: () => Blocked
  /** It has no free slot: a job that comes now is the others' to claim too. */
  readonly busy: () => boolean
}

/** A registered stage: its pool, and this process's lead of it. */
export interface Registration extends Pool {
  readonly stage: string
  readonly lead: Lead
  /** When the lead was last tried (ms since epoch). */
  readonly lastTryAt: number
  /** A retry of the lead is planned (a follower ignored a NOTIFY). */
  readonly retrying: boolean
  /** When this process last asked the others to help (ms since epoch). */
  readonly lastHelpAt: number
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] }

export interface Listener {
  readonly mode: ListenerState
  readonly since: Date | null
  readonly reason: string | null
}

export class WakerState {
  private listenerValue: Listener = { mode: "connecting", since: new Date(), reason: "LISTEN not established yet" }
  private reconnectCount = 0
  private readonly registered = new Map<string, Mutable<Registration>>()
  private readonly due = new Map<string, DueSource>()
  private readonly observing = new Set<(topic: string) => void>()
  private readonly observingEvents = new Set<(topic: string) => void>()
  private lastReapAt: Date | null = null
  private lastReap: Queue.ReapResult | null = null
  private lastSweepAt: Date | null = null
  private seenDue = false
  private lastSeenAt = 0

  constructor(private readonly checking: boolean) {}

  get listener(): Listener {
    return this.listenerValue
  }
  get listening() {
    return this.listenerValue.mode === "listening"
  }
  get reconnects() {
    return this.reconnectCount
  }
  stage = (stage: string): Registration | undefined => this.registered.get(stage)
  stages = (): IterableIterator<Registration> => this.registered.values()
  stageNames = () => [...this.registered.keys()]
  sources = (): IterableIterator<DueSource> => this.due.values()
  source = (topic: string) => this.due.get(topic)
  observers = (): ReadonlySet<(topic: string) => void> => this.observing
  eventObservers = (): ReadonlySet<(topic: string) => void> => this.observingEvents

  health = (): Health => ({
    listener: this.listenerValue.mode,
    listenerDownSince: this.listenerValue.since,
    listenerDownReason: this.listenerValue.reason,
    listenerReconnects: this.reconnectCount,
    lastReapAt: this.lastReapAt,
    lastSweepAt: this.lastSweepAt,
    lastReap: this.lastReap
  })

  // ---- the listener ----

  /** connecting | listening | down → down; true when this is news (it was not down already). */
  down = (reason: string, at: Date): boolean => {
    const was = this.listenerValue
    this.listenerValue = { mode: "down", since: was.mode === "listening" ? at : was.since ?? at, reason }
    this.forgetLeads()
    return this.checked(was.mode !== "down")
  }

  /** connecting | down | listening → listening (each time LISTEN is back); how long it was down, after a reconnect. */
  up = (at: Date): { readonly downForMs: number | null } => {
    const was = this.listenerValue
    this.listenerValue = { mode: "listening", since: null, reason: null }
    this.reconnectCount++
    // a new connection holds no lead
    this.forgetLeads()
    const downForMs = was.since !== null && this.reconnectCount > 1 ? at.getTime() - was.since.getTime() : null
    return this.checked({ downForMs })
  }

  // ---- the stages and their lead ----

  register = (stage: string, pool: Pool): void => {
    this.registered.set(stage, { stage, ...pool, lead: "unknown", lastTryAt: 0, retrying: false, lastHelpAt: 0 })
    this.checked(undefined)
  }

  /** The stage's pool leaves; its registration (with its lead) is returned. */
  unregister = (stage: string): Registration | undefined => {
    const gone = this.registered.get(stage)
    this.registered.delete(stage)
    return this.checked(gone)
  }

  leadTried = (stages: ReadonlyArray<string>, at: number): void => {
    for (const s of stages) {
      const r = this.registered.get(s)
      if (r !== undefined) r.lastTryAt = at
    }
    this.checked(undefined)
  }

  /**
   * The answer of a lead's try, applied while still listening (else the connection dropped meanwhile: its locks
   * went with it). Returns the registered stages that went from follower to leader (their NOTIFYs were ignored
   * while another process led) and the stages led that are no longer registered (to be given back).
   */
  leadAnswered = (stages: ReadonlyArray<string>, led: ReadonlyArray<string>) => {
    const nowLeading: Array<Registration> = []
    const stale: Array<string> = []
    if (!this.listening) return this.checked({ nowLeading, stale })
    for (const s of stages) {
      const r = this.registered.get(s)
      if (r === undefined) {
        if (led.includes(s)) stale.push(s)
      } else if (led.includes(s)) {
        if (r.lead === "follower") nowLeading.push(r)
        r.lead = "leader"
      } else r.lead = "follower"
    }
    return this.checked({ nowLeading, stale })
  }

  /** Plans a retry of the stage's lead: false when one is planned already or the stage is not registered. */
  retryPlanned = (stage: string): boolean => {
    const r = this.registered.get(stage)
    if (r === undefined || r.retrying) return false
    r.retrying = true
    return this.checked(true)
  }

  retryEnded = (stage: string): void => {
    const r = this.registered.get(stage)
    if (r !== undefined) r.retrying = false
    this.checked(undefined)
  }

  helped = (stage: string, at: number): void => {
    const r = this.registered.get(stage)
    if (r !== undefined) r.lastHelpAt = at
    this.checked(undefined)
  }

  // ---- due sources, observers, what health reports ----

  addSource = (source: DueSource) => void this.due.set(source.topic, source)
  removeSource = (source: DueSource) => void this.due.delete(source.topic)

  observe = (listener: (topic: string) => void, events: boolean): void => {
    this.observing.add(listener)
    if (events) this.observingEvents.add(listener)
    this.checked(undefined)
  }

  unobserve = (listener: (topic: string) => void): void => {
    this.observing.delete(listener)
    this.observingEvents.delete(listener)
    this.checked(undefined)
  }

  reaped = (result: Queue.ReapResult, at: number): void => {
    this.lastReapAt = new Date(at)
    this.lastReap = result
  }

  /** A sweep ran; once per `everyMs` (a tenth of slack for the timer's jitter) the next next-due question marks presence. */
  swept = (at: number, everyMs: number | null): void => {
    this.lastSweepAt = new Date(at)
    if (everyMs !== null && at - this.lastSeenAt >= 0.9 * everyMs) {
      this.seenDue = true
      this.lastSeenAt = at
    }
  }

  /** Whether this next-due question marks presence (once per sweep interval): asked once, it is no longer due. */
  takePresence = (): boolean => {
    const due = this.seenDue
    this.seenDue = false
    return due
  }

  // ---- invariants ----

  /** Checks every invariant; throws `InvariantBroken` naming the first one broken. */
  check = (): void => {
    const l = this.listenerValue
    if ((l.mode === "listening") !== (l.since === null && l.reason === null)) broken(`listener ${l.mode} with since ${l.since} and reason ${l.reason}`)
    if (l.mode !== "listening" && l.since === null) broken(`listener ${l.mode} without a since`)
    if (l.mode === "connecting" && this.reconnectCount !== 0) broken(`connecting after ${this.reconnectCount} times listening`)
    if (l.mode !== "listening") {
      for (const r of this.registered.values()) if (r.lead !== "unknown") broken(`stage ${r.stage} ${r.lead} while ${l.mode}`)
    }
    for (const o of this.observingEvents) if (!this.observing.has(o)) broken("an event observer that is not an observer")
  }

  private forgetLeads() {
    for (const r of this.registered.values()) r.lead = "unknown"
  }

  private checked<T>(result: T): T {
    if (this.checking) this.check()
    return result
  }
}

const broken = (what: string): never => {
  throw new InvariantBroken(`waker invariant broken: ${what}`)
}

export const make = (options: { readonly check?: boolean } = {}) => new WakerState(options.check ?? checkingByDefault())
