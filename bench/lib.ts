/**
 * What the benchmark and the chaos run share: one embedded PostgreSQL with pg_stat_statements, a fresh
 * database per subject and run, worker child processes spoken to over IPC, a clock every process agrees on,
 * and the statistics (median, percentiles) the tables are made of.
 */
import { Effect, Exit, Redacted, Scope } from "effect"
import * as Child from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import postgres from "postgres"
import * as EmbeddedPg from "../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"

export const benchDir = Path.dirname(fileURLToPath(import.meta.url))
export const repoDir = Path.resolve(benchDir, "..")

/** CLOCK_MONOTONIC in ns: the same clock in every process on the machine, so a parent and a child can subtract. */
export const nowNs = (): number => Number(process.hrtime.bigint())
export const msSince = (startNs: number) => (nowNs() - startNs) / 1e6

/** The value after `--name` on this process's command line (`--rounds 3` → "3"), or undefined. */
export const option = (name: string): string | undefined => {
  const args = process.argv.slice(2)
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : undefined
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

export const median = (xs: ReadonlyArray<number>): number => {
  const finite = xs.filter((x) => Number.isFinite(x))
  if (finite.length === 0) return Number.NaN
  const s = [...finite].sort((a, b) => a - b)
  const mid = Math.floor(s.length / 2)
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2
}

/** Nearest-rank percentile (p in 0..100). */
export const percentile = (xs: ReadonlyArray<number>, p: number): number => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  const rank = Math.max(1, Math.ceil((p / 100) * s.length))
  return s[Math.min(rank, s.length) - 1]!
}

export const log = (...parts: ReadonlyArray<unknown>) => {
  const stamp = new Date().toISOString().slice(11, 19)
  process.stderr.write(`[${stamp}] ${parts.map(String).join(" ")}\n`)
}

/**
 * A CI run (`--json PATH`) whose run itself failed, not one of its checks: the failed result CI reads, in the shape
 * of the passing one (no check passed, one failed). Nothing is written when no path was asked for.
 */
export const writeFailedRun = (jsonPath: string | undefined, error: unknown) => {
  if (!jsonPath) return
  Fs.mkdirSync(Path.dirname(Path.resolve(jsonPath)), { recursive: true })
  Fs.writeFileSync(jsonPath, JSON.stringify({ numPassedTests: 0, numFailedTests: 1, success: false, error: String(error) }, null, 2) + "\n")
}

export type Sql = postgres.Sql<{}>

export const connect = (url: string, options: { max?: number; schema?: string; app?: string } = {}): Sql =>
  postgres(url, {
    max: options.max ?? 2,
    onnotice: () => undefined,
    idle_timeout: 0,
    connect_timeout: 10,
    connection: {
      application_name: options.app ?? "bench-harness",
      ...(options.schema ? { search_path: options.schema } : {})
    }
  })

export const withDatabase = (url: string, database: string) => {
  const u = new URL(url)
  u.pathname = `/${database}`
  return u.toString()
}

export interface Cluster {
  readonly url: string
  readonly port: number
  readonly dataDir: string
  readonly admin: Sql
  readonly version: string
  readonly settings: Record<string, string>
  readonly createDatabase: (name: string) => Promise<string>
  /** The same database's URL, as the role `producerRole`: its statements are told apart from the worker's. */
  readonly asProducer: (dbUrl: string) => string
  readonly dropDatabase: (name: string) => Promise<void>
  /** Stops and starts the server on the same port and data (the chaos run's restart). */
  readonly restart: (downMs: number) => Promise<void>
  readonly close: () => Promise<void>
}

/** Boots one embedded PostgreSQL for the whole run; `persistent` keeps data across `restart`. */
export const startCluster = async (options: {
  readonly flags?: ReadonlyArray<string>
  readonly dataDir?: string
}): Promise<Cluster> => {
  const scope = Effect.runSync(Scope.make())
  // a named data folder (not the package's temporary mode) so `stop` does not delete it and restart works
  const dataDir = options.dataDir ?? Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-bench-pg-"))
  Fs.rmSync(dataDir, { recursive: true, force: true })
  const server = await Effect.runPromise(
    Scope.extend(EmbeddedPg.start({ dataDir, port: 0, postgresFlags: options.flags ?? [] }), scope)
  )
  const url = Redacted.value(server.url)
  const admin = connect(url, { max: 2 })
  const [{ version }] = await admin<Array<{ version: string }>>`select current_setting('server_version') as version`
  const names = ["shared_buffers", "max_connections", "fsync", "synchronous_commit", "wal_level", "max_wal_size",
    "checkpoint_timeout", "autovacuum", "work_mem", "shared_preload_libraries"]
  const rows = await admin<Array<{ name: string; setting: string }>>`
    select name, current_setting(name) as setting from pg_settings where name in ${admin(names)}`
  const settings = Object.fromEntries(rows.map((r) => [r.name, r.setting]))
  if ((options.flags ?? []).join(" ").includes("pg_stat_statements")) await admin`create extension if not exists pg_stat_statements`
  // a superuser like the worker's role (every subject's tables are the worker's role's), under its own name
  await admin.unsafe(`drop role if exists ${producerRole}`)
  await admin.unsafe(`create role ${producerRole} login superuser password '${new URL(url).password}'`)
  return {
    url,
    port: server.port,
    dataDir,
    admin,
    version: version!,
    settings,
    createDatabase: async (name) => {
      await admin.unsafe(`drop database if exists ${name} with (force)`)
      await admin.unsafe(`create database ${name}`)
      const dbUrl = withDatabase(url, name)
      if ((options.flags ?? []).join(" ").includes("pg_stat_statements")) {
        const sql = connect(dbUrl, { max: 1 })
        await sql`create extension if not exists pg_stat_statements`
        await sql.end({ timeout: 5 })
      }
      return dbUrl
    },
    asProducer: (dbUrl) => {
      const u = new URL(dbUrl)
      u.username = producerRole
      return u.toString()
    },
    dropDatabase: async (name) => {
      await admin.unsafe(`drop database if exists ${name} with (force)`).catch(() => undefined)
    },
    restart: async (downMs) => {
      await Effect.runPromise(server.stop)
      await sleep(downMs)
      await Effect.runPromise(server.start)
    },
    close: async () => {
      await admin.end({ timeout: 5 }).catch(() => undefined)
      await Effect.runPromise(Scope.close(scope, Exit.void))
      Fs.rmSync(dataDir, { recursive: true, force: true })
    }
  }
}

/** Statements a database received since the last reset, from pg_stat_statements (top-level only). */
export const statementCount = async (admin: Sql, database: string) => {
  const [row] = await admin<Array<{ calls: string | null }>>`
    select sum(s.calls) as calls from pg_stat_statements s join pg_database d on d.oid = s.dbid
    where d.datname = ${database}`
  return Number(row?.calls ?? 0)
}

export const statementsByQuery = async (admin: Sql, database: string, limit = 12) =>
  admin<Array<{ calls: string; total_ms: number; mean_ms: number; query: string }>>`
    select s.calls::text, s.total_exec_time::float8 as total_ms, s.mean_exec_time::float8 as mean_ms,
           left(regexp_replace(s.query, '\\s+', ' ', 'g'), 160) as query
    from pg_stat_statements s join pg_database d on d.oid = s.dbid
    where d.datname = ${database}
    order by s.total_exec_time desc limit ${limit}`

/** What `serverCpuByProcess` tells apart: the backends of a subject's database, by whose connections they are. */
export const serverProcessKinds = ["the worker's connections", "the producer's connections"] as const
export type ServerProcessKind = (typeof serverProcessKinds)[number]

/**
 * The backends in `database` now, each with its kind (`serverProcessKinds`: the producer's connect as its own
 * role, every other is the worker's) and its CPU so far (ms). Two readings give each kind's share of the window
 * between them (`serverCpuShares` in workloads.ts).
 */
export const serverCpuByProcess = async (
  admin: Sql, database: string
): Promise<Map<number, { readonly kind: ServerProcessKind; readonly ms: number }>> => {
  const rows = await admin<Array<{ pid: number; usename: string | null }>>`
    select pid, usename from pg_stat_activity where datname = ${database} and backend_type = 'client backend'`
  const out = new Map<number, { readonly kind: ServerProcessKind; readonly ms: number }>()
  for (const r of rows) {
    const ms = cpuMsOf(r.pid)
    if (ms !== null) out.set(r.pid, { kind: r.usename === producerRole ? "the producer's connections" : "the worker's connections", ms })
  }
  return out
}

/** The role a separate producer process connects as (`Cluster.asProducer`); pg_stat_statements keeps its statements apart. */
export const producerRole = "bench_producer"

export interface StatementTally {
  readonly total: number
  readonly claim: number
  readonly settle: number
  readonly enqueue: number
}

const emptyTally: StatementTally = { total: 0, claim: 0, settle: 0, enqueue: 0 }

/**
 * A database's statements since the last reset, counted by kind (a subject's `StatementKinds`), for the
 * producer role and for everyone else (the worker; the harness sends none while it measures).
 */
export const tallyStatements = async (
  admin: Sql, database: string, kinds: { readonly claim: RegExp; readonly settle: RegExp; readonly enqueue: RegExp }
): Promise<{ readonly worker: StatementTally; readonly producer: StatementTally }> => {
  const rows = await admin<Array<{ calls: string; query: string; producer: boolean }>>`
    select s.calls::text, s.query, coalesce(r.rolname = ${producerRole}, false) as producer
    from pg_stat_statements s join pg_database d on d.oid = s.dbid left join pg_roles r on r.oid = s.userid
    where d.datname = ${database}`
  const add = (t: StatementTally, calls: number, query: string): StatementTally => ({
    total: t.total + calls,
    claim: t.claim + (kinds.claim.test(query) ? calls : 0),
    settle: t.settle + (kinds.settle.test(query) ? calls : 0),
    enqueue: t.enqueue + (kinds.enqueue.test(query) ? calls : 0)
  })
  let worker = emptyTally
  let producer = emptyTally
  for (const r of rows) {
    if (r.producer) producer = add(producer, Number(r.calls), r.query)
    else worker = add(worker, Number(r.calls), r.query)
  }
  return { worker, producer }
}

export const resetStatements = (admin: Sql) => admin`select pg_stat_statements_reset()`

export const openConnections = async (admin: Sql, database: string) => {
  const [row] = await admin<Array<{ n: string }>>`
    select count(*)::text as n from pg_stat_activity where datname = ${database} and backend_type = 'client backend'`
  return Number(row?.n ?? 0)
}

// ---- worker child processes --------------------------------------------------------------------------------

export type ChildMessage =
  | { readonly t: "starting"; readonly at: number }
  | { readonly t: "ready"; readonly at: number }
  | { readonly t: "start"; readonly seq: number; readonly at: number }
  /** The steady workload's handler starts, batched. */
  | { readonly t: "starts"; readonly seqs: ReadonlyArray<number>; readonly ats: ReadonlyArray<number> }
  /** The steady workload's producer: when each enqueue call started, batched. */
  | { readonly t: "enqueued"; readonly seqs: ReadonlyArray<number>; readonly ats: ReadonlyArray<number> }
  | {
    readonly t: "produced"
    readonly calls: number
    readonly failed: number
    readonly lateMs: number
    /** How long an enqueue call took to return (committed), over the whole run. */
    readonly callP50Ms: number
    readonly callP99Ms: number
  }
  | { readonly t: "first"; readonly at: number }
  | { readonly t: "drained"; readonly at: number; readonly handled: number }
  | { readonly t: "tick"; readonly at: number }
  | { readonly t: "metrics"; readonly fenced: number; readonly completed: number; readonly claimed: number }
  /** The soak's worker: how long each claim statement took (ms) since its last report. */
  | { readonly t: "claims"; readonly ms: ReadonlyArray<number> }
  | { readonly t: "error"; readonly message: string }

export interface WorkerChild {
  readonly pid: number
  readonly spawnedAt: number
  readonly messages: Array<ChildMessage>
  /** Resolves with the first message of this kind (the ones already received count). */
  readonly waitFor: <T extends ChildMessage["t"]>(t: T, timeoutMs: number) => Promise<Extract<ChildMessage, { t: T }> | null>
  readonly onMessage: (f: (m: ChildMessage) => void) => void
  readonly exited: Promise<number | null>
  readonly stderrTail: () => string
  /** SIGTERM, then SIGKILL after `graceMs`. */
  readonly stop: (graceMs?: number) => Promise<number | null>
  readonly kill: () => Promise<number | null>
}

// worker processes die with the harness, however it ends (an interrupted run must not leave workers behind)
const liveChildren = new Set<Child.ChildProcess>()
process.on("exit", () => liveChildren.forEach((c) => c.kill("SIGKILL")))

/** A TCP port free on loopback now (for a server a bench starts). */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

/** Where `compileWorker` writes the plain-JavaScript worker scripts (ignored by git, like all of .data). */
const compiledDir = Path.join(repoDir, ".data", "bench-build")

/**
 * Compiles `bench/<script>` (TypeScript) to one plain ES module under .data/bench-build, with every package
 * left to node_modules: the peers load their published JavaScript, pgfiber its compiled `dist/` (by the
 * package's own `exports`), and the process runs under plain `node`, as their users run them. Compiled once
 * per harness run; returns the path to run.
 */
export const compileWorker = async (script: string): Promise<string> => {
  const out = Path.join(compiledDir, script.replace(/\.ts$/, ".mjs"))
  if (compiled.has(out)) return out
  if (!Fs.existsSync(Path.join(repoDir, "packages", "pgfiber", "dist", "index.js"))) {
    throw new Error("packages/pgfiber/dist/ is missing: run `npm run build` first (npm ci does)")
  }
  const esbuild = await import("esbuild")
  await esbuild.build({
    entryPoints: [Path.join(benchDir, script)],
    outfile: out,
    bundle: true,
    packages: "external",
    platform: "node",
    format: "esm",
    target: "node20",
    logLevel: "warning"
  })
  compiled.add(out)
  return out
}
const compiled = new Set<string>()

export interface SpawnOptions {
  readonly execArgv?: ReadonlyArray<string>
  /** Run the script compiled by `compileWorker` under plain node (default: the TypeScript under tsx). */
  readonly compiled?: string
}

/** Runs `bench/<script>` in its own Node process (as a deployment would), speaking JSON over IPC. */
export const spawnWorker = (script: string, config: unknown, options: SpawnOptions = {}): WorkerChild => {
  const spawnedAt = nowNs()
  const entry = options.compiled !== undefined ? [options.compiled] : ["--import", "tsx", Path.join(benchDir, script)]
  const child = Child.spawn(process.execPath, [...(options.execArgv ?? []), ...entry, JSON.stringify(config)], {
    cwd: repoDir,
    // BENCH_CHILD_LOG=path keeps the workers' stdout (their logs) for debugging
    stdio: ["ignore", process.env.BENCH_CHILD_LOG ? Fs.openSync(process.env.BENCH_CHILD_LOG, "a") : "ignore", "pipe", "ipc"],
    env: { ...process.env, NODE_ENV: "production" }
  })
  liveChildren.add(child)
  child.on("exit", () => liveChildren.delete(child))
  const messages: Array<ChildMessage> = []
  const listeners: Array<(m: ChildMessage) => void> = []
  let tail = ""
  child.stderr!.on("data", (chunk: Buffer) => {
    tail = (tail + chunk.toString("utf8")).slice(-4000)
  })
  child.on("message", (m: ChildMessage) => {
    messages.push(m)
    for (const l of listeners) l(m)
  })
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code, signal) => resolve(code ?? (signal ? -1 : null))))
  let done = false
  void exited.then(() => (done = true))
  const waitFor = <T extends ChildMessage["t"]>(t: T, timeoutMs: number) =>
    new Promise<Extract<ChildMessage, { t: T }> | null>((resolve) => {
      const found = messages.find((m) => m.t === t)
      if (found) return resolve(found as Extract<ChildMessage, { t: T }>)
      const timer = setTimeout(() => resolve(null), timeoutMs)
      listeners.push((m) => {
        if (m.t === t) {
          clearTimeout(timer)
          resolve(m as Extract<ChildMessage, { t: T }>)
        }
      })
      void exited.then(() => {
        clearTimeout(timer)
        resolve((messages.find((m) => m.t === t) as Extract<ChildMessage, { t: T }>) ?? null)
      })
    })
  const stop = async (graceMs = 10_000) => {
    if (done) return exited
    child.kill("SIGTERM")
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs)
    const code = await exited
    clearTimeout(timer)
    return code
  }
  const kill = async () => {
    if (!done) child.kill("SIGKILL")
    return exited
  }
  return {
    pid: child.pid!,
    spawnedAt,
    messages,
    waitFor,
    onMessage: (f) => listeners.push(f),
    exited,
    stderrTail: () => tail,
    stop,
    kill
  }
}

/** Resident set now and at its peak (VmHWM), in MiB, read from outside so the worker pays nothing. */
export const rssOf = (pid: number): { rssMiB: number; peakMiB: number } | null => {
  try {
    const status = Fs.readFileSync(`/proc/${pid}/status`, "utf8")
    const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? Number.NaN)
    return { rssMiB: kb("VmRSS") / 1024, peakMiB: kb("VmHWM") / 1024 }
  } catch {
    return null
  }
}

/** A claimed job's id and lease, by their places in the claims' arrays (`JobsSql.claimedFields`). */
export const claimedAt = { id: JobsSql.claimedFields.indexOf("id"), lease: JobsSql.claimedFields.indexOf("lease") } as const

/** A process's `/proc/<pid>/stat` fields after its command (state first: field 3, 1-based, counting pid and comm). */
const statFields = (pid: number | string) => {
  const stat = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")
}

/** CPU time (user + system) a process has used so far, in ms, from /proc (10 ms resolution). */
export const cpuMsOf = (pid: number): number | null => {
  try {
    const fields = statFields(pid)
    // utime 14 and stime 15 (1-based, counting pid and comm)
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100
  } catch {
    return null
  }
}

/**
 * CPU time (user + system) the whole PostgreSQL server has used so far, in ms: the postmaster, its live
 * children (backends, WAL writer, checkpointer, autovacuum) and the children it has reaped (a backend that
 * exited is counted in the postmaster's cutime/cstime). Other databases' idle backends add nothing.
 */
export const serverCpuMsOf = (dataDir: string): number | null => {
  try {
    const postmaster = Number(Fs.readFileSync(Path.join(dataDir, "postmaster.pid"), "utf8").split("\n")[0])
    const own = statFields(postmaster)
    // utime, stime, cutime, cstime: fields 14-17 (1-based, counting pid and comm)
    let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14])
    for (const entry of Fs.readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue
      try {
        const f = statFields(entry)
        if (Number(f[1]) === postmaster) ticks += Number(f[11]) + Number(f[12])
      } catch {
        // exited while we looked: its time is in the postmaster's cutime from now on
      }
    }
    return (ticks * 1000) / 100
  } catch {
    return null
  }
}

/** In a child: send a message to the parent (a no-op when run by hand). */
export const tell = (m: ChildMessage) => {
  if (process.send) process.send(m)
}

export interface MachineInfo {
  readonly cpu: string
  readonly cores: number
  readonly ramGiB: number
  readonly os: string
  readonly node: string
  readonly postgres: string
  readonly loadAverageAtStart: ReadonlyArray<number>
}

export const machineInfo = (postgresVersion: string): MachineInfo => ({
  cpu: Os.cpus()[0]?.model ?? "unknown",
  cores: Os.cpus().length,
  ramGiB: Math.round((Os.totalmem() / 2 ** 30) * 10) / 10,
  os: `${Os.type()} ${Os.release()} ${Os.arch()}`,
  node: process.version,
  postgres: postgresVersion,
  loadAverageAtStart: Os.loadavg().map((x) => Math.round(x * 100) / 100)
})

export const packageVersion = (name: string): string => {
  try {
    return JSON.parse(Fs.readFileSync(Path.join(repoDir, "node_modules", name, "package.json"), "utf8")).version
  } catch {
    return "?"
  }
}
