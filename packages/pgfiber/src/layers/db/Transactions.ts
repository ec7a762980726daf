/**
 * Transactions on a pinned connection: `begin` reserves a connection, BEGINs on it (as the tenant, for an org) and
 * carries it in a FiberRef, so every statement of the body (any Db call inside) runs on it; BEGIN…COMMIT/ROLLBACK
 * and the connection's release run uninterruptibly from the body's Exit. The connection is watched (`Pin`): once
 * its backend is gone nothing more is sent on it, and it is not handed back to the pool (porsager/postgres#1208: a
 * write on a reserved connection whose socket closed throws from a timer, outside any promise, and a released
 * dead connection hangs the next query). A transaction already open is joined; under another org, for the body
 * only.
 */
import { Effect, Exit, FiberRef, Option } from "effect"
import type { Connections } from "./Connections.js"
import type { Outage } from "./Outage.js"
import { connectionLost, type DbError, type Sql } from "./Statement.js"

export const tenantRole = "pgfiber_tenant"

/**
 * A transaction's reserved connection, watched. porsager clears a connection's `reserved` mark when its socket
 * closes (and a later reservation sets a new one), so the mark seen at BEGIN tells whether this is still our
 * session; an unavailable error on it marks it dead too. A dead pin sends nothing more and is never released:
 * porsager has already put the connection back among its closed ones.
 */
export interface Pin {
  readonly alive: () => boolean
  markDead: () => void
}

/** The transaction a fiber is inside, if any; queue operations run on it instead of the pool. */
export const currentTransaction = FiberRef.unsafeMake<Option.Option<{ readonly owner: object; readonly sql: Sql; readonly orgId: string | null; readonly pin: Pin }>>(
  Option.none()
)

/**
 * The org a fiber's database work is done for, if any. While set, `run` outside a transaction sends each
 * statement in a short transaction of its own under the tenant role with `pgfiber.org_id` set, and
 * `transaction` begins under them: row-level security applies to every row, and no transaction is held open
 * across the outside calls between statements (SpeechKit, ffmpeg). Set by `forOrg`, cleared by `asOwner`.
 */
export const currentOrg = FiberRef.unsafeMake<Option.Option<string>>(Option.none())

export interface Transactions {
  /** The transaction of this Db the fiber is inside, if any. */
  readonly current: Effect.Effect<Option.Option<{ readonly sql: Sql; readonly orgId: string | null; readonly pin: Pin }>>
  readonly inTransaction: Effect.Effect<boolean>
  /** A statement on the transaction's pinned connection: never sent on a connection that is gone. */
  readonly onPinned: <A>(sql: Sql, pin: Pin, query: (sql: Sql) => PromiseLike<A>) => Effect.Effect<A, DbError>
  /** Runs `effect` in a transaction under `orgId` (the owner's when null), or joins the one the fiber is inside. */
  readonly begin: <A, E, R>(effect: Effect.Effect<A, E, R>, orgId: string | null) => Effect.Effect<A, E | DbError, R>
  /** Joins the transaction the fiber is inside, else begins one (as the tenant under `forOrg`). */
  readonly transaction: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | DbError, R>
}

type Send = Connections["send"]
type OnPinned = Transactions["onPinned"]

const pinnedStatement = (send: Send): OnPinned => (sql, pin, query) =>
  send(() => {
    if (!pin.alive()) throw connectionLost()
    return query(sql)
  }).pipe(Effect.tapError((e) => (e.unavailable ? Effect.sync(pin.markDead) : Effect.void)))

/**
 * Reserves a connection for a transaction, and BEGINs on it; the pin watches it from BEGIN on. Known limit:
 * porsager's `reserve()` both queues its request and connects a closed connection for it; when that connect
 * fails the request stays queued, and the next connection to open is handed to it and lost to the pool. So
 * the hot path (the claim) does not reserve (`runWithSettings`); transactions still do.
 */
const reserve = (send: Send, pool: Sql) =>
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
    return { reserved, conn, pin, beginStatement }
  })

const setOrg = (onPinned: OnPinned, sql: Sql, pin: Pin, orgId: string) =>
  onPinned(sql, pin, (s) => s`select set_config('role', ${tenantRole}, true), set_config('pgfiber.org_id', ${orgId}, true)`).pipe(
    Effect.asVoid
  )

/** Back to the transaction's own identity: its org, or the owner's role with no org. */
const restoreOrg = (onPinned: OnPinned, sql: Sql, pin: Pin, orgId: string | null) =>
  orgId !== null
    ? setOrg(onPinned, sql, pin, orgId)
    : onPinned(sql, pin, (s) => s`select set_config('role', 'none', true), set_config('pgfiber.org_id', '', true)`).pipe(Effect.asVoid)

/**
 * A new transaction on a reserved connection: BEGIN (and the org's settings), the body, then COMMIT or ROLLBACK
 * from its Exit and the connection's release, uninterruptibly. `keepOut`: the connection is left out of the pool.
 */
const runPinned = <A, E, R>(
  c: { readonly send: Send; readonly pool: Sql; readonly observe: Outage["observe"]; readonly owner: object },
  effect: Effect.Effect<A, E, R>,
  orgId: string | null,
  keepOut: () => void
) =>
  Effect.uninterruptibleMask((restore) =>
    Effect.gen(function*() {
      const onPinned = pinnedStatement(c.send)
      const { conn, pin, reserved, beginStatement } = yield* c.observe(reserve(c.send, c.pool))
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
          c.observe(Effect.asVoid(opened)).pipe(
            Effect.zipRight(Effect.locally(effect, currentTransaction, Option.some({ owner: c.owner, sql: conn, orgId, pin })))
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

export const make = (connections: Connections, outage: Outage): Transactions => {
  const { pool, send, slots } = connections
  // this Db's transactions (another Db's are not joined)
  const owner = {}
  const onPinned = pinnedStatement(send)
  const current = Effect.map(FiberRef.get(currentTransaction), (tx) =>
    Option.isSome(tx) && tx.value.owner === owner ? Option.some(tx.value) : Option.none()
  )
  const inTransaction = Effect.map(FiberRef.get(currentTransaction), (tx) => Option.isSome(tx) && tx.value.owner === owner)

  const begin = <A, E, R>(effect: Effect.Effect<A, E, R>, orgId: string | null): Effect.Effect<A, E | DbError, R> =>
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
                setOrg(onPinned, tx.value.sql, tx.value.pin, orgId),
                () => Effect.locally(effect, currentTransaction, Option.some({ ...tx.value, orgId })),
                () => restoreOrg(onPinned, tx.value.sql, tx.value.pin, tx.value.orgId).pipe(Effect.ignore)
              ))
        // a slot for the whole transaction: its connection is not the pool's until it is released
        : outage.outside(slots.transaction((keepOut) => runPinned({ send, pool, observe: outage.observe, owner }, effect, orgId, keepOut))))

  // a transaction already open is joined as it is; a new one begins as the tenant under `forOrg`
  const transaction = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.flatMap(inTransaction, (inside) =>
      inside ? effect : Effect.flatMap(FiberRef.get(currentOrg), (org) => begin(effect, Option.getOrNull(org))))

  return { current, inTransaction, onPinned, begin, transaction }
}
