/**
 * `node --import tsx bench/fleet.ts [--processes 1,4,16] [--jobs 50]`: claims per job for a trickle of single
 * jobs with N worker processes listening on one stage (test/fixtures/fleetWorker.ts, concurrency 10, each
 * process on its own connections straight to one embedded PostgreSQL). Each job is enqueued once the one before
 * has run; the claims are the processes' `pgfiber_claims_total`, from once all are up and quiet to the last job.
 * Without a wake leader each of the N processes claimed on every NOTIFY (N claims per job); docs/benchmarks.md.
 *
 * Not here (yet): the bulk drain with 1, 4 and 16 processes through PgBouncer, which PgBouncer 1.18 cannot carry
 * today (docs/operations.md, the known defect).
 */
import { Effect, Layer, ManagedRuntime, Redacted, Schema } from "effect"
import { spawn } from "node:child_process"
import * as Path from "node:path"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import { connect, log, repoDir, sleep, startCluster } from "./lib.js"

const args = process.argv.slice(2)
const option = (name: string) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : undefined
}
const counts = (option("processes") ?? "1,4,16").split(",").map(Number)
const jobs = Number(option("jobs") ?? 50)
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

const trickle = async (cluster: Awaited<ReturnType<typeof startCluster>>, n: number) => {
  const url = await cluster.createDatabase(`fleet_${n}`)
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema, poolMax: 2 }))
  const runtime = ManagedRuntime.make(PgQueue.layer().pipe(Layer.provideMerge(dbLayer)))
  await runtime.runPromise(Migrations.migrate())
  const sql = connect(url, { max: 2, schema })
  await sql`create table executions (job_id text not null, worker_id text not null)`
  const claims = new Array<number>(n).fill(0)
  const children = Array.from({ length: n }, (_, i) => {
    const child = spawn(process.execPath, ["--import", "tsx", Path.join(repoDir, "test/fixtures/fleetWorker.ts")], {
      env: { ...process.env, DATABASE_URL: url, PGFIBER_SCHEMA: schema, WORKER_ID: `fleet-${i}`, SHUTDOWN_GRACE_MS: "5000" },
      stdio: ["ignore", "pipe", "inherit"]
    })
    child.stdout.on("data", (d: Buffer) => {
      for (const m of d.toString().matchAll(/\{"fleetClaims":(\d+)\}/g)) claims[i] = Number(m[1])
    })
    return child
  })
  const total = () => claims.reduce((a, b) => a + b, 0)
  try {
    await until("every process to claim once", () => claims.every((c) => c > 0))
    // quiet: no claim for 2 s
    let last = -1
    let since = Date.now()
    await until("the start-up claims", () => {
      if (total() !== last) [last, since] = [total(), Date.now()]
      return Date.now() - since >= 2_000
    })
    const before = total()
    for (let j = 1; j <= jobs; j++) {
      await runtime.runPromise(Stage.enqueue(fleet, { sleepMs: 0 }))
      await until(`job ${j}`, async () => (await sql`select count(*)::int as n from executions`)[0]!.n >= j)
    }
    await sleep(1_000)
    const spent = total() - before
    return { processes: n, jobs, claims: spent, perJob: spent / jobs }
  } finally {
    children.forEach((c) => c.kill("SIGTERM"))
    await Promise.all(children.map((c) => new Promise((r) => (c.exitCode !== null ? r(null) : c.once("exit", r)))))
    await sql.end({ timeout: 5 })
    await runtime.dispose()
    await cluster.dropDatabase(`fleet_${n}`)
  }
}

const cluster = await startCluster({ flags: ["-c", "max_connections=300"] })
try {
  const rows = []
  for (const n of counts) {
    const row = await trickle(cluster, n)
    log(`fleet: ${row.processes} processes, ${row.jobs} single jobs: ${row.claims} claims, ${row.perJob.toFixed(2)} per job`)
    rows.push(row)
  }
  console.log("\n| processes | jobs (one at a time) | claim statements | claims per job |\n|---:|---:|---:|---:|")
  for (const r of rows) console.log(`| ${r.processes} | ${r.jobs} | ${r.claims} | ${r.perJob.toFixed(2)} |`)
} finally {
  await cluster.close()
}
