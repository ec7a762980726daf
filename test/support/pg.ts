/**
 * Postgres for a test file: the run's server (see globalSetup), a fresh schema per file (or per call),
 * migrated, and dropped afterwards, so files run in parallel without seeing each other's jobs.
 */
import { Effect, Layer, Redacted } from "effect"
import postgres from "postgres"
import { inject } from "vitest"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"

export const databaseUrl = (): string => inject("databaseUrl")

let counter = 0
export const freshSchemaName = (prefix = "t") =>
  `${prefix}_${process.pid}_${Date.now().toString(36)}_${counter++}`.toLowerCase()

/** A Db layer on a new, migrated schema that is dropped when the layer is released. */
export const layerDb = (
  options: { readonly schema?: string; readonly poolMax?: number; readonly onStatement?: (query: string) => void } = {}
) => {
  const schema = options.schema ?? freshSchemaName()
  return Layer.scoped(
    Db.Db,
    Effect.gen(function*() {
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const db = yield* Db.make({
        url: Redacted.make(databaseUrl()),
        schema,
        poolMax: options.poolMax ?? 10,
        ...(options.onStatement !== undefined ? { onStatement: options.onStatement } : {})
      })
      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
      return db
    }).pipe(Effect.orDie)
  )
}

/** A plain porsager client for assertions made from outside pgfiber (as an operator would with psql). */
export const rawSql = (schema?: string) =>
  postgres(databaseUrl(), {
    max: 4,
    onnotice: () => undefined,
    ...(schema ? { connection: { search_path: schema } } : {})
  })

export const dropSchema = (schema: string) =>
  Effect.promise(async () => {
    const sql = rawSql()
    try {
      await sql.unsafe(`drop schema if exists ${schema} cascade`)
    } finally {
      await sql.end({ timeout: 5 })
    }
  }).pipe(Effect.ignore)
