/**
 * Forward-only migrations: `migrations/NNNN_name.sql`, applied in order under an advisory lock, each in its
 * own transaction, recorded in `<schema>.migrations`. A database that has a migration this build does not
 * know refuses to be run against: an old deploy must not write to a newer schema.
 */
import { Data, Effect } from "effect"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import * as Db from "../layers/Db.js"

export class MigrationError extends Data.TaggedError("MigrationError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

/** The database lacks migrations this build needs (none at all on a fresh one): run `pgfiber migrate`. */
export class NotMigrated extends Data.TaggedError("NotMigrated")<{
  readonly message: string
  readonly missing: ReadonlyArray<string>
}> {}

export interface Migration {
  readonly id: number
  readonly name: string
  readonly sql: string
}

/**
 * The core package's `migrations/` folder, found from this module's own location (not the working directory), so
 * an installed package finds its SQL: two levels up from `src/queue/` (tsx) or `dist/queue/` (compiled); from the
 * service's bundled CLI (`@pgfiber/service/dist/`), the folder of the `pgfiber` package it depends on.
 */
const migrationsDir = ((): string => {
  const here = Path.dirname(fileURLToPath(import.meta.url))
  const ofPackage = (): Array<string> => {
    try {
      return [Path.join(Path.dirname(createRequire(import.meta.url).resolve("pgfiber/package.json")), "migrations")]
    } catch {
      return []
    }
  }
  const candidates = [Path.resolve(here, "../../migrations"), ...ofPackage()]
  return candidates.find((dir) => Fs.existsSync(Path.join(dir, "0001_queue.sql"))) ?? candidates[0]!
})()

export const load = (dir: string = migrationsDir): ReadonlyArray<Migration> =>
  Fs.readdirSync(dir)
    .filter((file) => /^\d{4}_[a-z0-9_]+\.sql$/.test(file))
    .sort()
    .map((file) => ({
      id: Number(file.slice(0, 4)),
      name: file.slice(5, -4),
      sql: Fs.readFileSync(Path.join(dir, file), "utf8")
    }))

/** Only `{{schema}}` is substituted, and only with a name `Db.validSchemaName` accepts. */
const render = (migration: Migration, schema: string) => migration.sql.replaceAll("{{schema}}", schema)

export interface MigrateResult {
  readonly applied: ReadonlyArray<string>
  readonly current: number
}

export const migrate = (options: { readonly migrations?: ReadonlyArray<Migration> } = {}) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const migrations = options.migrations ?? load()
    const known = migrations.reduce((max, m) => Math.max(max, m.id), 0)
    const schema = db.schema
    return yield* Effect.acquireUseRelease(
      // the session connection: a session-level advisory lock must stay on one server connection (no pooler)
      Db.runQuery(() => db.session.reserve()),
      (conn) => {
        const q = <A>(f: () => Promise<A>) => Db.runQuery(f)
        return Effect.gen(function*() {
          yield* q(() => conn`select pg_advisory_lock(hashtext(${`pgfiber.migrate.${schema}`}))`)
          yield* q(() => conn.unsafe(`create schema if not exists ${schema}`))
          yield* q(() =>
            conn.unsafe(
              `create table if not exists ${schema}.migrations (id integer primary key, name text not null, applied_at timestamptz not null default now())`
            )
          )
          const rows = yield* q(() => conn.unsafe<Array<{ id: number }>>(`select id from ${schema}.migrations order by id`))
          const done = new Set(rows.map((r) => r.id))
          const newest = rows.reduce((max, r) => Math.max(max, r.id), 0)
          if (newest > known) {
            return yield* new MigrationError({
              message: `database schema "${schema}" is at migration ${newest}, newer than this build knows (${known}); deploy the newer pgfiber`
            })
          }
          const applied: Array<string> = []
          for (const m of migrations) {
            if (done.has(m.id)) continue
            // one simple-protocol round trip: the file and its bookkeeping commit together or not at all
            yield* q(() =>
              conn.unsafe(
                `begin;\n${render(m, schema)}\n;insert into ${schema}.migrations (id, name) values (${m.id}, '${m.name}');\ncommit;`
              ).simple()
            ).pipe(
              Effect.tapError(() => q(() => conn`rollback`).pipe(Effect.ignore)),
              Effect.mapError((e) => new MigrationError({ message: `migration ${m.id}_${m.name} failed: ${e.message}`, cause: e }))
            )
            applied.push(`${String(m.id).padStart(4, "0")}_${m.name}`)
          }
          return { applied, current: Math.max(newest, known) }
        }).pipe(
          Effect.ensuring(q(() => conn`select pg_advisory_unlock(hashtext(${`pgfiber.migrate.${schema}`}))`).pipe(Effect.ignore))
        )
      },
      (conn) => Effect.sync(() => conn.release())
    ).pipe(Effect.mapError((e) => (e._tag === "DbError" ? new MigrationError({ message: e.message, cause: e }) : e)))
  }).pipe(Effect.withSpan("Migrations.migrate"))

/** PostgreSQL's undefined_table: the schema or its `migrations` table does not exist yet. */
const undefinedTable = "42P01"

/**
 * Read-only: fails with `NotMigrated` (one line naming `pgfiber migrate`) unless every migration this build knows
 * is applied. Commands that never migrate check this first, instead of failing on a missing table.
 */
export const requireCurrent = (options: { readonly migrations?: ReadonlyArray<Migration> } = {}) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const migrations = options.migrations ?? load()
    const applied = yield* db.run((sql) => sql.unsafe<Array<{ id: number }>>(`select id from ${db.schema}.migrations`)).pipe(
      Effect.catchIf((e) => e.code === undefinedTable, () => Effect.succeed(undefined))
    )
    const done = new Set((applied ?? []).map((r) => r.id))
    const missing = migrations.filter((m) => !done.has(m.id)).map((m) => `${String(m.id).padStart(4, "0")}_${m.name}`)
    if (missing.length === 0) return
    return yield* new NotMigrated({
      missing,
      message: applied === undefined || applied.length === 0
        ? `the database has no pgfiber tables (schema "${db.schema}"): run \`pgfiber migrate\` first`
        : `the database schema "${db.schema}" lacks ${missing.length} migration(s) of this build (${missing[0]}${missing.length > 1 ? ", …" : ""}): run \`pgfiber migrate\` first`
    })
  }).pipe(Effect.withSpan("Migrations.requireCurrent"))
