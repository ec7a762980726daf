/**
 * Db: the one way pgfiber talks to Postgres. A scoped porsager `postgres` pool, a FiberRef that carries the
 * caller's transaction so queue operations can join it, `withOrg` for one row-level-security scoped
 * transaction, and `forOrg` / `asOwner` for a whole stretch of work done for one org (a job's handler) or, named
 * as such, as the owner (sweeps, maintenance).
 */
import { Config, Context, Data, Effect, Exit, FiberRef, Layer, Option, Redacted, Schedule } from "effect"
import postgres from "postgres"
import * as EmbeddedPg from "./EmbeddedPg.js"

export type Sql = postgres.Sql<{}>
export type Row = postgres.Row

/** A query failed or the server could not be reached; `unavailable` marks connection-level trouble. */
export class DbError extends Data.TaggedError("DbError")<{
  readonly message: string
  readonly code: string | undefined
  readonly unavailable: boolean
  readonly cause: unknown
}> {}

const connectionCodes = new Set([
  "ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "ENOTFOUND", "EHOSTUNREACH",
  "CONNECTION_CLOSED", "CONNECTION_ENDED", "CONNECTION_DESTROYED", "CONNECT_TIMEOUT",
  "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004"
])

export const toDbError = (cause: unknown): DbError => {
  const e = cause as { code?: unknown; message?: unknown }
  const code = typeof e?.code === "string" ? e.code : undefined
  return new DbError({
    message: typeof e?.message === "string" ? e.message : String(cause),
    code,
    unavailable: code !== undefined && connectionCodes.has(code),
    cause
  })
}

/** Schema names are spliced into DDL, so they are held to a plain identifier. */
export const validSchemaName = (name: string): boolean => /^[a-z_][a-z0-9_]{0,62}$/.test(name)

export interface DbOptions {
  readonly url: Redacted.Redacted<string>
  readonly schema: string
  readonly poolMax: number
  readonly applicationName?: string
  /** Called for every statement the pool sends (statement counting in tests and the bench). */
  readonly onStatement?: (query: string) => void
}

/** The transaction a fiber is inside, if any; queue operations run on it instead of the pool. */
const currentTransaction = FiberRef.unsafeMake<Option.Option<{ readonly owner: object; readonly sql: Sql; readonly orgId: string | null }>>(
  Option.none()
)

/**
 * The org a fiber's database work is done for, if any. While set, `run` outside a transaction sends each
 * statement in a short transaction of its own under the tenant role with `pgfiber.org_id` set, and
 * `transaction` begins under them: row-level security applies to every row, and no transaction is held open
 * across the outside calls between statements (SpeechKit, ffmpeg). Set by `forOrg`, cleared by `asOwner`.
 */
const currentOrg = FiberRef.unsafeMake<Option.Option<string>>(Option.none())

/**
 * Runs `effect` with every statement of every `Db` under `orgId`'s row-level security (see `currentOrg`).
 * JobRun wraps each handler of a job that has an org in it. A transaction already open when this starts is
 * joined as it is (the org applies to the transactions and statements begun inside).
 */
export const forOrg = (orgId: string) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.locally(effect, currentOrg, Option.some(orgId))

/**
 * Owner-level work, named as such: statements run as the service's own role, outside row-level security
 * (sweeps across every org, maintenance, the queue's own bookkeeping). Inside a tenant transaction it does
 * not join it: owner work never borrows a tenant's transaction, nor a tenant its privileges.
 */
export const asOwner = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.flatMap(FiberRef.get(currentTransaction), (tx) =>
    Effect.locally(
      Option.isSome(tx) && tx.value.orgId !== null ? Effect.locally(effect, currentTransaction, Option.none()) : effect,
      currentOrg,
      Option.none()
    ))

/** The org the current fiber's database work is scoped to (`forOrg`), if any. */
export const currentOrgId: Effect.Effect<Option.Option<string>> = FiberRef.get(currentOrg)

export class Db extends Context.Tag("pgfiber/Db")<Db, {
  readonly pool: Sql
  readonly schema: string
  readonly url: Redacted.Redacted<string>
  /**
   * Runs a query on the caller's transaction when there is one, else on the pool (under `forOrg`, in a short
   * transaction of its own as the tenant). Interruption cancels it.
   */
  readonly run: <A>(query: (sql: Sql) => PromiseLike<A>) => Effect.Effect<A, DbError>
  /** Runs `effect` inside one transaction (as the tenant under `forOrg`); joins the caller's transaction if already inside one. */
  readonly transaction: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | DbError, R>
  /** A transaction under the tenant role with `pgfiber.org_id` set, so row-level security scopes every row. */
  readonly withOrg: <A, E, R>(orgId: string, effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | DbError, R>
  /** True when the caller is inside `transaction`. */
  readonly inTransaction: Effect.Effect<boolean>
}>() {}

/** Wraps a porsager query so interrupting the fiber cancels it on the server. */
export const runQuery = <A>(thunk: () => PromiseLike<A>): Effect.Effect<A, DbError> =>
  Effect.async<A, DbError>((resume) => {
    let query: PromiseLike<A>
    try {
      query = thunk()
    } catch (cause) {
      resume(Effect.fail(toDbError(cause)))
      return
    }
    query.then(
      (rows) => resume(Effect.succeed(rows)),
      (cause) => resume(Effect.fail(toDbError(cause)))
    )
    return Effect.sync(() => {
      const cancel = (query as { cancel?: () => unknown }).cancel
      if (typeof cancel === "function") {
        try {
          void Promise.resolve(cancel.call(query)).catch(() => undefined)
        } catch {
          // the query had already finished
        }
      }
    })
  })

export const tenantRole = "pgfiber_tenant"

export const make = (options: DbOptions) =>
  Effect.gen(function*() {
    if (!validSchemaName(options.schema)) {
      return yield* Effect.dieMessage(`PGFIBER_SCHEMA: "${options.schema}" is not a plain lower-case identifier`)
    }
    const pool: Sql = yield* Effect.acquireRelease(
      Effect.sync(() =>
        postgres(Redacted.value(options.url), {
          max: options.poolMax,
          onnotice: () => undefined,
          ...(options.onStatement ? { debug: (_conn: number, query: string) => options.onStatement!(query) } : {}),
          idle_timeout: 0,
          connect_timeout: 10,
          connection: {
            search_path: `${options.schema}`,
            application_name: options.applicationName ?? "pgfiber"
          }
        })
      ),
      (sql) => Effect.promise(() => sql.end({ timeout: 5 }).catch(() => undefined))
    )
    // probe on start so a bad DATABASE_URL fails here, not at the first job
    yield* runQuery(() => pool`select 1`).pipe(
      Effect.retry({ times: 20, schedule: Schedule.spaced("250 millis"), while: (e) => e.unavailable }),
      Effect.mapError((e) => new DbError({ ...e, message: `DATABASE_URL: cannot connect: ${e.message}` }))
    )
    const owner = {}

    const current = Effect.map(FiberRef.get(currentTransaction), (tx) =>
      Option.isSome(tx) && tx.value.owner === owner ? tx.value.sql : pool
    )

    const inTransaction = Effect.map(FiberRef.get(currentTransaction), (tx) => Option.isSome(tx) && tx.value.owner === owner)

    /** BEGIN and the org's settings pipelined on one connection; both must succeed before any statement runs. */
    const beginAsTenant = (conn: Sql, orgId: string) =>
      runQuery(() =>
        Promise.all([
          conn`begin`,
          conn`select set_config('role', ${tenantRole}, true), set_config('pgfiber.org_id', ${orgId}, true)`
        ])
      ).pipe(Effect.asVoid)

    const begin = <A, E, R>(effect: Effect.Effect<A, E, R>, orgId: string | null) =>
      Effect.flatMap(inTransaction, (inside) =>
        inside
          ? orgId === null ? effect : Effect.zipRight(Effect.flatMap(current, (sql) => setOrg(sql, orgId)), effect)
          : Effect.uninterruptibleMask((restore) =>
            Effect.gen(function*() {
              const reserved = yield* runQuery(() => pool.reserve())
              const conn = reserved as unknown as Sql
              const exit = yield* Effect.exit(
                restore(
                  (orgId === null ? runQuery(() => conn`begin`) : beginAsTenant(conn, orgId)).pipe(
                    Effect.zipRight(Effect.locally(effect, currentTransaction, Option.some({ owner, sql: conn, orgId })))
                  )
                )
              )
              const finish = Exit.isSuccess(exit) ? runQuery(() => conn`commit`) : runQuery(() => conn`rollback`)
              const finished = yield* Effect.exit(finish)
              reserved.release()
              if (Exit.isFailure(finished) && Exit.isSuccess(exit)) return yield* Effect.asVoid(finished).pipe(Effect.as(exit.value))
              return yield* exit
            })
          ))

    const setOrg = (sql: Sql, orgId: string) =>
      runQuery(() => sql`select set_config('role', ${tenantRole}, true), set_config('pgfiber.org_id', ${orgId}, true)`).pipe(
        Effect.asVoid
      )

    // a transaction already open is joined as it is; a new one begins as the tenant under `forOrg`
    const transaction = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.flatMap(inTransaction, (inside) =>
        inside ? effect : Effect.flatMap(FiberRef.get(currentOrg), (org) => begin(effect, Option.getOrNull(org))))

    const withOrg = <A, E, R>(orgId: string, effect: Effect.Effect<A, E, R>) => begin(effect, orgId)

    const run = <A>(query: (sql: Sql) => PromiseLike<A>): Effect.Effect<A, DbError> =>
      Effect.flatMap(inTransaction, (inside) =>
        inside
          ? Effect.flatMap(current, (sql) => runQuery<A>(() => query(sql)))
          : Effect.flatMap(FiberRef.get(currentOrg), (org) =>
            Option.isNone(org)
              ? runQuery<A>(() => query(pool))
              // one statement for an org: its own short transaction under the tenant role
              : begin(Effect.flatMap(current, (sql) => runQuery<A>(() => query(sql))), org.value)))

    return Db.of({ pool, schema: options.schema, url: options.url, run, transaction, withOrg, inTransaction })
  })

/** DATABASE_URL when set; otherwise an embedded PostgreSQL server kept under `.data/postgres`. */
export const config = Config.all({
  url: Config.option(Config.redacted("DATABASE_URL")),
  // validate before the default, so an error names the variable
  schema: Config.string("PGFIBER_SCHEMA").pipe(
    Config.validate({ message: "must be a lower-case identifier (a-z, 0-9, _)", validation: validSchemaName }),
    Config.withDefault("pgfiber")
  ),
  poolMax: Config.integer("DB_POOL_MAX").pipe(
    Config.validate({ message: "must be between 1 and 1000", validation: (n) => n >= 1 && n <= 1000 }),
    Config.withDefault(10)
  )
})

export const layer: Layer.Layer<Db, DbError | EmbeddedPg.EmbeddedPgError | import("effect/ConfigError").ConfigError> =
  Layer.scoped(
    Db,
    Effect.gen(function*() {
      const cfg = yield* config
      const url = Option.isSome(cfg.url) ? cfg.url.value : (yield* EmbeddedPg.start(yield* EmbeddedPg.config)).url
      return yield* make({ url, schema: cfg.schema, poolMax: cfg.poolMax })
    })
  )

export const layerWith = (options: DbOptions) => Layer.scoped(Db, make(options))
