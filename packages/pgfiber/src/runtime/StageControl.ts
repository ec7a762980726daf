/**
 * Per-stage pause, as every worker process sees it. The state lives in the database (`stage_controls`,
 * changed by `Queue.stageControls.setPaused`: `pgfiber stages pause`, `POST /stages/:name/pause`); a change
 * NOTIFYs the jobs channel with the payload `pgfiber:stages`, which the Waker's one LISTEN connection hands to
 * this module as a due source's refresh: one small read per change, no polling. A listener reconnect (or the
 * Waker's polling while LISTEN is down) refreshes too, so a missed notification is caught up.
 *
 * A paused stage's pool stops claiming (running jobs finish; enqueues still succeed); the claim statement
 * also refuses a paused stage, which covers the moment before a process hears of it. Resuming wakes the pool.
 */
import { Effect, Queue as Q } from "effect"
import * as Queue from "../queue/Queue.js"
import * as Waker from "./Waker.js"

export interface StageControl {
  readonly isPaused: (stage: string) => boolean
  /** Called when the stage is resumed (the pool claims again). */
  readonly onResume: (stage: string, resume: () => void) => void
}

/** Never paused: pools run without a control (tests, `once`). */
export const none: StageControl = { isPaused: () => false, onResume: () => undefined }

export const make = Effect.gen(function*() {
  const queue = yield* Queue.Queue
  const waker = yield* Waker.Waker
  const paused = new Set<string>()
  const resumers = new Map<string, () => void>()

  const load = queue.stageControls.list.pipe(
    Effect.flatMap((controls) =>
      Effect.gen(function*() {
        const now = new Set(controls.filter((c) => c.paused).map((c) => c.stage))
        for (const stage of now) {
          if (paused.has(stage)) continue
          paused.add(stage)
          yield* Effect.logInfo(`stage ${stage} paused: claiming nothing until it is resumed`)
        }
        for (const stage of [...paused]) {
          if (now.has(stage)) continue
          paused.delete(stage)
          yield* Effect.logInfo(`stage ${stage} resumed`)
          resumers.get(stage)?.()
        }
      })
    ),
    Effect.catchAll((e) => Effect.logWarning("could not read the stages' pause state; keeping the last known", e.message)),
    Effect.annotateLogs({ component: "stage-control" })
  )

  // refreshes run one at a time; a burst of notifications costs one read
  const requests = yield* Q.sliding<void>(1)
  yield* load
  yield* Effect.forkScoped(Q.take(requests).pipe(Effect.zipRight(load), Effect.forever))
  yield* waker.registerDue({
    topic: Queue.stageControlsTopic,
    refresh: () => void Q.unsafeOffer(requests, undefined),
    dueInMs: () => null,
    fire: Effect.void
  })

  return {
    isPaused: (stage: string) => paused.has(stage),
    onResume: (stage: string, resume: () => void) => void resumers.set(stage, resume)
  } satisfies StageControl
})
