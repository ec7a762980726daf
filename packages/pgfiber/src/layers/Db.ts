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
 */
import { Config, Context, Data, Deferred, Duration, Effect, Exit, FiberRef, Layer, Option, Queue as Q, Redacted, Schedule, type Scope } from "effect"
import postgres from "postgres"
import * as ConnectionFaultGuard from "./ConnectionFaultGuard.js"
import * as ConnectionSlots from "./ConnectionSlots.js"
import * as EmbeddedPg from "./EmbeddedPg.js"

export type Sql = postgres.Sql<{}>
export type Row = postgres.Row

/**
 * A transaction's handle as the `Sql` the statements are written against: the project's one `as unknown as`.
 * porsager runs a statement on it as on its pool, but types it apart (`TransactionSql` has the tagged template,
 * `unsafe`, `json`, `array` and the rest a statement uses, not the pool's `begin`, `reserve`, `end`, which no
 * statement calls), and the two types do not overlap enough for a plain `as`.
 */
const transactionSql = (sql: postgres.TransactionSql<{}>): Sql => sql as unknown as Sql

/** A query failed or the server could not be reached; `unavailable` marks connection-level trouble. */
export class DbError extends Data.TaggedError("DbError")<{
  readonly message: string
  readonly code: string | undefined
  readonly unavailable: boolean
  readonly cause: unknown
}> {}

const connectionCodes = ConnectionFaultGuard.connectionCodes

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

/** The transaction a fiber is inside, if any; queue operations run on it instead of the pool. */
const currentTransaction = FiberRef.unsafeMake<Option.Option<{ readonly owner: object; readonly sql: Sql; readonly orgId: string | null; readonly pin: Pin }>>(
  Option.none()
)

/**
 * A transaction's reserved connection, watched. porsager clears a connection's `reserved` mark when its socket
 * closes (and a later reservation sets a new one), so the mark seen at BEGIN tells whether this is still our
 * session; an unavailable error on it marks it dead too. A dead pin sends nothing more and is never released:
 * porsager has already put the connection back among its closed ones.
 */
interface Pin {
  readonly alive: () => boolean
  markDead: () => void
}

const connectionLost = () =>
  new DbError({
    message: "the transaction's connection to the database was lost",
    code: "CONNECTION_CLOSED",
    unavailable: true,
    cause: undefined
  })

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

/** Statements on the LISTEN connection itself (a session: its advisory locks last until it drops). */
export interface ListenConnection {
  readonly run: <A>(query: (sql: Sql) => PromiseLike<A>) => Effect.Effect<A, DbError>
  /**
   * LISTENs on another channel too, on the same connection, for the life of the scope: its notifications go to
   * `onNotify`. Returns once the LISTEN is answered, or at once while the connection is down; every reconnect
   * LISTENs on it again before `onListening` (which then stands for this channel's catch-up too).
   */
  readonly also: (channel: string, onNotify: (payload: string) => void) => Effect.Effect<void, never, Scope.Scope>
}

export interface ListenHandlers {
  readonly onNotify: (payload: string) => void
  readonly onListening: () => void
  readonly onDown: (reason: string) => void
}

/** While the database is known to be down, how long work begun outside a transaction may wait before it fails. */
export const failFastAfter = Duration.seconds(1)

/**
 * How work retries while the database is away (a claim, a settle, LISTEN): exponential from `first`, at most a
 * second apart, so it is back at full speed within a second of the database's return. Callers that must give up
 * add their own limit (`Schedule.upTo`).
 */
export const outageRetry = (first: Duration.DurationInput) => Schedule.exponential(first).pipe(Schedule.union(Schedule.spaced("1 second")))

/** porsager's reconnect backoff, capped at a second (its own grows to 20 s), jittered: back to full speed soon after a restart. */
const reconnectBackoff = (retries: number) => Math.min(1, 0.05 * 2 ** retries) * (0.75 + Math.random() / 2)

/** A Db's statements sent and not yet answered (nor failed), the ones given up on included: what its close waits for. */
export interface InFlight {
  count: number
}

/** Wraps a porsager query so interrupting the fiber cancels it on the server; counted in `inFlight` until it settles. */
export const runQuery = <A>(thunk: () => PromiseLike<A>, inFlight?: InFlight): Effect.Effect<A, DbError> =>
  Effect.async<A, DbError>((resume) => {
    let query: PromiseLike<A>
    try {
      query = thunk()
    } catch (cause) {
      resume(Effect.fail(toDbError(cause)))
      return
    }
    if (inFlight) inFlight.count++
    query.then(
      (rows) => {
        if (inFlight) inFlight.count--
        resume(Effect.succeed(rows))
      },
      (cause) => {
        if (inFlight) inFlight.count--
        resume(Effect.fail(toDbError(cause)))
      }
    )
    return Effect.sync(() => {
      // porsager: cancelling a query that no connection has sent yet (`state` null) leaks the connection that was
      // opening for it: that connection runs the query as its first, sees it cancelled, and is never handed to the
      // pool. Enough of those (a probe cut at its deadline while the database restarts, again and again) and the
      // pool has no connection left: every later query waits for ever. So an unsent query is left to run, its
      // answer ignored (delivery is at least once); a sent one is cancelled on the server (a CancelRequest).
      const state = (query as { state?: unknown }).state
      if (state === null || state === undefined) return
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

/**
 * How long closing a Db waits for its statements still out (`InFlight`: ones their callers gave up on, left to run
 * with their answers ignored) before it closes their connections anyway. By then everything built on the Db has
 * finished, so nothing waits for those answers.
 */
export const closeWithin = Duration.seconds(1)

/**
 * With no statement of the Db's out, how long closing lets the connections say goodbye (a Terminate each) before
 * it drops them. porsager's `end` would also wait for what a lost connection left behind in it (a statement that
 * failed with its connection but is still that connection's current one, a reconnect stuck with a query queued)
 * until its timeout; after a restart or backend kills, that held every shutdown for 5 s per pool.
 */
const closeIdleWithin = Duration.millis(100)

/**
 * Ends porsager instances together: within `closeIdleWithin` when none of the Db's statements is out, else within
 * `closeWithin`, and then says what was still out.
 */
const closeAll = (instances: ReadonlyArray<{ readonly name: string; readonly sql: Sql }>, inFlight: InFlight) =>
  Effect.suspend(() => {
    const out = inFlight.count
    const within = Duration.toSeconds(out === 0 ? closeIdleWithin : closeWithin)
    return Effect.forEach(instances, ({ sql }) => Effect.promise(() => sql.end({ timeout: within }).catch(() => undefined)), {
      concurrency: "unbounded",
      discard: true
    }).pipe(
      Effect.timed,
      Effect.flatMap(([took]) =>
        out === 0 || Duration.lessThan(took, closeWithin)
          ? Effect.void
          : Effect.logWarning(
            `closing ${instances.map((i) => i.name).join(", ")}: ${out} statement(s) still unanswered after ` +
              `${Duration.format(closeWithin)} (their callers gave up on them); their connections were closed without waiting`
          )
      )
    )
  })

export const tenantRole = "pgfiber_tenant"

/** Most connections of each settings pool (`runWithSettings`): claims are one at a time per stage. */
export const settingsPoolMax = 2

interface SettingsPool {
  /** unknown: not checked (or the check found the database down); checking; ready: in use; refused: never used. */
  state: "unknown" | "checking" | "ready" | "refused"
  readonly sql: Sql | undefined
}

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
    const applicationName = options.applicationName ?? "pgfiber"
    const connectOptions = (max: number, settings: Readonly<Record<string, string>> = {}) => ({
      max,
      prepare: options.prepare ?? true,
      // behind a transaction pooler, a connection ending for its age would sit neither idle nor closed while it
      // closes, and a statement sent then would be pipelined onto a busy one (ConnectionSlots)
      ...(behindPooler ? { max_lifetime: null } : {}),
      onnotice: () => undefined,
      idle_timeout: 0,
      connect_timeout: 5,
      backoff: reconnectBackoff,
      connection: { ...settings, search_path: `${options.schema}`, application_name: applicationName }
    })
    const open = (url: Redacted.Redacted<string>, max: number, statements: boolean, settings?: Readonly<Record<string, string>>) =>
      postgres(Redacted.value(url), {
        ...connectOptions(max, settings),
        ...(statements && options.onStatement ? { debug: (_conn: number, query: string) => options.onStatement!(query) } : {})
      })
    // every statement this Db sends goes through `send`, counted until it settles, so closing knows whether to wait
    const inFlight: InFlight = { count: 0 }
    const send = <A>(thunk: () => PromiseLike<A>) => runQuery(thunk, inFlight)
    // every pool this Db opens, closed together when it closes (one after another, each wait would add up)
    const opened: Array<{ readonly name: string; readonly sql: Sql }> = []
    yield* Effect.addFinalizer(() => closeAll(opened, inFlight))
    const connect = (name: string, url: Redacted.Redacted<string>, max: number, statements: boolean, settings?: Readonly<Record<string, string>>) => {
      const sql = open(url, max, statements, settings)
      opened.push({ name, sql })
      return sql
    }
    const pool: Sql = connect("the pool", options.url, options.poolMax, true)
    // behind a transaction pooler, one statement in flight per connection of the pool; straight to PostgreSQL, no limit
    const slots = behindPooler ? yield* ConnectionSlots.make(options.poolMax) : ConnectionSlots.unbounded
    /** A statement on the pool (not on a transaction's connection). */
    const onPool = <A>(thunk: () => PromiseLike<A>) => slots.statement(thunk, send<A>)
    // the migrations' session-level advisory lock; a separate instance points it past the pooler
    const session: Sql = options.listenUrl === undefined ? pool : connect("the session connection", options.listenUrl, 1, false)
    // probe on start so a bad DATABASE_URL fails here, not at the first job
    yield* onPool(() => pool`select 1`).pipe(
      Effect.retry({ times: 20, schedule: Schedule.spaced("250 millis"), while: (e) => e.unavailable }),
      Effect.mapError((e) => new DbError({ ...e, message: `${options.urlName ?? "DATABASE_URL"}: cannot connect: ${e.message}` }))
    )
    if (session !== pool) {
      yield* send(() => session`select 1`).pipe(
        Effect.retry({ times: 20, schedule: Schedule.spaced("250 millis"), while: (e) => e.unavailable }),
        Effect.mapError((e) => new DbError({ ...e, message: `DATABASE_LISTEN_URL: cannot connect: ${e.message}` }))
      )
    }
    const owner = {}

    // ---- outage: set by a connection error, cleared by any answer; while set, outside work fails fast ----
    let outageSince: Date | null = null
    const observe = <A>(effect: Effect.Effect<A, DbError>): Effect.Effect<A, DbError> =>
      Effect.tapBoth(effect, {
        onFailure: (e) => Effect.sync(() => {
          if (e.unavailable && outageSince === null) outageSince = new Date()
        }),
        onSuccess: () => Effect.sync(() => {
          outageSince = null
        })
      })
    const unavailableFast = () =>
      new DbError({
        message: `the database is unavailable (down since ${outageSince?.toISOString()}; no answer within ${Duration.format(failFastAfter)})`,
        code: "CONNECT_TIMEOUT",
        unavailable: true,
        cause: undefined
      })
    /**
     * While the database is known to be down, a `select 1` that must answer within `failFastAfter`: its answer ends
     * the outage (`observe`). `disconnect`: a probe cut short lets its connection attempt go on in the background,
     * so the next probe finds the connection made.
     */
    const probe = observe(onPool(() => pool`select 1`)).pipe(
      Effect.disconnect,
      Effect.timeoutFail({ duration: failFastAfter, onTimeout: unavailableFast })
    )
    /**
     * Work begun outside a transaction: while the database is known to be down it fails within `failFastAfter`
     * unless the probe answers; once it does, the work runs as usual. The limit is on reaching the database, never
     * on the work: a claim or a settle slower than a second on a loaded machine, just after a restart with cold
     * caches, used to be cut every time, so the outage never ended for that process (a stalled worker in chaos).
     */
    const outside = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | DbError, R> =>
      Effect.suspend(() => (outageSince === null ? effect : Effect.zipRight(probe, effect)))

    const current = Effect.map(FiberRef.get(currentTransaction), (tx) =>
      Option.isSome(tx) && tx.value.owner === owner ? Option.some(tx.value) : Option.none()
    )

    const inTransaction = Effect.map(FiberRef.get(currentTransaction), (tx) => Option.isSome(tx) && tx.value.owner === owner)

    /** A statement on the transaction's pinned connection: never sent on a connection that is gone. */
    const onPinned = <A>(sql: Sql, pin: Pin, query: (sql: Sql) => PromiseLike<A>) =>
      send<A>(() => {
        if (!pin.alive()) throw connectionLost()
        return query(sql)
      }).pipe(Effect.tapError((e) => (e.unavailable ? Effect.sync(pin.markDead) : Effect.void)))

    /**
     * Reserves a connection for a transaction, and BEGINs on it; the pin watches it from BEGIN on. Known limit:
     * porsager's `reserve()` both queues its request and connects a closed connection for it; when that connect
     * fails the request stays queued, and the next connection to open is handed to it and lost to the pool. So
     * the hot path (the claim) does not reserve (`runWithSettings`); transactions still do.
     */
    const reserveAndBegin = (orgId: string | null) =>
      Effect.gen(function*() {
        const reserved = yield* send(() => pool.reserve())
        const conn: Sql = reserved
        // porsager's connection object, seen once as BEGIN is written to it (its `onexecute` hook)
        let handle: { reserved: unknown } | undefined
        let mark: unknown
        let dead = false
        const pin: Pin = {
          alive: () => !dead && (handle === undefined || handle.reserved === mark),
          markDead: () => {
            dead = true
          }
        }
        const beginStatement = () =>
          conn.unsafe("begin", [], {
            onexecute: (c: { reserved: unknown }) => {
              handle = c
              mark = c.reserved
              return true
            }
          } as {})
        return { reserved, conn, pin, beginStatement, orgId }
      })

    /** `set_config(name, value, true)` for each setting, in one statement. */
    const localSettings = (sql: Sql, settings: Readonly<Record<string, string>>) =>
      sql`select set_config(name, value, true) from unnest(${Object.keys(settings)}::text[], ${Object.values(settings)}::text[]) as s(name, value)`

    const begin = <A, E, R>(effect: Effect.Effect<A, E, R>, orgId: string | null) =>
      Effect.flatMap(inTransaction, (inside) =>
        inside
          ? orgId === null
            ? effect
            : Effect.flatMap(current, (tx) =>
              Option.isNone(tx) || tx.value.orgId === orgId
                ? effect
                // joining an open transaction under another org: that org for `effect` only, then back to the
                // transaction's own (the settings are transaction-local, so they would otherwise outlive it)
                : Effect.acquireUseRelease(
                  setOrg(tx.value.sql, tx.value.pin, orgId),
                  () => Effect.locally(effect, currentTransaction, Option.some({ ...tx.value, orgId })),
                  () => restoreOrg(tx.value.sql, tx.value.pin, tx.value.orgId).pipe(Effect.ignore)
                ))
          // a slot for the whole transaction: its connection is not the pool's until it is released
          : outside(slots.transaction((keepOut) =>
            Effect.uninterruptibleMask((restore) =>
              Effect.gen(function*() {
                const { conn, pin, reserved, beginStatement } = yield* observe(reserveAndBegin(orgId))
                // BEGIN and the org's settings pipelined: both must succeed before any statement of the body runs
                const opened: Effect.Effect<unknown, DbError> = orgId === null
                  ? onPinned(conn, pin, () => beginStatement())
                  : onPinned(conn, pin, () =>
                    Promise.all([
                      beginStatement(),
                      conn`select set_config('role', ${tenantRole}, true), set_config('pgfiber.org_id', ${orgId}, true)`
                    ]))
                const exit = yield* Effect.exit(
                  restore(
                    observe(Effect.asVoid(opened)).pipe(
                      Effect.zipRight(Effect.locally(effect, currentTransaction, Option.some({ owner, sql: conn, orgId, pin })))
                    )
                  )
                )
                // the end of the transaction is uninterruptible: COMMIT or ROLLBACK is sent and answered (or the
                // connection is known lost) before the connection goes back
                const finished = yield* Effect.exit(
                  Exit.isSuccess(exit) ? onPinned(conn, pin, (sql) => sql`commit`) : onPinned(conn, pin, (sql) => sql`rollback`)
                )
                // a COMMIT or ROLLBACK that failed on a live connection (a late cancel, say) may leave it inside the
                // transaction, still as the tenant: one more ROLLBACK, and if that fails too the connection is kept
                // out of the pool (one connection fewer) rather than handed to the next caller in that state
                const clean = Exit.isSuccess(finished) ||
                  (pin.alive() && Exit.isSuccess(yield* Effect.exit(onPinned(conn, pin, (sql) => sql`rollback`))))
                // a lost connection is already back among porsager's closed ones: releasing it would hand out a dead one
                if (pin.alive() && clean) reserved.release()
                if (pin.alive() && !clean) keepOut()
                if (Exit.isFailure(finished) && Exit.isSuccess(exit)) return yield* Effect.asVoid(finished).pipe(Effect.as(exit.value))
                return yield* exit
              })
            )
          )))

    /** Back to the transaction's own identity: its org, or the owner's role with no org. */
    const restoreOrg = (sql: Sql, pin: Pin, orgId: string | null) =>
      orgId !== null
        ? setOrg(sql, pin, orgId)
        : onPinned(sql, pin, (s) => s`select set_config('role', 'none', true), set_config('pgfiber.org_id', '', true)`).pipe(Effect.asVoid)

    const setOrg = (sql: Sql, pin: Pin, orgId: string) =>
      onPinned(sql, pin, (s) => s`select set_config('role', ${tenantRole}, true), set_config('pgfiber.org_id', ${orgId}, true)`).pipe(
        Effect.asVoid
      )

    // a transaction already open is joined as it is; a new one begins as the tenant under `forOrg`
    const transaction = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.flatMap(inTransaction, (inside) =>
        inside ? effect : Effect.flatMap(FiberRef.get(currentOrg), (org) => begin(effect, Option.getOrNull(org))))

    const withOrg = <A, E, R>(orgId: string, effect: Effect.Effect<A, E, R>) => begin(effect, orgId)

    // ---- pools whose sessions start with given settings (the claim's planner pins): one per settings object ----
    // (keyed by the object, which callers keep as a constant: no key is computed on the claim's path)
    const settingsPools = new Map<Readonly<Record<string, string>>, SettingsPool>()
    /**
     * The pool for these settings, once its first session showed them in force; null while that is not known, or
     * when the server (or a pooler in between) does not keep them. Behind a transaction-pooling PgBouncer (a
     * separate listen URL, or DB_POOLER=transaction) session settings do not follow the client, so it is never tried there.
     */
    const settingsPool = (settings: Readonly<Record<string, string>>): Effect.Effect<Sql | null> =>
      Effect.suspend(() => {
        if (options.listenUrl !== undefined || behindPooler) return Effect.succeed(null)
        const known = settingsPools.get(settings)
        if (known?.state === "ready") return Effect.succeed(known.sql!)
        if (known?.state === "refused" || known?.state === "checking") return Effect.succeed(null)
        const entry: SettingsPool = known ?? { state: "checking", sql: connect("a claim settings pool", options.url, settingsPoolMax, true, settings) }
        entry.state = "checking"
        settingsPools.set(settings, entry)
        const sql = entry.sql!
        const names = Object.keys(settings)
        const values = Object.values(settings)
        // checked in the background: until it answers, the caller takes the transaction path
        return Effect.forkDaemon(
          send(() =>
            sql<Array<{ kept: boolean }>>`select bool_and(current_setting(name) = value) as kept from unnest(${names}::text[], ${values}::text[]) as s(name, value)`
          ).pipe(
            Effect.timeout(Duration.seconds(30)),
            Effect.matchEffect({
              onSuccess: ([row]) =>
                row?.kept === true
                  ? Effect.sync(() => (entry.state = "ready"))
                  : Effect.zipRight(
                    Effect.zipRight(Effect.sync(() => (entry.state = "refused")), closeAll([{ name: "a claim settings pool", sql }], inFlight)),
                    Effect.logInfo("the database does not keep settings given at connect; claims set theirs in a transaction")
                  ),
              // the database down or slow: ask again at the next use; any other refusal (a pooler that rejects the
              // parameters, a server that does not know one): never
              onFailure: (e) => {
                entry.state = e._tag === "TimeoutException" || (e.unavailable && e.code !== "08P01") ? "unknown" : "refused"
                return entry.state === "refused" ? closeAll([{ name: "a claim settings pool", sql }], inFlight) : Effect.void
              }
            })
          )
        ).pipe(Effect.as(null))
      })

    const runWithSettings = <A>(
      settings: Readonly<Record<string, string>>,
      query: (sql: Sql) => PromiseLike<A>,
      runOptions: { readonly atomic?: boolean } = {}
    ): Effect.Effect<A, DbError> =>
      Effect.flatMap(current, (tx) =>
        Option.isSome(tx)
          ? Effect.zipRight(onPinned(tx.value.sql, tx.value.pin, (s) => localSettings(s, settings)), onPinned(tx.value.sql, tx.value.pin, query))
          : Effect.flatMap(FiberRef.get(currentOrg), (org) =>
            Option.isSome(org)
              ? begin(Effect.zipRight(run((s) => localSettings(s, settings)), run(query)), org.value)
              : Effect.flatMap(settingsPool(settings), (ready) =>
                ready !== null
                  // one round trip: the session already has the settings
                  ? outside(observe(send(() =>
                    runOptions.atomic ? ready.begin(async (sql) => await query(transactionSql(sql))) as PromiseLike<A> : query(ready)
                  )))
                  // plain SQL in porsager's own transaction: a killed backend rejects it, and the connection goes
                  // back among the closed ones by porsager's own bookkeeping. The settings and the statement are
                  // pipelined, the settings written first (so the statement is planned under them): BEGIN, one
                  // round trip for both, COMMIT. (porsager sends a statement's first use on a connection alone,
                  // to describe it, so the very first claim still waits for the settings.)
                  : outside(observe(onPool(() =>
                    pool.begin((sql) => {
                      const set = localSettings(transactionSql(sql), settings).execute()
                      return Promise.all([set, query(transactionSql(sql))]).then(([, result]) => result)
                    }) as PromiseLike<A>
                  ))))))

    const run = <A>(query: (sql: Sql) => PromiseLike<A>): Effect.Effect<A, DbError> =>
      Effect.flatMap(current, (tx) =>
        Option.isSome(tx)
          ? onPinned(tx.value.sql, tx.value.pin, query)
          : Effect.flatMap(FiberRef.get(currentOrg), (org) =>
            Option.isNone(org)
              ? outside(observe(onPool<A>(() => query(pool))))
              // one statement for an org: its own short transaction under the tenant role
              : begin(Effect.flatMap(current, (t) => Option.isSome(t) ? onPinned(t.value.sql, t.value.pin, query) : Effect.die("no transaction")), org.value)))

    // ---- LISTEN on a connection of its own, watched: porsager's `listen` re-LISTENs silently, this one says so ----
    const listen = (channel: string, handlers: ListenHandlers) =>
      Effect.gen(function*() {
        const drops = yield* Q.sliding<string>(1)
        let up = false
        let closing = false
        // the channels LISTENed besides `channel` (`also`), each LISTENed again on every reconnect
        const others = new Map<string, (payload: string) => void>()
        const quoted = (name: string) => `"${name.replace(/"/g, "\"\"")}"`
        const listener = yield* Effect.acquireRelease(
          Effect.sync(() =>
            postgres(Redacted.value(options.listenUrl ?? options.url), {
              ...connectOptions(1),
              fetch_types: false,
              onnotify: (name: string, payload: string) => {
                if (name === channel) handlers.onNotify(payload)
                else others.get(name)?.(payload)
              },
              onclose: () => {
                // a failed connect closes too: only a drop of a listening connection is news (not our own end)
                if (!up || closing) return
                up = false
                handlers.onDown("the LISTEN connection closed")
                Q.unsafeOffer(drops, "closed")
              }
            } as postgres.Options<{}>)
          ),
          (sql) =>
            Effect.suspend(() => {
              closing = true
              return closeAll([{ name: "the LISTEN connection", sql }], inFlight)
            })
        )
        const listenOnce = send(() =>
          listener.unsafe([channel, ...others.keys()].map((c) => `listen ${quoted(c)}`).join("; ")).then((result) => {
            // in the same tick as the answer, so no close can slip in between
            up = true
            return result
          })
        )
        // the first attempt's outcome, either way: `listen` returns once LISTEN is up or has failed once
        const firstAttempt = yield* Deferred.make<void>()
        const session = Effect.gen(function*() {
          yield* Q.takeAll(drops)
          yield* listenOnce.pipe(
            Effect.tapError((e) =>
              Effect.zipRight(Effect.sync(() => handlers.onDown(`LISTEN failed: ${e.message}`)), Deferred.succeed(firstAttempt, undefined))
            ),
            Effect.retry(outageRetry("100 millis"))
          )
          handlers.onListening()
          yield* Deferred.succeed(firstAttempt, undefined)
          // listening until the connection drops; then round again
          yield* Q.take(drops)
        }).pipe(Effect.forever)
        yield* Effect.forkScoped(session)
        yield* Deferred.await(firstAttempt)
        // while down, the next LISTEN (the reconnect's) includes the channel; a failure here is a drop, whose
        // reconnect LISTENs it too
        const onListener = (statement: string) => up ? Effect.ignore(send(() => listener.unsafe(statement))) : Effect.void
        const also = (other: string, onNotify: (payload: string) => void) =>
          Effect.acquireRelease(
            Effect.suspend(() => {
              others.set(other, onNotify)
              return onListener(`listen ${quoted(other)}`)
            }),
            () =>
              Effect.suspend(() => {
                others.delete(other)
                return closing ? Effect.void : onListener(`unlisten ${quoted(other)}`)
              })
          )
        return { run: <A>(query: (sql: Sql) => PromiseLike<A>) => send(() => query(listener)), also } satisfies ListenConnection
      })

    return Db.of({
      pool,
      session,
      schema: options.schema,
      url: options.url,
      run,
      transaction,
      withOrg,
      inTransaction,
      runWithSettings,
      listen,
      outageSince: Effect.sync(() => outageSince)
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
