/**
 * A real PgBouncer process (transaction mode) in front of a database, for the tests (test/support/pgbouncer.ts)
 * and the fleet bench (bench/fleet.ts): nothing here needs the test runner.
 */
import { Effect } from "effect"
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { waitFor } from "./waitFor.js"

export const pgbouncerBin = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer", "/opt/homebrew/bin/pgbouncer"].find((p) =>
  Fs.existsSync(p)
)

const freePort = () =>
  new Promise<number>((resolve) => {
    const server = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

const canConnect = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = Net.connect(port, "127.0.0.1")
    socket.once("connect", () => {
      socket.destroy()
      resolve(true)
    })
    socket.once("error", () => resolve(false))
  })

export interface PgBouncerOptions {
  /** Server connections per database/user pair (`default_pool_size`). */
  readonly poolSize?: number
  readonly maxClientConn?: number
}

/** PgBouncer in transaction mode in front of `target`, logging in as `role`; stopped at the end of the scope. */
export const startPgBouncer = (target: URL, role: string, password: string, options: PgBouncerOptions = {}) =>
  Effect.gen(function*() {
    if (pgbouncerBin === undefined) return yield* Effect.dieMessage("pgbouncer is not installed (apt-get install pgbouncer)")
    const bin = pgbouncerBin
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-bouncer-"))
    // as root, pgbouncer runs as the postgres user (-u), which must read the config and write the log
    Fs.chmodSync(dir, 0o777)
    const port = yield* Effect.promise(freePort)
    const ini = Path.join(dir, "pgbouncer.ini")
    const logFile = Path.join(dir, "pgbouncer.log")
    const poolSize = options.poolSize ?? 4
    Fs.writeFileSync(
      ini,
      [
        "[databases]",
        `pgfiber = host=${target.hostname} port=${target.port || 5432} dbname=${target.pathname.slice(1) || "postgres"} user=${role} password=${password}`,
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        `listen_port = ${port}`,
        "unix_socket_dir =",
        "auth_type = any",
        "pool_mode = transaction",
        `default_pool_size = ${poolSize}`,
        // no reserve pool, and one pool (one database, one user): the server connections are at most poolSize
        "reserve_pool_size = 0",
        `max_db_connections = ${poolSize}`,
        `max_client_conn = ${options.maxClientConn ?? 200}`,
        "ignore_startup_parameters = search_path, extra_float_digits",
        `logfile = ${logFile}`
      ].join("\n") + "\n",
      { mode: 0o644 }
    )
    const asRoot = typeof process.getuid === "function" && process.getuid() === 0
    const child = spawn(bin, [...(asRoot ? ["-u", "postgres"] : []), ini], { stdio: ["ignore", "pipe", "pipe"] })
    let output = ""
    child.stdout.on("data", (d) => (output += d))
    child.stderr.on("data", (d) => (output += d))
    const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()))
    yield* Effect.addFinalizer(() =>
      Effect.promise(async () => {
        child.kill("SIGTERM") // immediate shutdown (SIGINT would wait for clients)
        const timer = setTimeout(() => child.kill("SIGKILL"), 10_000)
        await exited
        clearTimeout(timer)
        Fs.rmSync(dir, { recursive: true, force: true })
      })
    )
    const log = () => (Fs.existsSync(logFile) ? Fs.readFileSync(logFile, "utf8") : "")
    yield* waitFor(
      "pgbouncer to listen",
      Effect.promise(async () => {
        if (child.exitCode !== null) throw new Error(`pgbouncer exited: ${output}\n${log()}`)
        return canConnect(port)
      }),
      "60 seconds",
      "50 millis"
    )
    return { port, poolSize, log, url: (user: string, pw: string) => `postgres://${user}:${pw}@127.0.0.1:${port}/pgfiber` }
  })
