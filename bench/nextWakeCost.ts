/**
 * What the stage registry adds to the Waker's next-due question (`JobsSql.nextWake`), the one statement an idle
 * worker sends per sweep and a busy one after timer-woken claims: the statement as it was before the registry,
 * the statement now without a process to mark seen (every call but the sweep's), and with one (the sweep's, once
 * per sweep interval). Database backend CPU (from /proc: the server must run on this machine) and round trip per
 * statement, medians over rounds in which the variants take turns. 2,000 delayed jobs queued, 3 processes
 * registered with 5 stages each.
 *
 *   node --import tsx bench/nextWakeCost.ts [--rounds 7] [--calls 2000]
 *
 * Without DATABASE_URL it boots an embedded PostgreSQL of its own.
 */
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"
import * as Registry from "../packages/pgfiber/src/queue/Registry.js"
import { connect, cpuMsOf, log, median, option, type Sql, startCluster } from "./lib.js"

const rounds = Number(option("rounds") ?? 7)
const calls = Number(option("calls") ?? 2000)
const schema = "pgfiber_next_wake_cost"
const stages = ["a", "b", "c", "d", "e"]

/** The statement before migration 0018, for comparison. */
const before = (sql: Sql, names: ReadonlyArray<string>) =>
  sql`
    select
      (extract(epoch from (
        select min(d.at) from unnest(${names}::text[]) as s(stage)
        cross join lateral (select min(available_at) as at from jobs
                            where jobs.stage = s.stage and status = 'queued') d) - now()) * 1000)::float8
        as job_due_in_ms,
      (extract(epoch from (select min(locked_until) from jobs where status <> 'queued') - now()) * 1000)::float8
        as lease_expires_in_ms`

const variants: Record<string, (sql: Sql) => Promise<unknown>> = {
  "before the registry": (sql) => before(sql, stages),
  "now, no process to mark": (sql) => JobsSql.nextWake(sql, null, stages, null),
  "now, marking a process seen (the sweep's)": (sql) => JobsSql.nextWake(sql, null, stages, "proc-1")
}

const main = async () => {
  const cluster = process.env.DATABASE_URL ? null : await startCluster({})
  const url = process.env.DATABASE_URL ?? cluster!.url
  const admin = connect(url, { max: 1 })
  await admin.unsafe(`drop schema if exists ${schema} cascade`)
  for (const m of Migrations.load()) {
    await admin.unsafe(`create schema if not exists ${schema}; ${m.sql.replaceAll("{{schema}}", schema)}`).simple()
  }
  const sql = connect(url, { max: 1, schema })
  try {
    await sql`
      insert into jobs (stage, payload, available_at)
      select (array['a','b','c','d','e'])[1 + g % 5], '{}'::jsonb, now() + interval '1 hour' from generate_series(1, 2000) g`
    for (const p of ["proc-1", "proc-2", "proc-3"]) {
      await Registry.register(sql, null, { workerId: p, sweepMs: 60_000 }, stages.map((name) => ({
        name, visibility: "internal", concurrency: 4, limits: { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null },
        retainMs: null, maxAttempts: 5, priority: 50, payloadSchema: { type: "object" }
      })))
    }
    await sql`vacuum analyze jobs`
    const [{ pid }] = await sql<Array<{ pid: number }>>`select pg_backend_pid() as pid`
    const cpu: Record<string, Array<number>> = {}
    const rtt: Record<string, Array<number>> = {}
    for (const run of Object.values(variants)) for (let i = 0; i < 200; i++) await run(sql) // warm-up: plans cached
    for (let round = 1; round <= rounds; round++) {
      for (const [name, run] of Object.entries(variants)) {
        const s0 = cpuMsOf(pid)!
        const t0 = performance.now()
        for (let i = 0; i < calls; i++) await run(sql)
        ;(rtt[name] ??= []).push(((performance.now() - t0) / calls) * 1000)
        ;(cpu[name] ??= []).push(((cpuMsOf(pid)! - s0) / calls) * 1000)
      }
      log(`round ${round} of ${rounds} done`)
    }
    console.log(`\nnextWake per statement, µs (medians of ${rounds} rounds of ${calls} calls)\n`)
    console.log(`| statement | server CPU | round trip |`)
    console.log(`| --- | ---: | ---: |`)
    for (const name of Object.keys(variants)) {
      console.log(`| ${name} | ${median(cpu[name]!).toFixed(1)} | ${median(rtt[name]!).toFixed(1)} |`)
    }
  } finally {
    await admin.unsafe(`drop schema if exists ${schema} cascade`).catch(() => undefined)
    await sql.end({ timeout: 5 })
    await admin.end({ timeout: 5 })
    await cluster?.close()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
