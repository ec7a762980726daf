/**
 * LISTEN on a connection of its own, watched: porsager's `listen` re-LISTENs silently, this one says so. The Waker
 * says `down` and polls from the moment the connection drops, and catches up when LISTEN is back; other channels
 * (`also`) share the connection and are LISTENed again on every reconnect.
 */
import { Deferred, Effect, Queue as Q, Redacted, type Scope } from "effect"
import postgres from "postgres"
import { closeAll, type Connections } from "./Connections.js"
import { outageRetry } from "./Outage.js"
import type { DbError, Sql } from "./Statement.js"

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

/**
 * LISTENs on `channel` on a connection of its own (to `url`) for the life of the scope, re-LISTENing with backoff
 * whenever it drops: `onDown` the moment the connection is lost (or cannot be made), `onListening` each time LISTEN
 * is back. Returns once LISTEN is up or has failed once.
 */
export const listen = (connections: Connections, url: Redacted.Redacted<string>, channel: string, handlers: ListenHandlers) =>
  Effect.gen(function*() {
    const drops = yield* Q.sliding<string>(1)
    let up = false
    let closing = false
    // the channels LISTENed besides `channel` (`also`), each LISTENed again on every reconnect
    const others = new Map<string, (payload: string) => void>()
    const quoted = (name: string) => `"${name.replace(/"/g, "\"\"")}"`
    const listener = yield* Effect.acquireRelease(
      Effect.sync(() =>
        postgres(Redacted.value(url), {
          ...connections.connectOptions(1),
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
          return closeAll([{ name: "the LISTEN connection", sql }], connections.inFlight)
        })
    )
    const listenOnce = connections.send(() =>
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
    const onListener = (statement: string) => up ? Effect.ignore(connections.send(() => listener.unsafe(statement))) : Effect.void
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
    return { run: <A>(query: (sql: Sql) => PromiseLike<A>) => connections.send(() => query(listener)), also } satisfies ListenConnection
  })
