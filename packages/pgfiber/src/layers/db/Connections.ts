/**
 * The porsager instances a Db opens: its pool, the session connection for the migrations' advisory lock (a
 * direct one when the pool goes through a pooler), and any other it opens later (a settings pool, LISTEN's), all
 * with the same connect options (schema, application name, a reconnect backoff capped at a second), and all
 * closed together, within a bound, when the Db's scope closes. Every statement goes through `send` (counted while
 * out, so the close knows whether to wait); a statement on the pool goes through `onPool` (one per connection
 * behind a transaction pooler: `ConnectionSlots`).
 */
import { Duration, Effect, Redacted, Schedule, type Scope } from "effect"
import postgres from "postgres"
import * as ConnectionSlots from "../ConnectionSlots.js"
import { DbError, type InFlight, runQuery, type Sql } from "./Statement.js"

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

/** porsager's reconnect backoff, capped at a second (its own grows to 20 s), jittered: back to full speed soon after a restart. */
const reconnectBackoff = (retries: number) => Math.min(1, 0.05 * 2 ** retries) * (0.75 + Math.random() / 2)

/**
 * Ends porsager instances together: within `closeIdleWithin` when none of the Db's statements is out, else within
 * `closeWithin`, and then says what was still out.
 */
export const closeAll = (instances: ReadonlyArray<{ readonly name: string; readonly sql: Sql }>, inFlight: InFlight) =>
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

export interface ConnectionsOptions {
  readonly url: Redacted.Redacted<string>
  readonly urlName?: string | undefined
  readonly listenUrl?: Redacted.Redacted<string> | undefined
  readonly schema: string
  readonly poolMax: number
  readonly applicationName?: string | undefined
  readonly prepare?: boolean | undefined
  readonly behindPooler: boolean
  readonly onStatement?: ((query: string) => void) | undefined
}

export interface Connections {
  readonly pool: Sql
  /** Where session-level locks go: `pool` itself unless a separate listen URL is set. */
  readonly session: Sql
  readonly inFlight: InFlight
  /** Sends a statement on any of the Db's connections, counted while it is out. */
  readonly send: <A>(thunk: () => PromiseLike<A>) => Effect.Effect<A, DbError>
  /** A statement on the pool (not on a transaction's connection). */
  readonly onPool: <A>(thunk: () => PromiseLike<A>) => Effect.Effect<A, DbError>
  readonly slots: ConnectionSlots.ConnectionSlots
  /** Opens another instance on `url` (closed with the others), its sessions starting with `settings`. */
  readonly connect: (name: string, url: Redacted.Redacted<string>, max: number, statements: boolean, settings?: Readonly<Record<string, string>>) => Sql
  /** The options every instance is opened with, for one of `max` connections opened by hand (LISTEN's). */
  readonly connectOptions: (max: number) => postgres.Options<{}>
}

/** Opens the pool (and the session connection), probed until it answers; all closed with the scope. */
export const make = (options: ConnectionsOptions): Effect.Effect<Connections, DbError, Scope.Scope> =>
  Effect.gen(function*() {
    const applicationName = options.applicationName ?? "pgfiber"
    const connectOptions = (max: number, settings: Readonly<Record<string, string>> = {}) => ({
      max,
      prepare: options.prepare ?? true,
      // behind a transaction pooler, a connection ending for its age would sit neither idle nor closed while it
      // closes, and a statement sent then would be pipelined onto a busy one (ConnectionSlots)
      ...(options.behindPooler ? { max_lifetime: null } : {}),
      onnotice: () => undefined,
      idle_timeout: 0,
      connect_timeout: 5,
      backoff: reconnectBackoff,
      connection: { ...settings, search_path: `${options.schema}`, application_name: applicationName }
    })
    const inFlight: InFlight = { count: 0 }
    const send = <A>(thunk: () => PromiseLike<A>) => runQuery(thunk, inFlight)
    // every instance this Db opens, closed together when it closes (one after another, each wait would add up)
    const opened: Array<{ readonly name: string; readonly sql: Sql }> = []
    yield* Effect.addFinalizer(() => closeAll(opened, inFlight))
    const connect = (name: string, url: Redacted.Redacted<string>, max: number, statements: boolean, settings?: Readonly<Record<string, string>>) => {
      const sql: Sql = postgres(Redacted.value(url), {
        ...connectOptions(max, settings),
        ...(statements && options.onStatement ? { debug: (_conn: number, query: string) => options.onStatement!(query) } : {})
      })
      opened.push({ name, sql })
      return sql
    }
    const pool = connect("the pool", options.url, options.poolMax, true)
    // behind a transaction pooler, one statement in flight per connection of the pool; straight to PostgreSQL, no limit
    const slots = options.behindPooler ? yield* ConnectionSlots.make(options.poolMax) : ConnectionSlots.unbounded
    const onPool = <A>(thunk: () => PromiseLike<A>) => slots.statement(thunk, send<A>)
    // the migrations' session-level advisory lock; a separate instance points it past the pooler
    const session = options.listenUrl === undefined ? pool : connect("the session connection", options.listenUrl, 1, false)
    // probe on start so a bad DATABASE_URL fails here, not at the first job
    yield* probeOnStart(onPool(() => pool`select 1`), options.urlName ?? "DATABASE_URL")
    if (session !== pool) yield* probeOnStart(send(() => session`select 1`), "DATABASE_LISTEN_URL")
    return {
      pool, session, inFlight, send, onPool, slots, connect,
      connectOptions: (max) => connectOptions(max) as postgres.Options<{}>
    }
  })

const probeOnStart = (select1: Effect.Effect<unknown, DbError>, variable: string) =>
  select1.pipe(
    Effect.retry({ times: 20, schedule: Schedule.spaced("250 millis"), while: (e) => e.unavailable }),
    Effect.mapError((e) => new DbError({ ...e, message: `${variable}: cannot connect: ${e.message}` })),
    Effect.asVoid
  )
