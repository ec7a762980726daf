/**
 * What the commands run on: the stages this build knows (App.stages, plus `pgfiber.echo` when enabled), the
 * Postgres layers (migrating first only where that is wanted), and the service layers built from them.
 * App (every pipeline's stages and outside-world clients) is imported when a command runs, not when the CLI
 * loads: `pgfiber --help` and a mistyped command never load the pipelines (`npm run bench:startup`).
 */
import { Config, Effect, Layer } from "effect"
import type * as App from "../App.js"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Migrations from "pgfiber/internal/queue/Migrations.js"
import * as PgQueue from "pgfiber/internal/queue/PgQueue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import * as Events from "pgfiber/internal/runtime/Events.js"
import type * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as ApiKeys from "../auth/ApiKeys.js"
import * as EchoStage from "../stages/echo/EchoStage.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"

export type KnownStage = Stage.Stage<any, any, App.StageRequirements>

/** App, loaded once, on first use. */
export const loadApp = Effect.promise(() => import("../App.js"))

/** Every stage this process knows; enqueueing elsewhere is refused. */
export const knownStages: Effect.Effect<ReadonlyArray<KnownStage>, import("effect/ConfigError").ConfigError> =
  Effect.flatMap(loadApp, (app) => EchoStage.withEcho(app.stages))

/** The stages' own retention (`retain`) for the queue, as App.retentionOf (which loads with App). */
export const retentionOf = (list: ReadonlyArray<Stage.Any>) => ({
  stages: Object.fromEntries(list.flatMap((s) => (s.retain === undefined ? [] : [[s.name, s.retain] as const])))
})

export const parseList = (text: string) => text.split(",").map((s) => s.trim()).filter(Boolean)

/**
 * What to run here (`--stages a,b`, or everything configured): App.selectStages, plus `pgfiber.echo` when it
 * is enabled and wanted. Unknown names, and named stages whose pipeline is not configured, fail start-up.
 */
export const select = (known: ReadonlyArray<KnownStage>, stageList: string) =>
  Effect.gen(function*() {
    const names = parseList(stageList)
    const echoKnown = known.some((s) => s.name === EchoStage.name)
    const appNames = names.filter((n) => !(echoKnown && n === EchoStage.name))
    const selection: App.Selection = names.length > 0 && appNames.length === 0
      ? { stages: [], pipelines: [] }
      : yield* Effect.flatMap(loadApp, (app) => app.selectStages(appNames))
    const withEcho = echoKnown && (names.length === 0 || names.includes(EchoStage.name))
    return withEcho ? { ...selection, stages: [...selection.stages, EchoStage.stage] } : selection
  })

/** The selected pipelines' outside services (storage, SpeechKit, …), for handlers run outside a worker pool. */
export const stageServices = (selection: App.Selection): Layer.Layer<App.PipelineServices, App.PipelineError> =>
  Layer.unwrapEffect(Effect.map(loadApp, (app) => app.pipelineServices(selection)))

/** `start` and `worker` apply pending migrations first unless told not to (then run `pgfiber migrate` on deploy). */
export const migrateOnStart = Config.boolean("PGFIBER_MIGRATE_ON_START").pipe(Config.withDefault(true))

/**
 * Postgres for a command that does not migrate, checked first: on a database without this build's migrations it
 * fails with one line saying to run `pgfiber migrate` (exit 2), instead of `relation "jobs" does not exist`.
 */
export const layerDbChecked = Layer.effectDiscard(Migrations.requireCurrent()).pipe(Layer.provideMerge(Db.layer))

/**
 * Postgres and the queue for operator commands: never migrates (an operator's `stats` from a newer build must
 * not change a production schema), so a fresh database needs `pgfiber migrate` first. Lists and stats read
 * through Reads (on DATABASE_READ_URL when it is set).
 */
export const layerOps = (stages: ReadonlyArray<KnownStage>) =>
  Layer.mergeAll(ApiKeys.layer, Reads.layer, Layer.succeed(Submit.KnownStages, stages)).pipe(
    Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name), retention: retentionOf(stages) })),
    Layer.provideMerge(layerDbChecked)
  )

/**
 * Postgres and the queue for the long-running commands, migrated first when PGFIBER_MIGRATE_ON_START allows (else
 * checked, as for operator commands), with the process's job-events bus (Events.ts) that the queue, the workers
 * and the HTTP API share.
 */
export const layerService = (stages: ReadonlyArray<KnownStage>, migrate: boolean) => {
  const db: Layer.Layer<Db.Db, Layer.Layer.Error<typeof App.layerDb> | Migrations.NotMigrated> = migrate
    ? Layer.unwrapEffect(Effect.map(loadApp, (app) => app.layerDb))
    : layerDbChecked
  return Layer.mergeAll(ApiKeys.layer, Layer.succeed(Submit.KnownStages, stages)).pipe(
    Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name), retention: retentionOf(stages) })),
    Layer.provideMerge(Layer.merge(db, Events.layer()))
  )
}
