/**
 * A pool's core, what a worker's pool and a tick share: the held jobs (Held.ts), the executor that runs them,
 * the settler that writes their outcomes (Settler.ts) and the lease keeper, wired together. A worker's pool
 * adds a claimer and a shutdown (StagePool.run); a tick one claim (StagePool.once).
 */
import { Effect } from "effect"
import type * as Outcome from "../../queue/Outcome.js"
import * as Settler from "../Settler.js"
import type * as Stage from "../Stage.js"
import * as Executor from "./Executor.js"
import * as Held from "./Held.js"
import * as LeaseKeeper from "./LeaseKeeper.js"

export type Counts = Record<Outcome.Settled | "unrecorded", number>

/** Most jobs claimed ahead of the slots under a backlog: 500 (graphile-worker's documented local queue) for fast jobs. */
export const maxAheadFor = (concurrency: number) => Math.max(concurrency, Math.min(50 * concurrency, 500))

/**
 * Most finished jobs a pool holds with their outcomes not yet written: two full claims' worth. In normal running
 * the settle window keeps it far lower for any job that takes a few ms (what finishes during one or two settle
 * statements); it binds only when the database is slow or away, and it is the hard cap on what a crash repeats
 * beyond the running jobs. It must exceed one claim: a pool of very short jobs finishes a whole claim before its
 * settle commits, and a lower cap made the next claim wait for that commit (100 for concurrency 10 cost a fifth
 * of the no-op drain; docs/benchmarks.md).
 */
export const maxUnsettledFor = (concurrency: number) => Math.max(10 * concurrency, 2 * (concurrency + maxAheadFor(concurrency)))

export interface CoreOptions {
  /** Some job went back to the queue for later: the Waker re-arms its timer. */
  readonly requeued: Effect.Effect<void>
  /** Wake the stage in every process as its jobs settle (a capped stage). */
  readonly wakeFreed?: () => boolean
  /** Each handler's run time (ms) as it returns. */
  readonly onRan?: (ms: number) => void
}

export const make = <A, I, R>(stage: Stage.Stage<A, I, R>, concurrency: number, options: CoreOptions) =>
  Effect.gen(function*() {
    const held = Held.make(concurrency)
    const counts: Counts = { completed: 0, retried: 0, rescheduled: 0, deadLettered: 0, released: 0, fenced: 0, unrecorded: 0 }
    const idleWaiters: Array<() => void> = []
    // called whenever a slot frees or outcomes settle: the claimer's cue (set by `run`)
    let onCapacity: () => void = () => undefined
    const checkIdle = () => {
      if (held.size === 0 && idleWaiters.length > 0) idleWaiters.splice(0).forEach((resume) => resume())
    }

    // the settler and the executor name each other: the settler's callback runs only after both exist
    let startWaiting = () => undefined as void
    const settler = yield* Settler.make(stage, {
      requeued: options.requeued,
      ...(options.wakeFreed ? { wakeFreed: options.wakeFreed } : {}),
      settled: (batch, results) => {
        for (let i = 0; i < batch.length; i++) {
          held.settled(batch[i]!.job)
          counts[results[i]!]++
        }
        startWaiting()
        checkIdle()
      }
    })
    const executor = yield* Executor.make(stage, held, settler, {
      concurrency,
      maxUnsettled: maxUnsettledFor(concurrency),
      onCapacity: () => onCapacity(),
      onRan: options.onRan ?? (() => undefined),
      onDropped: () => {
        counts.unrecorded++
        checkIdle()
      }
    })
    startWaiting = executor.startWaiting
    yield* LeaseKeeper.start(stage, held, executor.release)

    return {
      held,
      counts,
      accept: executor.accept,
      set onCapacity(f: () => void) {
        onCapacity = f
      },
      /** Stops starting jobs; those claimed and not started go back. */
      stopStarting: executor.stopStarting,
      /** Interrupts every running handler; each settles as released. */
      interruptRunning: executor.interruptRunning,
      /** Waits until no handler runs. */
      awaitNoneRunning: executor.awaitNoneRunning,
      /** Waits until every held job is settled. */
      awaitIdle: Effect.async<void>((resume) => {
        if (held.size === 0) return resume(Effect.void)
        idleWaiters.push(() => resume(Effect.void))
      })
    }
  })

export type Core = Effect.Effect.Success<ReturnType<typeof make>>
