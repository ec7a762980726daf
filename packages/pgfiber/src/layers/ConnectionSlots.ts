/**
 * ConnectionSlots: at most one statement (or transaction) in flight per connection of a pool that goes through a
 * transaction pooler (`DB_POOLER=transaction`, PgBouncer in transaction mode).
 *
 * porsager's pool sends a statement on a busy connection when it finds none idle nor closed (pipelining it behind
 * the statement in flight there). A transaction pooler hands the server connection on at the first statement's
 * ReadyForQuery, and the answers to the one behind it go nowhere (PgBouncer 1.18 logs "got packet from server when
 * not linked"): that statement never returns. With as many slots as the pool has connections, and every use of
 * the pool holding one, each statement finds an idle connection (or a closed one to open), so porsager never
 * pipelines outside a transaction. Inside one the server connection stays with its client, and pipelining is safe.
 *
 * Invariants: a slot is held from before porsager is asked for a connection until that connection is free again;
 * so a statement keeps its slot until porsager settles it (after its caller stopped waiting, if it was interrupted:
 * it is still on its connection), and a transaction whose connection is kept out of the pool keeps its slot for
 * good (the pool has one connection fewer, and so one slot fewer).
 */
import { Effect } from "effect"

export interface ConnectionSlots {
  /** Sends one statement on the pool (through `send`) once a connection is free for it. */
  readonly statement: <A, E>(
    thunk: () => PromiseLike<A>,
    send: (thunk: () => PromiseLike<A>) => Effect.Effect<A, E>
  ) => Effect.Effect<A, E>
  /**
   * Runs `use`, a transaction on a reserved connection, in a slot of its own. `use` calls `keepOut` when it keeps
   * the connection out of the pool (never releasing it); the slot then stays taken.
   */
  readonly transaction: <A, E, R>(use: (keepOut: () => void) => Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

/** A pool straight to PostgreSQL: porsager's own pipelining is safe, so nothing waits for a slot. */
export const unbounded: ConnectionSlots = {
  statement: (thunk, send) => send(thunk),
  transaction: (use) => use(() => undefined)
}

/** One slot per connection of a pool of `connections`. */
export const make = (connections: number): Effect.Effect<ConnectionSlots> =>
  Effect.map(Effect.makeSemaphore(connections), (slots) => {
    const free = slots.release(1)
    const freeNow = () => {
      Effect.runSync(free)
    }
    /** Takes a slot (interruptibly), then runs `body`, which decides when the slot is given back. */
    const inSlot = <A, E, R>(body: (restore: <X, EX, RX>(e: Effect.Effect<X, EX, RX>) => Effect.Effect<X, EX, RX>) => Effect.Effect<A, E, R>) =>
      Effect.uninterruptibleMask((restore) => Effect.zipRight(restore(slots.take(1)), Effect.suspend(() => body(restore))))
    return {
      statement: (thunk, send) =>
        inSlot((restore) => {
          // once porsager has the statement, its settling frees the slot (not the caller's Exit)
          let handedOn = false
          return restore(send(() => {
            const query = thunk()
            handedOn = true
            query.then(freeNow, freeNow)
            return query
          })).pipe(Effect.onExit(() => (handedOn ? Effect.void : free)))
        }),
      transaction: (use) =>
        inSlot((restore) => {
          let keptOut = false
          return restore(use(() => {
            keptOut = true
          })).pipe(Effect.ensuring(Effect.suspend(() => (keptOut ? Effect.void : free))))
        })
    } satisfies ConnectionSlots
  })
