/**
 * Db: the one way pgfiber talks to Postgres. A scoped porsager `postgres` pool, a FiberRef that carries the
 * caller's transaction so queue operations can join it, `withOrg` for one row-level-security scoped
 * transaction, and `forOrg` / `asOwner` for a whole stretch of work done for one org (a job's handler) or, named
 * as such, as the owner (sweeps, maintenance).
 *
 * No fault of a connection may kill the process or hang a fiber:
 * - a transaction's connection is pinned (`reserve`) and watched: once its backend is gone, nothing more is sent on
 *   it, and it is not handed back to the pool (porsager/postgres#1208: a write on a reserved connection whose socket
 *   closed throws from a timer, outside any promise, and a released dead connection hangs the next query);
 * - BEGIN…COMMIT/ROLLBACK and the connection's release run uninterruptibly from the body's Exit; an interrupted
 *   statement is cancelled on the server (`query.cancel()`), so the connection is never left mid-transaction;
 * - what porsager itself leaves unobserved (its array-type fetch on a fresh connection, a write racing a close) is
 *   caught by `ConnectionFaultGuard`, which logs known connection faults and nothing else;
 * - while the database is known to be down, work started outside a transaction fails within `failFastAfter`
 *   (a 503 in about a second), instead of waiting out porsager's reconnect backoff;
 * - `listen` owns the LISTEN connection and reports when it drops, so the Waker can say `down` and poll;
 * - behind a transaction pooler (`pooler: "transaction"`) the pool never has two statements in flight on one
 *   connection outside a transaction (`ConnectionSlots`): the pooler would hand the server connection on after
 *   the first, and the second would never be answered;
 * - closing waits only for the Db's own statements still out, at most `closeWithin`, never for what a lost
 *   connection left behind in porsager, so a shutdown after a restart or backend kills is as quick as any other.
 *
 * In parts (db/): one statement and its error (Statement.ts), the porsager instances and their close
 * (Connections.ts), outage tracking (Outage.ts), pinned transactions (Transactions.ts), the settings pools
 * (SettingsPools.ts) and LISTEN (Listen.ts). This module is their composition and the service's interface.
 */
import { Config, Context, Effect, FiberRef, Layer, Option, type Redacted, type Scope } from "effect"
import * as ConnectionFaultGuard from "./ConnectionFaultGuard.js"
import * as Connections from "./db/Connections.js"
import * as Listen from "./db/Listen.js"
import type { ListenConnection, ListenHandlers } from "./db/Listen.js"
import * as Outage from "./db/Outage.js"
import * as SettingsPools from "./db/SettingsPools.js"
import { DbError, type Sql } from "./db/Statement.js"
import * as Transactions from "./db/Transactions.js"
import * as EmbeddedPg from "./EmbeddedPg.js"

export { DbError, type InFlight, type Row, runQuery, type Sql, toDbError } from "./db/Statement.js"
export { closeWithin } from "./db/Connections.js"
export { failFastAfter, outageRetry } from "./db/Outage.js"
export { tenantRole } from "./db/Transactions.js"
export { settingsPoolMax } from "./db/SettingsPools.js"
export type { ListenConnection, ListenHandlers } from "./db/Listen.js"

/** Schema names are spliced into DDL, so they are held to a plain identifier. */
export const validSchemaName = (name: string): boolean => /^[a-z_][a-z0-9_]{0,62}$/.test(name)

export interface DbOptions {
  readonly url: Redacted.Redacted<string>
  /** The variable `url` came from, named when it cannot connect; default DATABASE_URL. */
  readonly urlName?: string
  readonly schema: string
  readonly poolMax: number
  readonly applicationName?: string
  /**
   * A direct, session-mode connection for LISTEN and the migrations' advisory lock, when `url` goes through a
   * transaction-pooling PgBouncer (a LISTEN there is lost when the server connection is handed on). Default: `url`.
   */
  readonly listenUrl?: Redacted.Redacted<string>
  /** Named prepared statements (porsager's default); false behind a transaction-pooling PgBouncer before 1.21. */
  readonly prepare?: boolean
  /**
   * `transaction` when `url` goes through a transaction pooler (PgBouncer in transaction mode): at most one
   * statement in flight per connection of the pool (`ConnectionSlots`), and `listenUrl` required. Default `none`.
   */
  readonly pooler?: Pooler
  /** Called for every statement the pool sends (statement counting in tests and the bench). */
  readonly onStatement?: (query: string) => void
}

/** What `url` goes through: straight to PostgreSQL, or a transaction pooler (DB_POOLER). */
export type Pooler = "none" | "transaction"

/**
 * Runs `effect` with every statement of every `Db` under `orgId`'s row-level security (see `currentOrg`).
 * JobRun wraps each handler of a job that has an org in it. A transaction already open when this starts is
 * joined as it is (the org applies to the transactions and statements begun inside).
 */
export const forOrg = (orgId: string) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.locally(effect, Transactions.currentOrg, Option.some(orgId))

/**
 * Owner-level work, named as such: statements run as the service's own role, outside row-level security
 * (sweeps across every org, maintenance, the queue's own bookkeeping). Inside a tenant transaction it does
 * not join it: owner work never borrows a tenant's transaction, nor a tenant its privileges.
 */
export const asOwner = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.flatMap(FiberRef.get(Transactions.currentTransaction), (tx) =>
    Effect.locally(
      Option.isSome(tx) && tx.value.orgId !== null ? Effect.locally(effect, Transactions.currentTransaction, Option.none()) : effect,
      Transactions.currentOrg,
      Option.none()
    ))

/** The org the current fiber's database work is scoped to (`forOrg`), if any. */
export const currentOrgId: Effect.Effect<Option.Option<string>> = FiberRef.get(Transactions.currentOrg)

export class Db extends Context.Tag("pgfiber/Db")<Db, {
  readonly pool: Sql
  /**
   * Where session-level locks go (the migrations' advisory lock): `pool` itself unless a separate listen URL is
   * set. LISTEN has a connection of its own (`listen`), to the same URL.
   */
  readonly session: Sql
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
  /**
   * Runs a query with these settings in force for its plans (the claim's planner pins).
   * - Outside a transaction and any org, on a direct connection: on a small pool of its own (at most
   *   `settingsPoolMax` connections per settings object: pass a constant) whose sessions start with them, so a
   *   one-statement query is one round trip, with no BEGIN, SET or COMMIT around it. `atomic`: the query's
   *   statements run in one transaction there (porsager's `begin`).
   * - Otherwise (behind a transaction-pooling PgBouncer, i.e. with a separate listen URL; a server that did not
   *   take the settings at connect; under an org; inside a transaction already): in a transaction with the
   *   settings local to it (porsager's `begin`: no Effect runs inside it, and unlike a reservation it cannot lose
   *   a connection when the connect fails), or for the rest of the caller's transaction.
   */
  readonly runWithSettings: <A>(
    settings: Readonly<Record<string, string>>,
    query: (sql: Sql) => PromiseLike<A>,
    options?: { readonly atomic?: boolean }
  ) => Effect.Effect<A, DbError>
  /**
   * LISTENs on `channel` on a connection of its own for the life of the scope, re-LISTENing with backoff whenever
   * it drops: `onDown` the moment the connection is lost (or cannot be made), `onListening` each time LISTEN is
   * back (notifications may have been missed in between).
   */
  readonly listen: (channel: string, handlers: ListenHandlers) => Effect.Effect<ListenConnection, never, Scope.Scope>
  /** Since when the database has been failing with connection errors (null: it answers). */
  readonly outageSince: Effect.Effect<Date | null>
}>() {}

/** One `select 1`: the database answers (readiness). */
export const ping: Effect.Effect<void, DbError, Db> = Effect.flatMap(Db, (db) => Effect.asVoid(db.run((sql) => sql`select 1`)))

export const make = (options: DbOptions) =>
  Effect.gen(function*() {
    if (!validSchemaName(options.schema)) {
      return yield* Effect.dieMessage(`PGFIBER_SCHEMA: "${options.schema}" is not a plain lower-case identifier`)
    }
    const behindPooler = options.pooler === "transaction"
    if (behindPooler && options.listenUrl === undefined) {
      return yield* new DbError({
        message: "DB_POOLER=transaction needs DATABASE_LISTEN_URL: LISTEN and the migrations' lock need a direct connection",
        code: undefined,
        unavailable: false,
        cause: undefined
      })
    }
    yield* ConnectionFaultGuard.install
    const connections = yield* Connections.make({ ...options, behindPooler })
    const { pool, onPool } = connections
    const outage = Outage.make(onPool(() => pool`select 1`))
    const transactions = Transactions.make(connections, outage)
    const { current, onPinned, begin } = transactions

    const run = <A>(query: (sql: Sql) => PromiseLike<A>): Effect.Effect<A, DbError> =>
      Effect.flatMap(current, (tx) =>
        Option.isSome(tx)
          ? onPinned(tx.value.sql, tx.value.pin, query)
          : Effect.flatMap(FiberRef.get(Transactions.currentOrg), (org) =>
            Option.isNone(org)
              ? outage.outside(outage.observe(onPool<A>(() => query(pool))))
              // one statement for an org: its own short transaction under the tenant role
              : begin(Effect.flatMap(current, (t) => Option.isSome(t) ? onPinned(t.value.sql, t.value.pin, query) : Effect.die("no transaction")), org.value)))

    const runWithSettings = SettingsPools.make(connections, outage, transactions, run, {
      url: options.url,
      sessionSettingsKept: options.listenUrl === undefined && !behindPooler
    })

    return Db.of({
      pool,
      session: connections.session,
      schema: options.schema,
      url: options.url,
      run,
      transaction: transactions.transaction,
      withOrg: (orgId, effect) => begin(effect, orgId),
      inTransaction: transactions.inTransaction,
      runWithSettings,
      listen: (channel, handlers) => Listen.listen(connections, options.listenUrl ?? options.url, channel, handlers),
      outageSince: Effect.sync(outage.since)
    })
  })

/** DATABASE_URL when set; otherwise an embedded PostgreSQL server kept under `.data/postgres`. */
export const config = Config.all({
  url: Config.option(Config.redacted("DATABASE_URL")),
  listenUrl: Config.option(Config.redacted("DATABASE_LISTEN_URL")),
  prepare: Config.boolean("DB_PREPARE").pipe(Config.withDefault(true)),
  pooler: Config.literal("none", "transaction")("DB_POOLER").pipe(Config.withDefault("none" as const)),
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
      return yield* make({
        url,
        schema: cfg.schema,
        poolMax: cfg.poolMax,
        prepare: cfg.prepare,
        pooler: cfg.pooler,
        ...(Option.isSome(cfg.listenUrl) ? { listenUrl: cfg.listenUrl.value } : {})
      })
    })
  )

export const layerWith = (options: DbOptions) => Layer.scoped(Db, make(options))
