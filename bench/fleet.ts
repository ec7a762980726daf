/**
 * `node --import tsx bench/fleet.ts [--processes 1,4,16] [--jobs 50]`: claims per job for a trickle of single
 * jobs with N worker processes listening on one stage (test/fixtures/fleetWorker.ts, concurrency 10, each
 * process on its own connections straight to one embedded PostgreSQL). Each job is enqueued once the one before
 * has run; the claims are the processes' `pgfiber_claims_total`, from once all are up and quiet to the last job.
 * Without a wake leader each of the N processes claimed on every NOTIFY (N claims per job); docs/benchmarks.md.
 *
 * `--pgbouncer [--drain 1,4,16] [--drain-jobs 20000] [--trickle 16]`: the same fleet through a real PgBouncer
 * (transaction mode, 10 server connections; each process's pool through it with DB_POOLER=transaction and
 * DB_PREPARE=false, its LISTEN direct). A bulk drain: the jobs queued first (direct), then N processes started;
 * the time from their start to the last run, and from the first run to the last; the most server connections
 * PgBouncer held (sampled every 100 ms); claim statements per 1,000 jobs. Then the trickle above through it.
 * Prints the 1-minute load average beside each figure: this machine is shared.
 */
import { Effect, Exit, Layer, ManagedRuntime, Redacted, Schema, Scope } from "effect"
import { spawn } from "node:child_process"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import { startPgBouncer } from "../test/support/pgbouncerProcess.js"
import { connect, log, option, repoDir, sleep, startCluster } from "./lib.js"

const args = process.argv.slice(2)
const list = (text: string) => text.split(",").map(Number)
const counts = list(option("processes") ?? "1,4,16")
const jobs = Number(option("jobs") ?? 50)
const throughBouncer = args.includes("--pgbouncer")
const drainCounts = list(option("drain") ?? "1,4,16")
const drainJobs = Number(option("drain-jobs") ?? 20_000)
const trickleCounts = list(option("trickle") ?? "16")
/** PgBouncer's server connections (default_pool_size = max_db_connections). */
const bouncerPool = 10
const load = () => Os.loadavg()[0]!.toFixed(1)
const schema = "pgfiber"
const fleet = Stage.make({ name: "fleet", payload: Schema.Struct({ sleepMs: Schema.Number }), handler: () => Effect.void })

const until = async (what: string, check: () => Promise<boolean> | boolean, timeoutMs = 300_000) => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await check()) return
    await sleep(20)
  }
  throw new Error(`timed out waiting for ${what}`)
}

type Cluster = Awaited<ReturnType<typeof startCluster>>

/** A migrated database with the fixture's `executions` table, and a queue on it straight to PostgreSQL (the producer). */
const fleetDatabase = async (cluster: Cluster, name: string) => {
  const url = await cluster.createDatabase(name)
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema, poolMax: 2 }))
  const runtime = ManagedRuntime.make(PgQueue.layer().pipe(Layer.provideMerge(dbLayer)))
  await runtime.runPromise(Migrations.migrate())
  const sql = connect(url, { max: 2, schema })
  await sql`create table executions (job_id text not null, worker_id text not null, at timestamptz not null default clock_timestamp())`
  return { url, runtime, sql }
}

/**
 * What the fleet's processes connect to: straight to `url`, or through a PgBouncer of `bouncerPool` server
 * connections logging in as a role of its own (so its backends can be counted), LISTEN direct.
 */
const fleetRoute = async (
  cluster: Cluster, url: string, name: string, scope: Scope.CloseableScope
): Promise<{ readonly env: Record<string, string>; readonly serverConnections: () => Promise<number>; readonly role?: string }> => {
  if (!throughBouncer) return { env: { DATABASE_URL: url }, serverConnections: async () => 0 }
  const role = `${name}_b`
  const password = `pw_${Math.random().toString(36).slice(2)}`
  await cluster.admin.unsafe(`drop role if exists ${role}`)
  await cluster.admin.unsafe(`create role ${role} login superuser password '${password}'`)
  // PgBouncer 1.18 does not pass search_path on: the role carries it (docs/operations.md)
  await cluster.admin.unsafe(`alter role ${role} set search_path = ${schema}`)
  const target = new URL(url)
  const bouncer = await Effect.runPromise(
    Scope.extend(startPgBouncer(target, role, password, { poolSize: bouncerPool, maxClientConn: 500 }), scope)
  )
  return {
    env: { DATABASE_URL: bouncer.url(role, password), DATABASE_LISTEN_URL: url, DB_PREPARE: "false", DB_POOLER: "transaction" },
    serverConnections: async () =>
      (await cluster.admin<Array<{ n: number }>>`select count(*)::int as n from pg_stat_activity where usename = ${role}`)[0]!.n,
    role
  }
}

/** N fleet worker processes; `claims()` is the sum of their `pgfiber_claims_total`. */
const spawnFleet = (n: number, env: Record<string, string>) => {
  const claims = new Array<number>(n).fill(0)
  const children = Array.from({ length: n }, (_, i) => {
    const child = spawn(process.execPath, ["--import", "tsx", Path.join(repoDir, "test/fixtures/fleetWorker.ts")], {
      env: { ...process.env, ...env, PGFIBER_SCHEMA: schema, WORKER_ID: `fleet-${i}`, SHUTDOWN_GRACE_MS: "5000" },
      stdio: ["ignore", "pipe", "inherit"]
    })
    child.stdout.on("data", (d: Buffer) => {
      for (const m of d.toString().matchAll(/\{"fleetClaims":(\d+)\}/g)) claims[i] = Number(m[1])
    })
    return child
  })
  return {
    claims: () => claims.reduce((a, b) => a + b, 0),
    everyClaimed: () => claims.every((c) => c > 0),
    stop: async () => {
      children.forEach((c) => c.kill("SIGTERM"))
      await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once("exit", r)))))
    }
  }
}

const trickle = async (cluster: Cluster, n: number) => {
  const name = `fleet_${n}`
  const { runtime, sql, url } = await fleetDatabase(cluster, name)
  const scope = Effect.runSync(Scope.make())
  const route = await fleetRoute(cluster, url, name, scope)
  const fleetProcs = spawnFleet(n, route.env)
  try {
    await until("every process to claim once", fleetProcs.everyClaimed)
    // quiet: no claim for 2 s
    let last = -1
    let since = Date.now()
    await until("the start-up claims", () => {
      if (fleetProcs.claims() !== last) [last, since] = [fleetProcs.claims(), Date.now()]
      return Date.now() - since >= 2_000
    })
    const before = fleetProcs.claims()
    for (let j = 1; j <= jobs; j++) {
      await runtime.runPromise(Stage.enqueue(fleet, { sleepMs: 0 }))
      await until(`job ${j}`, async () => (await sql`select count(*)::int as n from executions`)[0]!.n >= j)
    }
    await sleep(1_000)
    const spent = fleetProcs.claims() - before
    return { processes: n, jobs, claims: spent, perJob: spent / jobs, load: load() }
  } finally {
    await fleetProcs.stop()
    await sql.end({ timeout: 5 })
    await runtime.dispose()
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await cluster.dropDatabase(name)
    if (route.role !== undefined) await cluster.admin.unsafe(`drop role if exists ${route.role}`)
  }
}

/** `drainJobs` queued first, then N processes started: how long until the last has run, through PgBouncer. */
const drain = async (cluster: Cluster, n: number) => {
  const name = `fleet_drain_${n}`
  const { runtime, sql, url } = await fleetDatabase(cluster, name)
  const scope = Effect.runSync(Scope.make())
  const route = await fleetRoute(cluster, url, name, scope)
  try {
    for (let queued = 0; queued < drainJobs; queued += 1_000) {
      const batch = Math.min(1_000, drainJobs - queued)
      await runtime.runPromise(Effect.gen(function*() {
        const jobs = yield* Effect.forEach(Array.from({ length: batch }), () => Stage.job(fleet, { sleepMs: 0 }))
        yield* Effect.flatMap(Queue.Queue, (queue) => queue.enqueue(jobs))
      }))
    }
    let maxServer = 0
    let sampling = true
    const sampler = (async () => {
      while (sampling) {
        maxServer = Math.max(maxServer, await route.serverConnections())
        await sleep(100)
      }
    })()
    const started = Date.now()
    const fleetProcs = spawnFleet(n, route.env)
    try {
      await until("the drain", async () => {
        const [row] = await sql`select (select count(*)::int from executions) as runs, (select count(*)::int from jobs) as left`
        return row!.runs >= drainJobs && row!.left === 0
      }, 1_800_000)
      const wallMs = Date.now() - started
      sampling = false
      await sampler
      const [row] = await sql`select count(*)::int as runs, count(distinct job_id)::int as jobs,
        extract(epoch from max(at) - min(at)) * 1000 as drain_ms from executions`
      const claims = fleetProcs.claims()
      return {
        processes: n,
        jobs: drainJobs,
        wallMs,
        drainMs: Number(row!.drain_ms),
        runs: row!.runs as number,
        distinct: row!.jobs as number,
        maxServer,
        claimsPer1000: (claims / drainJobs) * 1_000,
        load: load()
      }
    } finally {
      sampling = false
      await fleetProcs.stop()
    }
  } finally {
    await sql.end({ timeout: 5 })
    await runtime.dispose()
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await cluster.dropDatabase(name)
    if (route.role !== undefined) await cluster.admin.unsafe(`drop role if exists ${route.role}`)
  }
}

const cluster = await startCluster({ flags: ["-c", "max_connections=300"] })
try {
  log(`load average (1 min) at start: ${load()}; ${Os.cpus().length} cores`)
  if (throughBouncer) {
    const drains = []
    for (const n of drainCounts) {
      const row = await drain(cluster, n)
      log(`fleet drain through PgBouncer: ${row.processes} processes, ${row.jobs} jobs: ${row.wallMs} ms from start, ` +
        `${Math.round(row.drainMs)} ms first to last run, ${row.runs} runs of ${row.distinct} jobs, ` +
        `${row.maxServer} server connections at most, ${row.claimsPer1000.toFixed(1)} claims / 1,000 jobs (load ${row.load})`)
      drains.push(row)
    }
    console.log(
      `\n| processes (concurrency 10) | jobs | start to last run | first to last run | jobs/s (first to last) | runs | server connections, most (pool ${bouncerPool}) | claims / 1,000 jobs | load (1 min) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|`
    )
    for (const r of drains) {
      console.log(`| ${r.processes} | ${r.jobs} | ${(r.wallMs / 1000).toFixed(1)} s | ${(r.drainMs / 1000).toFixed(1)} s | ` +
        `${Math.round(r.jobs / (r.drainMs / 1000))} | ${r.runs} | ${r.maxServer} | ${r.claimsPer1000.toFixed(1)} | ${r.load} |`)
    }
  }
  const rows = []
  for (const n of throughBouncer ? trickleCounts : counts) {
    const row = await trickle(cluster, n)
    log(`fleet${throughBouncer ? " through PgBouncer" : ""}: ${row.processes} processes, ${row.jobs} single jobs: ${row.claims} claims, ` +
      `${row.perJob.toFixed(2)} per job (load ${row.load})`)
    rows.push(row)
  }
  console.log("\n| processes | jobs (one at a time) | claim statements | claims per job | load (1 min) |\n|---:|---:|---:|---:|---:|")
  for (const r of rows) console.log(`| ${r.processes} | ${r.jobs} | ${r.claims} | ${r.perJob.toFixed(2)} | ${r.load} |`)
} finally {
  await cluster.close()
}
