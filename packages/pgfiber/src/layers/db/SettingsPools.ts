/**
 * Statements run with settings in force for their plans (the claim's planner pins, its synchronous_commit).
 * Outside a transaction and any org, on a direct connection, on a small pool of its own per settings object whose
 * sessions start with them, so a one-statement query is one round trip with no BEGIN, SET or COMMIT around it;
 * whether the server keeps settings given at connect is checked once, in the background, before the pool is used.
 * Otherwise in a transaction with the settings local to it, or for the rest of the caller's transaction.
 */
import { Duration, Effect, FiberRef, Option, type Redacted } from "effect"
import { closeAll, type Connections } from "./Connections.js"
import type { Outage } from "./Outage.js"
import { type DbError, type Sql, transactionSql } from "./Statement.js"
import { currentOrg, type Transactions } from "./Transactions.js"

/** Most connections of each settings pool (`runWithSettings`): claims are one at a time per stage. */
export const settingsPoolMax = 2

interface SettingsPool {
  /** unknown: not checked (or the check found the database down); checking; ready: in use; refused: never used. */
  state: "unknown" | "checking" | "ready" | "refused"
  readonly sql: Sql | undefined
}

export type RunWithSettings = <A>(
  settings: Readonly<Record<string, string>>,
  query: (sql: Sql) => PromiseLike<A>,
  options?: { readonly atomic?: boolean }
) => Effect.Effect<A, DbError>

/** `set_config(name, value, true)` for each setting, in one statement. */
const localSettings = (sql: Sql, settings: Readonly<Record<string, string>>) =>
  sql`select set_config(name, value, true) from unnest(${Object.keys(settings)}::text[], ${Object.values(settings)}::text[]) as s(name, value)`

export interface SettingsPoolsOptions {
  readonly url: Redacted.Redacted<string>
  /**
   * Session settings do not follow the client behind a transaction-pooling PgBouncer (a separate listen URL, or
   * DB_POOLER=transaction), so settings pools are never tried there.
   */
  readonly sessionSettingsKept: boolean
}

/**
 * The pools for settings objects (keyed by the object, which callers keep as a constant: no key is computed on the
 * claim's path): the pool for these settings once its first session showed them in force; null while that is not
 * known, or when the server (or a pooler in between) does not keep them.
 */
const pools = (connections: Connections, options: SettingsPoolsOptions) => {
  const known = new Map<Readonly<Record<string, string>>, SettingsPool>()
  const name = "a claim settings pool"
  return (settings: Readonly<Record<string, string>>): Effect.Effect<Sql | null> =>
    Effect.suspend(() => {
      if (!options.sessionSettingsKept) return Effect.succeed(null)
      const was = known.get(settings)
      if (was?.state === "ready") return Effect.succeed(was.sql!)
      if (was?.state === "refused" || was?.state === "checking") return Effect.succeed(null)
      const entry: SettingsPool = was ?? { state: "checking", sql: connections.connect(name, options.url, settingsPoolMax, true, settings) }
      entry.state = "checking"
      known.set(settings, entry)
      const sql = entry.sql!
      const names = Object.keys(settings)
      const values = Object.values(settings)
      // checked in the background: until it answers, the caller takes the transaction path
      return Effect.forkDaemon(
        connections.send(() =>
          sql<Array<{ kept: boolean }>>`select bool_and(current_setting(name) = value) as kept from unnest(${names}::text[], ${values}::text[]) as s(name, value)`
        ).pipe(
          Effect.timeout(Duration.seconds(30)),
          Effect.matchEffect({
            onSuccess: ([row]) =>
              row?.kept === true
                ? Effect.sync(() => (entry.state = "ready"))
                : Effect.zipRight(
                  Effect.zipRight(Effect.sync(() => (entry.state = "refused")), closeAll([{ name, sql }], connections.inFlight)),
                  Effect.logInfo("the database does not keep settings given at connect; claims set theirs in a transaction")
                ),
            // the database down or slow: ask again at the next use; any other refusal (a pooler that rejects the
            // parameters, a server that does not know one): never
            onFailure: (e) => {
              entry.state = e._tag === "TimeoutException" || (e.unavailable && e.code !== "08P01") ? "unknown" : "refused"
              return entry.state === "refused" ? closeAll([{ name, sql }], connections.inFlight) : Effect.void
            }
          })
        )
      ).pipe(Effect.as(null))
    })
}

/**
 * `runWithSettings` over this Db's parts; `run` is the Db's own (a statement on the caller's transaction, or on
 * the pool).
 */
export const make = (
  connections: Connections,
  outage: Outage,
  transactions: Transactions,
  run: <A>(query: (sql: Sql) => PromiseLike<A>) => Effect.Effect<A, DbError>,
  options: SettingsPoolsOptions
): RunWithSettings => {
  const settingsPool = pools(connections, options)
  const { onPinned } = transactions
  return <A>(settings: Readonly<Record<string, string>>, query: (sql: Sql) => PromiseLike<A>, runOptions: { readonly atomic?: boolean } = {}) =>
    Effect.flatMap(transactions.current, (tx) =>
      Option.isSome(tx)
        ? Effect.zipRight(onPinned(tx.value.sql, tx.value.pin, (s) => localSettings(s, settings)), onPinned(tx.value.sql, tx.value.pin, query))
        : Effect.flatMap(FiberRef.get(currentOrg), (org) =>
          Option.isSome(org)
            ? transactions.begin(Effect.zipRight(run((s) => localSettings(s, settings)), run(query)), org.value)
            : Effect.flatMap(settingsPool(settings), (ready) =>
              ready !== null
                // one round trip: the session already has the settings
                ? outage.outside(outage.observe(connections.send(() =>
                  runOptions.atomic ? ready.begin(async (sql) => await query(transactionSql(sql))) as PromiseLike<A> : query(ready)
                )))
                // plain SQL in porsager's own transaction: a killed backend rejects it, and the connection goes
                // back among the closed ones by porsager's own bookkeeping. The settings and the statement are
                // pipelined, the settings written first (so the statement is planned under them): BEGIN, one
                // round trip for both, COMMIT. (porsager sends a statement's first use on a connection alone,
                // to describe it, so the very first claim still waits for the settings.)
                : outage.outside(outage.observe(connections.onPool(() =>
                  connections.pool.begin((sql) => {
                    const set = localSettings(transactionSql(sql), settings).execute()
                    return Promise.all([set, query(transactionSql(sql))]).then(([, result]) => result)
                  }) as PromiseLike<A>
                ))))))
}
