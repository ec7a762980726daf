/**
 * The stages group: list the stages (every one compiled into this service or registered by any worker, with its
 * pause state and whether a live process runs it), pause one, resume one, purge one's queued jobs (kept in the
 * history as cancelled). A stage is shared by every org (its
 * pool claims every org's jobs), so no tenant may pause it: these routes are served on the admin listener
 * without a key (loopback by default; expose it only to operators) and on the API listener to an admin key
 * only. A paused stage claims nothing in any process until resumed; enqueues still succeed and running jobs
 * finish.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect } from "effect"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import { Api, NotFound } from "./Api.js"
import { dbFailure } from "./Jobs.js"

/** A stage's row: its pause state with what the registry says of it. */
export const stageView = (
  stage: string,
  known: StageRegistry.Operable | undefined,
  controls: ReadonlyArray<Queue.StageControl>
) => {
  const c = controls.find((x) => x.stage === stage)
  return {
    stage,
    paused: c?.paused ?? false,
    changedBy: c?.changedBy ?? null,
    changedAt: c?.changedAt ?? null,
    visibility: known?.visibility ?? null,
    live: known?.live ?? null,
    processes: known?.registered?.processes.filter((p) => p.live).length ?? 0
  }
}

export const layer = HttpApiBuilder.group(Api, "stages", (handlers) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const stages = yield* Submit.KnownStages
    const operable = StageRegistry.operable(stages).pipe(Effect.provideService(Queue.Queue, queue))

    const set = (name: string, paused: boolean) =>
      Effect.gen(function*() {
        const known = yield* operable
        const stage = known.find((s) => s.name === name)
        if (stage === undefined) return yield* new NotFound({ message: `stage ${name} not found` })
        yield* queue.stageControls.setPaused(name, paused, "http")
        yield* Effect.logInfo(paused ? "stage paused" : "stage resumed").pipe(Effect.annotateLogs({ stage: name }))
        return stageView(name, stage, yield* queue.stageControls.list)
      }).pipe(Effect.catchTag("QueueError", dbFailure))

    return handlers
      .handle("listStages", () =>
        Effect.gen(function*() {
          const known = yield* operable
          const controls = yield* queue.stageControls.list
          const names = [...new Set([...known.map((s) => s.name), ...controls.map((c) => c.stage)])].sort()
          return { stages: names.map((name) => stageView(name, known.find((s) => s.name === name), controls)) }
        }).pipe(Effect.catchTag("QueueError", dbFailure)))
      .handle("pauseStage", ({ path }) => set(path.name, true))
      .handle("resumeStage", ({ path }) => set(path.name, false))
      .handle("purgeStage", ({ path }) =>
        Effect.gen(function*() {
          const known = yield* operable
          if (!known.some((s) => s.name === path.name)) return yield* new NotFound({ message: `stage ${path.name} not found` })
          const purged = yield* queue.stageControls.purge(path.name, "http")
          yield* Effect.logInfo("stage purged").pipe(Effect.annotateLogs({ stage: path.name, purged }))
          return { stage: path.name, purged }
        }).pipe(Effect.catchTag("QueueError", dbFailure)))
  }))
