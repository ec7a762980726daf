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

export const make = (concurrency: number, options: { readonly check?: boolean } = {}): Held => {
  const byId = new Map<string, Entry>()
  const queue: Array<Entry> = []
  // entries whose id a newer claim of the same job took over, until their outcome is settled or dropped
  const superseded = new Set<Entry>()
  let running = 0
  let settling = 0
  const checking = options.check ?? checkingByDefault()

  const broken = (what: string): never => {
    throw new InvariantBroken(`pool invariant broken: ${what}`)
  }
  const expect = (entry: Entry, ...modes: ReadonlyArray<Mode>) => {
    if (!modes.includes(entry.mode)) broken(`job ${entry.job.id} is ${entry.mode}, expected ${modes.join(" or ")}`)
  }

  const check = () => {
    const counts: Record<Mode, number> = { waiting: 0, running: 0, settling: 0 }
    const count = (entry: Entry) => {
      counts[entry.mode]++
      if (entry.mode === "running" && (entry.slot === undefined || entry.slot.current !== entry)) {
        broken(`running job ${entry.job.id} has no slot holding it`)
      }
    }
    byId.forEach(count)
    for (const entry of superseded) {
      if (entry.mode === "waiting") broken(`superseded job ${entry.job.id} is waiting`)
      count(entry)
    }
    if (counts.waiting !== queue.length) broken(`${counts.waiting} waiting jobs, ${queue.length} in the queue`)
    if (counts.running !== running) broken(`${counts.running} running jobs, counted ${running}`)
    if (counts.settling !== settling) broken(`${counts.settling} settling jobs, counted ${settling}`)
    if (running > concurrency) broken(`${running} running jobs on ${concurrency} slots`)
    const queued = new Set<Entry>()
    for (const entry of queue) {
      if (entry.mode !== "waiting" || byId.get(entry.job.id) !== entry || queued.has(entry)) {
        broken(`job ${entry.job.id} in the waiting queue is ${entry.mode}`)
      }
      queued.add(entry)
    }
  }
  const checked = <T>(result: T): T => {
    if (checking) check()
    return result
  }

  const leaveQueue = (entry: Entry) => {
    if (queue[0] === entry) queue.shift()
    else queue.splice(queue.indexOf(entry), 1)
  }
  /** The entry leaves the held value (its outcome settled, or given up on). */
  const forget = (entry: Entry) => {
    if (byId.get(entry.job.id) === entry) byId.delete(entry.job.id)
    else superseded.delete(entry)
  }
  const leaveSlot = (entry: Entry) => {
    running--
    if (entry.slot?.current === entry) entry.slot.current = undefined
    entry.slot = undefined
  }

  return {
    get size() {
      return byId.size + superseded.size
    },
    get waiting() {
      return queue.length
    },
    get running() {
      return running
    },
    get settling() {
      return settling
    },
    get: (id) => byId.get(id),
    entries: () => byId.values(),
    nextWaiting: () => queue[0],
    accept: (job, timeoutMs) => {
      const old = byId.get(job.id)
      if (old !== undefined) {
        // claimed again under a new lease while the old entry is held: the old lease is dead
        old.leaseLost = true
        if (old.mode === "waiting") leaveQueue(old)
        else superseded.add(old)
      }
      const entry: Entry = {
        job, lease: { id: job.id, lease: job.lease }, mode: "waiting", slot: undefined, startedAt: 0, timedOut: false,
        leaseLost: false, timeoutMs, reported: undefined, reportedAt: 0
      }
      byId.set(job.id, entry)
      queue.push(entry)
      return checked({ entry, superseded: old })
    },
    start: (entry, slot, at) => {
      expect(entry, "waiting")
      leaveQueue(entry)
      entry.mode = "running"
      entry.slot = slot
      entry.startedAt = at
      slot.current = entry
      running++
      checked(undefined)
    },
    finish: (entry) => {
      expect(entry, "waiting", "running")
      if (entry.mode === "waiting") leaveQueue(entry)
      else leaveSlot(entry)
      entry.mode = "settling"
      settling++
      checked(undefined)
    },
    finishWaiting: () => {
      const entries = queue.splice(0)
      for (const entry of entries) entry.mode = "settling"
      settling += entries.length
      return checked(entries)
    },
    settled: (job) => {
      let entry = byId.get(job.id)
      if (entry?.job !== job) {
        // a superseded entry's (fenced) outcome; a job claimed again after its old outcome was written is left held
        entry = undefined
        for (const e of superseded) if (e.job === job) entry = e
        if (entry === undefined) return
      }
      expect(entry, "settling")
      forget(entry)
      settling--
      checked(undefined)
    },
    drop: (entry) => {
      expect(entry, "running", "settling")
      if (entry.mode === "running") leaveSlot(entry)
      else settling--
      forget(entry)
      checked(undefined)
    },
    check
  }
}
