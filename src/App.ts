/**
 * The application's composition: which stages exist, and the Layers that run them against Postgres.
 * `main.ts` (the CLI) picks what to launch; tests and the bench compose the same pieces.
 */
import { Effect, Layer } from "effect"
import * as Db from "./layers/Db.js"
import * as Migrations from "./queue/Migrations.js"
import * as PgQueue from "./queue/PgQueue.js"
import type * as ConfigError from "effect/ConfigError"
import type * as Queue from "./queue/Queue.js"
import type * as Stage from "./runtime/Stage.js"
import type * as Waker from "./runtime/Waker.js"
import * as Worker from "./runtime/Worker.js"

/** What the stages below need from the outside world (storage, media, SpeechKit, …). */
export type StageRequirements = never

/** Every stage this build knows; enqueueing to any other stage name is refused. */
export const stages: ReadonlyArray<Stage.Stage<any, any, StageRequirements>> = []

/** The stages' requirements, built from configuration. */
export const stageLayers: Layer.Layer<StageRequirements, unknown> = Layer.empty

export const stageNames = () => stages.map((s) => s.name)

/** Postgres (DATABASE_URL, or embedded), migrated before anything else uses it. */
export const layerDb = Layer.effectDiscard(Migrations.migrate().pipe(
  Effect.tap((r) => r.applied.length > 0 ? Effect.logInfo(`migrations applied: ${r.applied.join(", ")}`) : Effect.void)
)).pipe(Layer.provideMerge(Db.layer))

export const layerQueue = PgQueue.layer({ knownStages: stageNames() }).pipe(Layer.provideMerge(layerDb))

/** Select stages by name (`--stages a,b`); all when none are named. Unknown names fail start-up. */
export const selectStages = (names: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    if (names.length === 0) return stages
    const unknown = names.filter((n) => !stages.some((s) => s.name === n))
    if (unknown.length > 0) {
      return yield* Effect.fail(`unknown stage(s): ${unknown.join(", ")}; known: ${stageNames().join(", ") || "(none)"}`)
    }
    return stages.filter((s) => names.includes(s.name))
  })

export const layerWorker = (
  selected: ReadonlyArray<Stage.Stage<any, any, StageRequirements>>
): Layer.Layer<Waker.Waker | Worker.WorkerInfo, ConfigError.ConfigError, Queue.Queue | StageRequirements> =>
  Layer.unwrapEffect(Effect.map(Worker.config, (options) => Worker.layer(selected, options)))
