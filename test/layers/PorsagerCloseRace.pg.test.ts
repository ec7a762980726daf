/**
 * porsager/postgres 3.4.9 leaves a connection unable to reconnect when its socket closes while a write is still
 * pending: `closed()` cancels the deferred write (`setImmediate(nextWrite)`) but keeps its handle and the unsent
 * bytes, so on reconnect the startup message is appended behind them and never flushed. Every statement sent to
 * that connection then waits for CONNECT_TIMEOUT, for as many rounds as it takes the stale bytes to pass the
 * 1 KiB flush threshold. It happens when the backends are killed together (a failover, `pg_terminate_backend`
 * on every session, a PostgreSQL restart): a statement that a caller retries as soon as its connection's close is
 * reported lands on a second connection whose close is reported next, in the same turn of the event loop.
 *
 * The repository carries the one-line fix as `patches/postgres+3.4.9.patch` (applied by patch-package on `npm
 * ci`): the close resets the pending write with the socket. This test builds exactly that interleaving — the
 * sockets of a pool of two destroyed together, a statement sent from the first close's rejection — in 20 rounds,
 * and requires that once those closes are reported, both connections reconnect and answer.
 */
import { describe, expect, it } from "@effect/vitest"
import * as Net from "node:net"
import postgres from "postgres"
import { databaseUrl } from "../support/pg.js"

describe("porsager/postgres: a socket closed with a write pending", () => {
  it("does not leave its connection stuck in connecting", async () => {
    const url = new URL(databaseUrl())
    const live = new Set<Net.Socket>()
    // `socket` (a function returning the socket to use) is a documented option missing from the driver's types
    const options = {
      max: 2,
      // a stuck connection fails with CONNECT_TIMEOUT after this; a healthy one connects in milliseconds
      connect_timeout: 10,
      onnotice: () => undefined,
      socket: () =>
        new Promise<Net.Socket>((resolve, reject) => {
          const socket = Net.connect(Number(url.port || 5432), url.hostname)
          live.add(socket)
          socket.once("close", () => live.delete(socket))
          socket.once("error", reject)
          socket.once("connect", () => resolve(socket))
        })
    }
    const sql = postgres(databaseUrl(), options as postgres.Options<{}>)
    const failures: Array<string> = []
    try {
      for (let round = 0; round < 20; round++) {
        // both connections open and idle
        await Promise.all([sql`select pg_sleep(0.01)`, sql`select pg_sleep(0.01)`])
        const closing = [...live].map((socket) => new Promise((resolve) => socket.once("close", resolve)))
        const running = sql`select pg_sleep(5)`.execute()
        // the retry a caller sends when its statement fails: it goes to the other connection, not closed yet
        const retried = running.catch(() => sql`select 1`.execute().catch(() => undefined))
        for (const socket of [...live]) socket.destroy()
        await running.catch(() => undefined)
        await retried
        await Promise.all(closing)
        const after = await Promise.allSettled([sql`select pg_sleep(0.01)`, sql`select pg_sleep(0.01)`])
        for (const result of after) {
          if (result.status === "rejected") failures.push(`round ${round}: ${(result.reason as { code?: string }).code ?? String(result.reason)}`)
        }
        if (failures.length > 0) break
      }
    } finally {
      await sql.end({ timeout: 5 })
    }
    expect(failures).toEqual([])
  })
})
