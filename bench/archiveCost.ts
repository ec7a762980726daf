/**
 * What handing finished jobs to jobs_archive costs, per archive index layout, at a large backlog.
 *
 * Default: no worker runtime, pgfiber's own claim (batches of `batch`) and settle statements on `connections`
 * connections, segments of `segment` jobs alternating between variants in one database: retention off, and
 * retention on with each layout. Per variant: jobs/s, the settle's mean time, WAL bytes per job.
 *
 * `--drains`: the bench's own 1M-backlog row (W.backlog: the compiled worker drains for 10 s), alternating
 * retention off and on with each layout (order reversed every other round), in one database; `--checkpoint`
 * starts each drain from a CHECKPOINT.
 *
 *   node --import tsx bench/archiveCost.ts [--queued 1000000] [--segment 5000] [--rounds 4] [--layouts v0010,v0015]
 *   node --import tsx bench/archiveCost.ts --drains --rounds 5 [--checkpoint]
 */
import * as Os from "node:os"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"
import { claimedAt, connect, log, median, msSince, nowNs, option, type Sql, startCluster } from "./lib.js"
import { queueName } from "./subjects/types.js"

const args = process.argv.slice(2)
const queued = Number(option("queued") ?? 1_000_000)
const segment = Number(option("segment") ?? 5_000)
const rounds = Number(option("rounds") ?? 4)
const connections = Number(option("connections") ?? 2)
const batch = Number(option("batch") ?? 80)

/** Archive index layouts: statements that put the archive's secondary indexes in that shape. */
const layouts: Record<string, ReadonlyArray<string>> = {
  // migration 0010
  v0010: [
    "create index if not exists jobs_archive_prune on jobs_archive (keep_until)",
    "create index if not exists jobs_archive_stage on jobs_archive (stage, finished_at)",
    "create index if not exists jobs_archive_org on jobs_archive (org_id) where org_id is not null"
  ],
  // primary key only (the floor)
  pkonly: [],
  // migration 0015
  v0015: [
    "create index if not exists jobs_archive_stage on jobs_archive (stage, keep_until)",
    "create index if not exists jobs_archive_org on jobs_archive (org_id) where org_id is not null"
  ],
  keep: ["create index if not exists jobs_archive_prune on jobs_archive (keep_until)"],
  brinkeep: ["create index if not exists jobs_archive_keep_brin on jobs_archive using brin (keep_until) with (pages_per_range = 32, autosummarize = on)"],
  brin: [
    "create index if not exists jobs_archive_keep_brin on jobs_archive using brin (keep_until) with (pages_per_range = 32, autosummarize = on)",
    "create index if not exists jobs_archive_org on jobs_archive (org_id) where org_id is not null"
  ]
}
const wanted = (option("layouts") ?? "v0010,v0015").split(",")

/**
 * `--drains`: the bench's own 1M-backlog row (W.backlog: a compiled worker drains for 10 s) alternating retention
 * off and on, with the archive's indexes switched to each layout before its turn, in one database.
 */
const drains = async () => {
  const W = await import("./workloads.js")
  const Pgfiber = await import("./subjects/pgfiber.js")
  const cluster = await startCluster({
    flags: ["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=top", "-c", "max_connections=200",
      "-c", "shared_buffers=512MB"]
  })
  try {
    await W.compileSubjects([Pgfiber.subject, Pgfiber.noRetention])
    const dbs = await W.prepareBacklog(cluster, queued)
    const sql = connect(dbs.large.url, { max: 1, schema: "pgfiber" })
    const results: Record<string, Array<number>> = {}
    const variants = ["off", ...wanted]
    for (let round = 1; round <= rounds; round++) {
      for (const v of round % 2 === 1 ? variants : [...variants].reverse()) {
        if (v !== "off") {
          const idx = await sql<Array<{ indexname: string }>>`
            select indexname from pg_indexes where schemaname = 'pgfiber' and tablename = 'jobs_archive' and indexname <> 'jobs_archive_pkey'`
          for (const i of idx) await sql.unsafe(`drop index pgfiber.${i.indexname}`)
          for (const s of layouts[v]!) await sql.unsafe(s)
        }
        // --checkpoint: each run starts from a clean checkpoint, not paying for the previous one's dirty pages
        if (args.includes("--checkpoint")) await sql`checkpoint`
        const load = Os.loadavg()[0]!
        const r = await W.backlog(cluster, v === "off" ? Pgfiber.noRetention : Pgfiber.subject, dbs.large, queued, 10_000)
        const [t] = await sql<Array<Record<string, unknown>>>`
          select (select count(*) from jobs_archive)::int as archived,
                 (select autovacuum_count + autoanalyze_count from pg_stat_user_tables where relname = 'jobs_archive')::int as archive_autos,
                 (select autovacuum_count + autoanalyze_count from pg_stat_user_tables where relname = 'jobs')::int as jobs_autos`
        ;(results[v] ??= []).push(r.perSec)
        const settle = r.topStatements.find((s) => s.query.includes("with input as"))
        log(`round ${round} ${v}: ${Math.round(r.perSec)} jobs/s (${r.completed}), settle ${settle ? `${settle.calls} × ${settle.mean_ms.toFixed(2)} ms` : "?"}, ` +
          `load ${load.toFixed(1)}, ${JSON.stringify(t)}`)
        for (const s of r.topStatements.slice(0, 4)) log(`      ${s.calls} × ${s.mean_ms.toFixed(2)} ms = ${Math.round(s.total_ms)} ms  ${s.query.slice(0, 70)}`)
      }
    }
    const off = median(results.off!)
    for (const v of variants) log(`${v}: median ${Math.round(median(results[v]!))} jobs/s (${((median(results[v]!) / off) * 100).toFixed(0)} % of off) of ${results[v]!.map(Math.round).join(", ")}`)
    await sql.end({ timeout: 5 })
  } finally {
    await cluster.close()
  }
}

const main = async () => {
  const cluster = await startCluster({
    flags: ["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=top", "-c", "max_connections=200",
      "-c", "shared_buffers=512MB"]
  })
  const name = "bench_archive_cost"
  try {
    const url = await cluster.createDatabase(name)
    const { migratePgfiber } = await import("./workloads.js")
    await migratePgfiber(url)
    const sql = connect(url, { max: connections + 1, schema: "pgfiber" })
    const fill = async (n: number) => {
      for (let done = 0; done < n; done += 100_000) {
        await sql`insert into jobs (stage, payload) select ${queueName}, jsonb_build_object('seq', g)
                  from generate_series(1, ${Math.min(100_000, n - done)}::int) g`
      }
    }
    await fill(queued)
    await sql`vacuum analyze jobs`
    log(`postgres ${cluster.version}; ${queued} queued; load ${Os.loadavg()[0]!.toFixed(1)}`)
    const drop = async () => {
      const idx = await sql<Array<{ indexname: string }>>`
        select indexname from pg_indexes where schemaname = 'pgfiber' and tablename = 'jobs_archive' and indexname <> 'jobs_archive_pkey'`
      for (const i of idx) await sql.unsafe(`drop index pgfiber.${i.indexname}`)
    }
    const drain = async (retainMs: number) => {
      let done = 0
      const t0 = nowNs()
      await Promise.all(Array.from({ length: connections }, async (_, c) => {
        while (done < segment) {
          const rows = await sql.begin(async (tx) => {
            await tx`select set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)`
            return JobsSql.claimReady(tx as unknown as Sql, null, queueName, batch, `cost-${c}`, 60_000)
          })
          const jobs = rows[0]?.jobs ?? []
          if (jobs.length === 0) return
          const ids = jobs.map((j) => String(j[claimedAt.id]))
          const fenced = await JobsSql.completeOutcomes(sql, null, "pgfiber", {
            ids, leases: jobs.map((j) => Number(j[claimedAt.lease])), outputs: ids.map(() => null), runMs: ids.map(() => 1)
          }, null, { defaultMs: retainMs, byStage: "{}" })
          done += ids.length - fenced.length
        }
      }))
      return { done, ms: msSince(t0) }
    }
    const results: Record<string, Array<{ perSec: number; walPerJob: number; settleMs: number }>> = {}
    const variants = ["off", ...wanted]
    for (let round = 1; round <= rounds; round++) {
      for (const v of round % 2 === 1 ? variants : [...variants].reverse()) {
        if (v !== "off") {
          await drop()
          for (const s of layouts[v]!) await sql.unsafe(s)
        }
        await fill(segment)
        await sql`vacuum jobs`
        await sql`select public.pg_stat_statements_reset()`
        const [w0] = await sql<Array<{ lsn: string }>>`select pg_current_wal_lsn()::text as lsn`
        const r = await drain(v === "off" ? 0 : 7 * 86_400_000)
        const [w] = await sql<Array<{ bytes: string }>>`select pg_wal_lsn_diff(pg_current_wal_lsn(), ${w0!.lsn}::pg_lsn)::text as bytes`
        const [st] = await sql<Array<{ mean: number }>>`
          select coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0)::float8 as mean from public.pg_stat_statements
          where query like '%with input as%'`
        const row = { perSec: r.done / (r.ms / 1000), walPerJob: Number(w!.bytes) / r.done, settleMs: st!.mean }
        ;(results[v] ??= []).push(row)
        log(`round ${round} ${v}: ${Math.round(row.perSec)} jobs/s, settle ${row.settleMs.toFixed(2)} ms, WAL ${Math.round(row.walPerJob)} B/job, load ${Os.loadavg()[0]!.toFixed(1)}`)
      }
    }
    const off = median(results.off!.map((r) => r.perSec))
    for (const v of variants) {
      const rs = results[v]!
      const p = median(rs.map((r) => r.perSec))
      log(`${v}: ${Math.round(p)} jobs/s (${((p / off) * 100).toFixed(0)} % of off), settle ${median(rs.map((r) => r.settleMs)).toFixed(2)} ms, ` +
        `WAL ${Math.round(median(rs.map((r) => r.walPerJob)))} B/job`)
    }
    await sql.end({ timeout: 5 })
  } finally {
    await cluster.dropDatabase(name)
    await cluster.close()
  }
}

;(args.includes("--drains") ? drains() : main()).catch((e) => {
  console.error(e)
  process.exit(1)
})
