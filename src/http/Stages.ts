/**
 * The stages group, on the admin listener only: list the stages' pause state, pause one, resume one. A stage
 * is shared by every org (its pool claims every org's jobs), so no tenant may pause it: these routes are not
 * served on the API listener at all, and need no key where they are (like /readyz and /metrics, the admin
 * listener is loopback by default; expose it only to operators). A paused stage claims nothing in any
 * process until resumed; enqueues still succeed and running jobs finish.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect } from "effect"
import * as Queue from "../queue/Queue.js"
import * as Submit from "../runtime/Submit.js"
import { Api, NotFound } from "./Api.js"
import { dbFailure } from "./Jobs.js"

export const layer = HttpApiBuilder.group(Api, "stages", (handlers) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const stages = yield* Submit.KnownStages

    const view = (stage: string) =>
      Effect.map(queue.stageControls.list, (controls) => {
        const c = controls.find((x) => x.stage === stage)
        return { stage, paused: c?.paused ?? false, changedBy: c?.changedBy ?? null, changedAt: c?.changedAt ?? null }
      })

    const set = (name: string, paused: boolean) =>
      Effect.gen(function*() {
        if (!stages.some((s) => s.name === name)) return yield* new NotFound({ message: `stage ${name} not found` })
        yield* queue.stageControls.setPaused(name, paused, "http")
        yield* Effect.logInfo(paused ? "stage paused" : "stage resumed").pipe(Effect.annotateLogs({ stage: name }))
        return yield* view(name)
      }).pipe(Effect.catchTag("DbError", dbFailure))

    return handlers
      .handle("listStages", () =>
        Effect.gen(function*() {
          const controls = yield* queue.stageControls.list
          const names = [...new Set([...stages.map((s) => s.name), ...controls.map((c) => c.stage)])].sort()
          return {
            stages: names.map((stage) => {
              const c = controls.find((x) => x.stage === stage)
              return { stage, paused: c?.paused ?? false, changedBy: c?.changedBy ?? null, changedAt: c?.changedAt ?? null }
            })
          }
        }).pipe(Effect.catchTag("DbError", dbFailure)))
      .handle("pauseStage", ({ path }) => set(path.name, true))
      .handle("resumeStage", ({ path }) => set(path.name, false))
  }))
