/**
 * What pgfiber's drain statements cost per job, on both sides of the wire, with no worker runtime: the
 * database backend's CPU (from /proc, so the server must run on this machine) and this process's, while
 * 20,000 queued jobs are claimed in claims of 508 (a pool's claim size under a backlog) or settled in batches
 * of 508. Variants take turns within each round, and the figures are the medians over rounds, because the
 * machine's own pace drifts over minutes and a one-off comparison says little (docs/benchmarks.md, sixth
 * session).
 *
 * - `fair`, `plain`: `JobsSql.claimShares` (fair, the default) and `JobsSql.claimReady`, with the jobs decoded
 *   as `PgQueue` decodes them (`claimedJobs`); `fairOneOrg`: `JobsSql.claimReadyIfAll`, what a fair stage sends
 *   for a backlog of one org (every job here has none);
 * - `complete`, `general`: a batch of completions settled by `JobsSql.completeOutcomes` (what `PgQueue.settle`
 *   sends for them) and by `JobsSql.settleOutcomes` (its statement for every kind), both keeping history.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test node --import tsx bench/statementCost.ts [--rounds 10] [--without INDEX,...]
 *
 * Without DATABASE_URL it boots an embedded PostgreSQL of its own.
 */
import postgres from "postgres"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"
import { Effect } from "effect"
import { claimedJobs } from "../packages/pgfiber/src/queue/PgQueue.js"
import { connect, cpuMsOf, log, median, option, type Sql, startCluster } from "./lib.js"

const rounds = Number(option("rounds") ?? 10)
/** `--without a,b`: drops these indexes of `jobs` first (what an index costs the drain's statements). */
const without = (option("without") ?? "").split(",").filter((n) => n !== "")
const jobs = 20_000
const batch = 508
const stage = "cost"
const schema = "pgfiber_statement_cost"
const weekMs = 7 * 24 * 3600 * 1000

const backendCpuMs = (pid: number) => {
  const ms = cpuMsOf(pid)
  if (ms === null) throw new Error(`no /proc entry for backend ${pid}: the server must run on this machine`)
  return ms
}
const clientCpuMs = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1000
}

const fill = async (sql: Sql, running: boolean) => {
  await sql`truncate jobs, jobs_archive`
  await sql`
    insert into jobs (stage, payload, status, lease, locked_by, locked_until, started_at)
    select ${stage}, jsonb_build_object('seq', g), ${running ? "running" : "queued"}, ${running ? 1 : 0},
           ${running ? "w" : null}, ${running ? sql`now() + interval '1 hour'` : null}, ${running ? sql`now()` : null}
    from generate_series(1, ${jobs}) g`
  await sql`vacuum analyze jobs`
}

const claimAll = async (sql: Sql, fair: boolean | "oneOrg") => {
  const shares = { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null }
  let cursor: string | null = null
  let claimed = 0
  for (;;) {
    let rows: ReadonlyArray<ReadonlyArray<unknown>>
    if (fair === "oneOrg") {
      // what a fair stage's pool sends for a backlog of one org: the plain claim, taken as fair shares would claim the same
      const [r] = await JobsSql.claimReadyIfAll(sql, null, stage, batch, "w", 60_000)
      if (r!.fits !== true) throw new Error("claimReadyIfAll: one org's backlog did not fit")
      rows = r!.jobs
    } else if (fair) {
      const [r] = await JobsSql.claimShares(sql, null, stage, batch, "w", 60_000, shares, cursor)
      cursor = r!.cursor
      rows = r!.jobs
    } else {
      rows = (await JobsSql.claimReady(sql, null, stage, batch, "w", 60_000))[0]!.jobs
    }
    claimed += Effect.runSync(claimedJobs(rows)).jobs.length
    if (rows.length === 0) return claimed
  }
}

const settleAll = async (sql: Sql, general: boolean) => {
  const ids = (await sql<Array<{ id: string }>>`select id::text from jobs order by id`).map((r) => r.id)
  let settled = 0
  for (let i = 0; i < ids.length; i += batch) {
    const part = ids.slice(i, i + batch)
    const none = part.map(() => null)
    // the general statement returns a row per settled job; the completions' statement the ids it did not complete
    settled += general
      ? (await JobsSql.settleOutcomes(sql, null, schema, {
        ids: part, leases: part.map(() => 1), kinds: part.map(() => "complete"), delays: part.map(() => 0),
        tags: none, messages: none, outputs: none, runMs: part.map(() => 1), retainMs: none, progress: none, progressMessages: none
      }, { defaultMs: weekMs, byStage: "{}" })).length
      : part.length - (await JobsSql.completeOutcomes(sql, null, schema, { ids: part, leases: part.map(() => 1), outputs: none, runMs: part.map(() => 1) },
        null, { defaultMs: weekMs, byStage: "{}" })).length
  }
  return settled
}

const variants: Record<string, { readonly running: boolean; readonly run: (sql: Sql) => Promise<number> }> = {
  fair: { running: false, run: (sql) => claimAll(sql, true) },
  plain: { running: false, run: (sql) => claimAll(sql, false) },
  fairOneOrg: { running: false, run: (sql) => claimAll(sql, "oneOrg") },
  complete: { running: true, run: (sql) => settleAll(sql, false) },
  general: { running: true, run: (sql) => settleAll(sql, true) }
}

const main = async () => {
  const cluster = process.env.DATABASE_URL ? null : await startCluster({})
  const url = process.env.DATABASE_URL ?? cluster!.url
  const admin = connect(url, { max: 1 })
  await admin.unsafe(`drop schema if exists ${schema} cascade`)
  for (const m of Migrations.load()) {
    await admin.unsafe(`create schema if not exists ${schema}; ${m.sql.replaceAll("{{schema}}", schema)}`).simple()
  }
  for (const index of without) {
    await admin`drop index ${admin(`${schema}.${index}`)}`
    log(`without ${index} (dropped: a measurement, not a configuration)`)
  }
  // claims on a connection whose session has the claims' settings, as the worker's claim pool has them; settles
  // on a plain one, as the worker's main pool
  const claims: Sql = postgres(url, {
    max: 1,
    onnotice: () => undefined,
    connection: { ...JobsSql.claimSettings, search_path: schema } as Record<string, string>
  })
  const settles = connect(url, { max: 1, schema })
  try {
    const pids = new Map<Sql, number>()
    for (const sql of [claims, settles]) pids.set(sql, (await sql<Array<{ pid: number }>>`select pg_backend_pid() as pid`)[0]!.pid)
    const server: Record<string, Array<number>> = {}
    const client: Record<string, Array<number>> = {}
    for (let round = 1; round <= rounds; round++) {
      for (const [name, v] of Object.entries(variants)) {
        const sql = v.running ? settles : claims
        const pid = pids.get(sql)!
        await fill(sql, v.running)
        const s0 = backendCpuMs(pid)
        const c0 = clientCpuMs()
        const n = await v.run(sql)
        if (n !== jobs) throw new Error(`${name}: ${n} of ${jobs} jobs`)
        ;(server[name] ??= []).push(((backendCpuMs(pid) - s0) / jobs) * 1000)
        ;(client[name] ??= []).push(((clientCpuMs() - c0) / jobs) * 1000)
      }
      log(`round ${round} of ${rounds} done`)
    }
    console.log(`\nCPU per job, µs (medians of ${rounds} rounds, ${jobs} jobs in batches of ${batch})\n`)
    console.log(`| statement | server | this process |`)
    console.log(`| --- | ---: | ---: |`)
    for (const name of Object.keys(variants)) {
      console.log(`| ${name} | ${median(server[name]!).toFixed(1)} | ${median(client[name]!).toFixed(1)} |`)
    }
    const ratios = server.complete!.map((c, i) => c / server.general![i]!)
    console.log(`\nsettle: completions' statement ÷ general statement, server CPU, median of per-round ratios: ${median(ratios).toFixed(2)}`)
  } finally {
    await admin.unsafe(`drop schema if exists ${schema} cascade`).catch(() => undefined)
    await claims.end({ timeout: 5 })
    await settles.end({ timeout: 5 })
    await admin.end({ timeout: 5 })
    await cluster?.close()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
