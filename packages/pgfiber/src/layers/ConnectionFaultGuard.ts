/**
 * The last line of defence against porsager faults that no caller can observe: its array-type fetch on a fresh
 * connection runs as a promise nobody awaits (a backend killed during it rejects unhandled), and a write racing
 * a socket's close throws from a timer (porsager/postgres#1208). Node would end the process for either. While a
 * `Db` is open, this logs those and only those — a PostgresError or porsager connection error with a
 * connection-level code, or the null-socket write from porsager's `nextWrite` — and leaves everything else to
 * Node's default (or to the other listeners installed, such as a test runner's).
 *
 * pgfiber's own promises are all observed (queries through `Db.runQuery`, LISTEN through `Db.listen`); this is
 * not a blanket handler.
 */
import { Effect } from "effect"

/** Errors that mean the connection, not the statement, failed (a retry on a fresh connection may succeed). */
export const connectionCodes: ReadonlySet<string> = new Set([
  "ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "ENOTFOUND", "EHOSTUNREACH",
  "CONNECTION_CLOSED", "CONNECTION_ENDED", "CONNECTION_DESTROYED", "CONNECT_TIMEOUT",
  "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004"
])

const fromPorsager = (stack: string) => /postgres[\\/]src[\\/]|\bnextWrite\b|\bfetchArrayTypes\b|\bPostgresError\b/.test(stack)

/**
 * A socket's own error as Node raises it ("read ECONNRESET"): a system call on a connection, a connection-level
 * code, and a stack wholly inside Node's socket code. porsager hands that error object, unchanged, to a `reserve()`
 * request it rejects (`queryError` adds the caller's stack only to statements), and one such rejection reached
 * no caller when every backend was killed or PostgreSQL restarted (CI, 2026-11-27: a worker process ended with it).
 * Not a client's "socket hang up" (no system call) nor anything thrown from code of ours (its frames).
 */
const isRawSocketFault = (e: { code?: unknown; stack?: unknown; syscall?: unknown }) =>
  typeof e.syscall === "string" && ["read", "write", "connect"].includes(e.syscall) &&
  typeof e.stack === "string" && e.stack.split("\n").slice(1).every((line) => !/^\s*at /.test(line) || /\(node:|\bnode:(internal|net)/.test(line))

/** A connection fault raised inside porsager, where no caller could catch it. */
export const isKnownConnectionFault = (error: unknown): boolean => {
  if (typeof error !== "object" || error === null) return false
  const e = error as { name?: unknown; code?: unknown; message?: unknown; stack?: unknown; syscall?: unknown }
  const stack = typeof e.stack === "string" ? e.stack : ""
  const message = typeof e.message === "string" ? e.message : ""
  // porsager/postgres#1208: `socket.write` on a connection whose socket closed a moment ago
  if (e instanceof TypeError) return /reading 'write'|socket\.write/.test(message) && /\bnextWrite\b|postgres[\\/]src[\\/]connection/.test(stack)
  if (typeof e.code !== "string" || !connectionCodes.has(e.code)) return false
  return e.name === "PostgresError" || fromPorsager(stack) || isRawSocketFault(e)
}

let installed = 0
let seen = 0

const describe = (error: unknown) => {
  const e = error as { code?: unknown; message?: unknown }
  return `${typeof e.code === "string" ? `${e.code} ` : ""}${typeof e.message === "string" ? e.message : String(error)}`
}

const report = (kind: string, error: unknown) => {
  seen++
  // at most a line a second's worth: a storm of kills should not flood the log
  if (seen <= 20 || seen % 100 === 0) {
    process.emitWarning(`pgfiber: ignored a database connection fault (${kind}, ${seen} so far): ${describe(error)}`, {
      code: "PGFIBER_CONNECTION_FAULT"
    })
  }
}

const onRejection = (reason: unknown) => {
  if (isKnownConnectionFault(reason)) return report("unobserved rejection", reason)
  // anything else: as Node would without this listener (its default mode raises it as an uncaught exception)
  if (process.listenerCount("unhandledRejection") === 1) throw reason
}

const onException = (error: unknown) => {
  if (isKnownConnectionFault(error)) return report("uncaught exception", error)
  if (process.listenerCount("uncaughtException") === 1) {
    process.stderr.write(`${error instanceof Error && error.stack ? error.stack : String(error)}\n`)
    process.exit(1)
  }
}

/** How many faults were ignored so far in this process. */
export const ignoredFaults = () => seen

/** Installs the guard for the life of the scope (once per process, however many `Db`s are open). */
export const install = Effect.acquireRelease(
  Effect.sync(() => {
    if (installed++ === 0) {
      process.on("unhandledRejection", onRejection)
      process.on("uncaughtException", onException)
    }
  }),
  () =>
    Effect.sync(() => {
      if (--installed === 0) {
        process.off("unhandledRejection", onRejection)
        process.off("uncaughtException", onException)
      }
    })
)
