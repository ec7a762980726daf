/**
 * Whether the database is known to be down: set by a connection error, cleared by any answer. While it is set,
 * work begun outside a transaction first asks a `select 1` that must answer within `failFastAfter` (a 503 in
 * about a second, instead of waiting out porsager's reconnect backoff); once it answers, the work runs as usual.
 */
import { Duration, Effect, Schedule } from "effect"
import { DbError } from "./Statement.js"

/** While the database is known to be down, how long work begun outside a transaction may wait before it fails. */
export const failFastAfter = Duration.seconds(1)

/**
 * How work retries while the database is away (a claim, a settle, LISTEN): exponential from `first`, at most a
 * second apart, so it is back at full speed within a second of the database's return. Callers that must give up
 * add their own limit (`Schedule.upTo`).
 */
export const outageRetry = (first: Duration.DurationInput) => Schedule.exponential(first).pipe(Schedule.union(Schedule.spaced("1 second")))

export interface Outage {
  /** Since when the database has been failing with connection errors (null: it answers). */
  readonly since: () => Date | null
  /** Runs `effect`, noting a connection error (the outage begins) or an answer (it ends). */
  readonly observe: <A>(effect: Effect.Effect<A, DbError>) => Effect.Effect<A, DbError>
  /**
   * Work begun outside a transaction: while the database is known to be down it fails within `failFastAfter`
   * unless the probe answers. The limit is on reaching the database, never on the work: a claim or a settle
   * slower than a second on a loaded machine, just after a restart with cold caches, used to be cut every time,
   * so the outage never ended for that process (a stalled worker in chaos).
   */
  readonly outside: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | DbError, R>
}

/** `select1`: a `select 1` on the pool, the probe. */
export const make = (select1: Effect.Effect<unknown, DbError>): Outage => {
  let since: Date | null = null
  const observe = <A>(effect: Effect.Effect<A, DbError>): Effect.Effect<A, DbError> =>
    Effect.tapBoth(effect, {
      onFailure: (e) => Effect.sync(() => {
        if (e.unavailable && since === null) since = new Date()
      }),
      onSuccess: () => Effect.sync(() => {
        since = null
      })
    })
  const unavailableFast = () =>
    new DbError({
      message: `the database is unavailable (down since ${since?.toISOString()}; no answer within ${Duration.format(failFastAfter)})`,
      code: "CONNECT_TIMEOUT",
      unavailable: true,
      cause: undefined
    })
  // its answer ends the outage; a probe cut short lets its connection attempt go on in the background
  // (`disconnect`), so the next probe finds the connection made
  const probe = observe(select1).pipe(
    Effect.disconnect,
    Effect.timeoutFail({ duration: failFastAfter, onTimeout: unavailableFast })
  )
  const outside = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | DbError, R> =>
    Effect.suspend(() => (since === null ? effect : Effect.zipRight(probe, effect)))
  return { since: () => since, observe, outside }
}
