/**
 * porsager/postgres 3.4.9 leaves a connection unable to reconnect when its socket closes while a write is still
 * pending: `closed()` cancels the deferred write (`setImmediate(nextWrite)`) but keeps its handle and the unsent
 * bytes, so on reconnect the startup message is appended behind them and never flushed. Every statement sent to
 * that connection then waits for CONNECT_TIMEOUT, for as many rounds as it takes the stale bytes to pass the
 * 1 KiB flush threshold. It happens when the backends are killed together (a failover, `pg_terminate_backend`
 * on every session, a PostgreSQL restart): a statement that a caller retries as soon as its connection's close is
 * reported lands on a second connection whose close is reported next, in the same turn of the event loop.
 *
 * The repository carries the fix as `patches/postgres+3.4.9.patch` (applied by patch-package on `npm ci`): the close
 * resets the pending write with the socket. The packages ship that fixed copy inside their tarballs
 * (`bundleDependencies`, scripts/bundle-driver.mjs); test/app/Package.test.ts replays the same race on an app's
 * install. This one replays it (test/support/CloseRace.mjs) on the checkout's driver: the sockets of a pool of two
 * destroyed together, a statement sent from the first close's rejection, 20 rounds; once those closes are
 * reported, both connections reconnect and answer.
 */
import { describe, expect, it } from "@effect/vitest"
import postgres from "postgres"
import { replayCloseRace } from "../support/CloseRace.mjs"
import { databaseUrl } from "../support/pg.js"

describe("porsager/postgres: a socket closed with a write pending", () => {
  it("does not leave its connection stuck in connecting", async () => {
    expect(await replayCloseRace(postgres, databaseUrl())).toEqual([])
  })
})
