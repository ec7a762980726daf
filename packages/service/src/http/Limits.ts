/**
 * The limits group: stages' fair shares, global caps and rate limits, read and changed at run time. Shared by
 * every org, so it is the operator's: served on the admin listener only (loopback by default), never on the
 * API listener a tenant's key reaches. A change is an override in the database that every process's claims
 * obey within a second, as `pgfiber limits set` does.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect, Either } from "effect"
import * as Limits from "pgfiber/internal/queue/Limits.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import { Api, BadRequest, NotFound } from "./Api.js"
import { dbFailure } from "./Jobs.js"

const rateField = (field: string, text: string) =>
  text === "none"
    ? Either.right(null)
    : Either.mapLeft(Limits.parseRate(text), (message) => new BadRequest({ message, field }))

export const layer = HttpApiBuilder.group(Api, "limits", (handlers) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const stages = yield* Submit.KnownStages
    const views = Effect.flatMap(StageRegistry.limitStages(stages), Worker.limitViews).pipe(
      Effect.provideService(Queue.Queue, queue),
      Effect.catchTag("ConfigError", (e) => Effect.die(e))
    )
    const viewOf = (stage: string) => Effect.map(views, (all) => all.find((v) => v.stage === stage)!)
    const present = (v: Limits.View) => ({ stage: v.stage, effective: v.effective, source: v.source })

    return handlers
      .handle("listLimits", () =>
        views.pipe(Effect.map((all) => ({ limits: all.map(present) })), Effect.catchTag("QueueError", dbFailure)))
      .handle("putLimits", ({ path, payload: body }) =>
        Effect.gen(function*() {
          if (body.rate !== undefined && body.ratePerOrg !== undefined) {
            return yield* new BadRequest({ message: "one bucket per stage: rate or ratePerOrg", field: "ratePerOrg" })
          }
          const override: { -readonly [K in keyof Limits.Override]?: Limits.Override[K] } = {}
          if (body.maxRunning !== undefined) override.maxRunning = body.maxRunning
          if (body.maxRunningPerOrg !== undefined) override.maxRunningPerOrg = body.maxRunningPerOrg
          if (body.burst !== undefined) override.rateBurst = body.burst
          if (body.fair !== undefined) override.fair = body.fair
          for (const [field, text, perOrg] of [["rate", body.rate, false], ["ratePerOrg", body.ratePerOrg, true]] as const) {
            if (text === undefined) continue
            const rate = yield* rateField(field, text)
            Object.assign(override, rate === null ? { rateLimit: 0 } : { rateLimit: rate.limit, ratePerMs: rate.perMs, ratePerOrg: perOrg })
          }
          if (Object.keys(override).length === 0) return yield* new BadRequest({ message: "nothing to set" })
          if (!/^[a-z][a-z0-9_.:-]{0,62}$/.test(path.stage)) return yield* new BadRequest({ message: "not a stage name", field: "stage" })
          const known = yield* StageRegistry.operable(stages).pipe(Effect.provideService(Queue.Queue, queue))
          if (!known.some((s) => s.name === path.stage)) return yield* new NotFound({ message: `stage ${path.stage} not found` })
          yield* queue.limits.set(path.stage, override)
          yield* Effect.logInfo("stage limits changed").pipe(Effect.annotateLogs({ stage: path.stage, ...override }))
          return present(yield* viewOf(path.stage))
        }).pipe(Effect.catchTag("QueueError", dbFailure)))
      .handle("resetLimits", ({ path }) =>
        queue.limits.clear(path.stage).pipe(
          Effect.map((reset) => ({ stage: path.stage, reset })),
          Effect.catchTag("QueueError", dbFailure)
        ))
  }))
