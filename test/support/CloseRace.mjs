/**
 * The close race of porsager/postgres 3.4.9, replayed on whichever copy of the driver the caller imported: the
 * sockets of a pool of two destroyed together while a statement is running on one, and a statement sent from that
 * statement's rejection, which lands on the other connection before its own close is reported. A driver that
 * keeps the pending write's bytes across the close (3.4.9 as published) never flushes the reconnect's startup
 * message: the next statements fail with CONNECT_TIMEOUT. The fixed driver reconnects both and answers.
 * Plain JavaScript so that an app installed from the packed packages can run it on the driver pgfiber ships.
 */
import * as Net from "node:net"

/**
 * Replays the race `rounds` times (stopping at the first failure) and returns what failed, one line per statement.
 * @param {(url: string, options: object) => any} postgres the driver's default export
 * @param {string} databaseUrl
 * @param {{ rounds?: number }} [options]
 * @returns {Promise<Array<string>>}
 */
export const replayCloseRace = async (postgres, databaseUrl, { rounds = 20 } = {}) => {
  const url = new URL(databaseUrl)
  const live = new Set()
  const sql = postgres(databaseUrl, {
    max: 2,
    // a stuck connection fails with CONNECT_TIMEOUT after this; a healthy one connects in milliseconds
    connect_timeout: 10,
    onnotice: () => undefined,
    // a documented option (the socket to use), missing from the driver's types: it lets the replay destroy them
    socket: () =>
      new Promise((resolve, reject) => {
        const socket = Net.connect(Number(url.port || 5432), url.hostname)
        live.add(socket)
        socket.once("close", () => live.delete(socket))
        socket.once("error", reject)
        socket.once("connect", () => resolve(socket))
      })
  })
  const failures = []
  try {
    for (let round = 0; round < rounds && failures.length === 0; round++) {
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
        if (result.status === "rejected") failures.push(`round ${round}: ${result.reason?.code ?? String(result.reason)}`)
      }
    }
  } finally {
    await sql.end({ timeout: 5 })
  }
  return failures
}
