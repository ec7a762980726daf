/**
 * The jobs a pool holds, as one value: every job from its claim until its outcome is written, each in exactly
 * one named mode, and the only place those modes change.
 *
 *   claimed ──accept──► waiting ──start──► running ──finish──► settling ──settled──► (gone)
 *                          └───────────────finish──────────────────┘
 *   running | settling ──drop──► (gone)       deciding the outcome failed: the lease and the reaper own the job
 *
 * A job claimed again while its old entry is still held (its lease expired during an outage, the reaper requeued
 * it, and this pool claimed it back before it heard) supersedes that entry: a waiting one is gone at once (its lease
 * is dead; the new entry is the job), a running or settling one leaves the id's place to the new entry and is kept
 * apart, still counted in its mode, until its (fenced) outcome is settled or it is dropped. The caller stops a
 * superseded running handler: its lease is lost.
 *
 * - waiting: claimed, its handler not started; kept in claim order (the executor takes the oldest first).
 * - running: a slot's fiber runs its handler; the slot is `entry.slot` and `slot.current` is the entry.
 * - settling: its outcome was handed to the settler and is not yet written (a crash here repeats the job).
 *
 * Invariants, written once here (`check`):
 * 1. every held entry is in exactly one mode, and the counts of the three modes add up to the entries held (one
 *    per id, plus the superseded ones);
 * 2. at most `concurrency` jobs are running, each with a slot that holds it;
 * 3. the waiting queue holds exactly the waiting jobs, each once.
 * Each transition checks its own entry's mode (cheap, always); with checking on (`PGFIBER_CHECK_INVARIANTS=1`,
 * set for the test suite) every transition also checks the whole value, and a broken invariant is a defect.
 */
import type { Fiber } from "effect"
import type { Job, Lease } from "../../queue/Job.js"
import type * as Queue from "../../queue/Queue.js"

export type Mode = "waiting" | "running" | "settling"

/** A fiber that runs jobs one after another; interrupting it stops its current handler only. */
export interface Slot {
  current: Entry | undefined
  fiber: Fiber.RuntimeFiber<void, never> | undefined
}

export interface Entry {
  readonly job: Job
  readonly lease: Lease
  mode: Mode
  /** The slot running it (while running): interrupting the slot's fiber stops this job's handler. */
  slot: Slot | undefined
  startedAt: number
  timedOut: boolean
  leaseLost: boolean
  /** This run's timeout in ms (the job's own, else the stage's). */
  readonly timeoutMs: number
  /** The latest progress the handler reported and not yet written by a heartbeat. */
  reported: Queue.Progress | undefined
  /** When a heartbeat last wrote this job's progress (ms): at most once a second. */
  reportedAt: number
}

export class InvariantBroken extends Error {
  override readonly name = "InvariantBroken"
}

export interface Held {
  /** Entries held: one per job id, plus superseded ones whose outcome is not settled yet. */
  readonly size: number
  readonly waiting: number
  readonly running: number
  readonly settling: number
  readonly get: (id: string) => Entry | undefined
  readonly entries: () => IterableIterator<Entry>
  /** The oldest waiting job, left waiting. */
  readonly nextWaiting: () => Entry | undefined
  /** A claimed job enters, waiting; an entry it supersedes (the same id, an older lease) is returned. */
  readonly accept: (job: Job, timeoutMs: number) => { readonly entry: Entry; readonly superseded: Entry | undefined }
  /** waiting → running on `slot`. */
  readonly start: (entry: Entry, slot: Slot, at: number) => void
  /** waiting | running → settling (a running job's slot is free from here on). */
  readonly finish: (entry: Entry) => void
  /** Every waiting job → settling, returned in claim order (to be released). */
  readonly finishWaiting: () => ReadonlyArray<Entry>
  /** settling → gone, once its outcome is written; a job claimed again since (a new lease) is left held. */
  readonly settled: (job: Job) => void
  /** running | settling → gone: its outcome could not be decided; the lease and the reaper own the job. */
  readonly drop: (entry: Entry) => void
  /** Checks every invariant; throws `InvariantBroken` naming the first one broken. */
  readonly check: () => void
}

export const checkingByDefault = () => globalThis.process?.env?.PGFIBER_CHECK_INVARIANTS === "1"

/** The held value: the entries by id, the waiting queue in claim order, the superseded entries, two counters. */
class HeldJobs implements Held {
  private readonly byId = new Map<string, Entry>()
  private readonly queue: Array<Entry> = []
  // entries whose id a newer claim of the same job took over, until their outcome is settled or dropped
  private readonly superseded = new Set<Entry>()
  private runningCount = 0
  private settlingCount = 0

  constructor(private readonly concurrency: number, private readonly checking: boolean) {}

  get size() {
    return this.byId.size + this.superseded.size
  }
  get waiting() {
    return this.queue.length
  }
  get running() {
    return this.runningCount
  }
  get settling() {
    return this.settlingCount
  }
  get = (id: string) => this.byId.get(id)
  entries = () => this.byId.values()
  nextWaiting = () => this.queue[0]

  accept = (job: Job, timeoutMs: number) => {
    const old = this.byId.get(job.id)
    if (old !== undefined) {
      // claimed again under a new lease while the old entry is held: the old lease is dead
      old.leaseLost = true
      if (old.mode === "waiting") this.leaveQueue(old)
      else this.superseded.add(old)
    }
    const entry: Entry = {
      job, lease: { id: job.id, lease: job.lease }, mode: "waiting", slot: undefined, startedAt: 0, timedOut: false,
      leaseLost: false, timeoutMs, reported: undefined, reportedAt: 0
    }
    this.byId.set(job.id, entry)
    this.queue.push(entry)
    return this.checked({ entry, superseded: old })
  }

  start = (entry: Entry, slot: Slot, at: number) => {
    this.expect(entry, "waiting")
    this.leaveQueue(entry)
    entry.mode = "running"
    entry.slot = slot
    entry.startedAt = at
    slot.current = entry
    this.runningCount++
    this.checked(undefined)
  }

  finish = (entry: Entry) => {
    this.expect(entry, "waiting", "running")
    if (entry.mode === "waiting") this.leaveQueue(entry)
    else this.leaveSlot(entry)
    entry.mode = "settling"
    this.settlingCount++
    this.checked(undefined)
  }

  finishWaiting = () => {
    const entries = this.queue.splice(0)
    for (const entry of entries) entry.mode = "settling"
    this.settlingCount += entries.length
    return this.checked(entries)
  }

  settled = (job: Job) => {
    let entry = this.byId.get(job.id)
    if (entry?.job !== job) {
      // a superseded entry's (fenced) outcome; a job claimed again after its old outcome was written is left held
      entry = undefined
      for (const e of this.superseded) if (e.job === job) entry = e
      if (entry === undefined) return
    }
    this.expect(entry, "settling")
    this.forget(entry)
    this.settlingCount--
    this.checked(undefined)
  }

  drop = (entry: Entry) => {
    this.expect(entry, "running", "settling")
    if (entry.mode === "running") this.leaveSlot(entry)
    else this.settlingCount--
    this.forget(entry)
    this.checked(undefined)
  }

  check = () => {
    const counts: Record<Mode, number> = { waiting: 0, running: 0, settling: 0 }
    const count = (entry: Entry) => {
      counts[entry.mode]++
      if (entry.mode === "running" && (entry.slot === undefined || entry.slot.current !== entry)) {
        broken(`running job ${entry.job.id} has no slot holding it`)
      }
    }
    this.byId.forEach(count)
    for (const entry of this.superseded) {
      if (entry.mode === "waiting") broken(`superseded job ${entry.job.id} is waiting`)
      count(entry)
    }
    if (counts.waiting !== this.queue.length) broken(`${counts.waiting} waiting jobs, ${this.queue.length} in the queue`)
    if (counts.running !== this.runningCount) broken(`${counts.running} running jobs, counted ${this.runningCount}`)
    if (counts.settling !== this.settlingCount) broken(`${counts.settling} settling jobs, counted ${this.settlingCount}`)
    if (this.runningCount > this.concurrency) broken(`${this.runningCount} running jobs on ${this.concurrency} slots`)
    const queued = new Set<Entry>()
    for (const entry of this.queue) {
      if (entry.mode !== "waiting" || this.byId.get(entry.job.id) !== entry || queued.has(entry)) {
        broken(`job ${entry.job.id} in the waiting queue is ${entry.mode}`)
      }
      queued.add(entry)
    }
  }

  private checked<T>(result: T): T {
    if (this.checking) this.check()
    return result
  }
  // two modes at most, as parameters: a rest array would be built on every transition, several per job
  private expect(entry: Entry, mode: Mode, orMode: Mode = mode) {
    if (entry.mode !== mode && entry.mode !== orMode) broken(`job ${entry.job.id} is ${entry.mode}, expected ${mode === orMode ? mode : `${mode} or ${orMode}`}`)
  }
  private leaveQueue(entry: Entry) {
    if (this.queue[0] === entry) this.queue.shift()
    else this.queue.splice(this.queue.indexOf(entry), 1)
  }
  /** The entry leaves the held value (its outcome settled, or given up on). */
  private forget(entry: Entry) {
    if (this.byId.get(entry.job.id) === entry) this.byId.delete(entry.job.id)
    else this.superseded.delete(entry)
  }
  private leaveSlot(entry: Entry) {
    this.runningCount--
    if (entry.slot?.current === entry) entry.slot.current = undefined
    entry.slot = undefined
  }
}

const broken = (what: string): never => {
  throw new InvariantBroken(`pool invariant broken: ${what}`)
}

export const make = (concurrency: number, options: { readonly check?: boolean } = {}): Held =>
  new HeldJobs(concurrency, options.check ?? checkingByDefault())
