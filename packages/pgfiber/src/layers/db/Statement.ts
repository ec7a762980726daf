/**
 * One statement to PostgreSQL and how it fails: porsager's `Sql`, the `DbError` every failure becomes (with
 * connection-level trouble marked `unavailable`), and `runQuery`, which makes a porsager query an interruptible
 * Effect that cancels it on the server and counts it while it is out (what a close waits for).
 */
import { Data, Effect } from "effect"
import type postgres from "postgres"
import * as ConnectionFaultGuard from "../ConnectionFaultGuard.js"

export type Sql = postgres.Sql<{}>
export type Row = postgres.Row

/**
 * A transaction's handle as the `Sql` the statements are written against: the project's one `as unknown as`.
 * porsager runs a statement on it as on its pool, but types it apart (`TransactionSql` has the tagged template,
 * `unsafe`, `json`, `array` and the rest a statement uses, not the pool's `begin`, `reserve`, `end`, which no
 * statement calls), and the two types do not overlap enough for a plain `as`.
 */
export const transactionSql = (sql: postgres.TransactionSql<{}>): Sql => sql as unknown as Sql

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

/** A statement refused because its transaction's connection is gone. */
export const connectionLost = () =>
  new DbError({
    message: "the transaction's connection to the database was lost",
    code: "CONNECTION_CLOSED",
    unavailable: true,
    cause: undefined
  })
