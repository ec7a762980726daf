/**
 * `npm run soak -- --jobs N`: a long drain, read over time. Four worker processes (concurrency 10 each, an async
 * no-op handler, fairness on across 10 orgs, the history kept for the default 7 days) drain N jobs that two
 * producers enqueue: a bulk producer (1,000 jobs per call, keeping a backlog of about 20,000) and a steady one
 * (single jobs, 200/s). Every interval (10 s; `--interval`) it prints and records:
 *
 * - the drain: completions per second in the interval, and the backlog (jobs not yet completed);
 * - sizes: `jobs` (heap, indexes, and of those the payload index `jobs_payload`), the history (`jobs_archive`,
 *   every partition), the event log (`job_events`);
 * - dead tuples in each, and how many times autovacuum (and autoanalyze) ran on each so far;
 * - WAL written in the interval (MB/s);
 * - the claim statement's round trip, p50 and p99, as the workers' pools waited for it (a tracer in each worker
 *   times the `Queue.claim` span).
 *
 * Flat means the last third of the intervals the bulk producer ran through drains and claims like the first third, or,
 * when most of those intervals were not saturated (fewer jobs waiting at an end than the workers can hold), that the
 * workers kept up with the producer to the end; the summary gives both ratios. `--ci` (100,000 jobs unless `--jobs`) fails
 * if a job is lost, runs twice, dead-letters, or is missing from the history, if a worker crashes, or if the
 * last third, saturated, drains below half the first third's rate (a loose bound: the machine is shared; a queue whose claim
 * grows with its history would fall far below it). `--drop-rows R` also drops a partition of R expired history
 * rows mid-run (below). `--json PATH` writes the summary (default, outside CI: bench/results/soak-latest.json).
 *
 * The workers run pgfiber's housekeeping stage and its schedules as a deployment does (`--no-housekeeping`: without), so the payload index's
 * rebuild (`pgfiber.payload-index`) happens in the run: the summary gives `jobs`' indexes in the first and last
 * thirds of the samples, their largest, and the rebuilds seen (the index's file changed between two samples).
 * That is reported, not checked: when a rebuild falls depends on the wall clock's cron ticks, not on the run.
 */
import { Effect, Layer, ManagedRuntime, Redacted } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import { maxAheadFor } from "../packages/pgfiber/src/runtime/pool/Core.js"
import { benchDir, compileWorker, connect, log, median, option, percentile, sleep, spawnWorker, startCluster, type WorkerChild, writeFailedRun } from "./lib.js"
import type { SoakWorkerConfig } from "./soakWorker.js"

const args = process.argv.slice(2)
const ci = args.includes("--ci")
const jsonPath = option("json")
const totalJobs = Number(option("jobs") ?? 100_000)
// CI: every half second, so a fast drain of 100,000 jobs (10,000 jobs/s on a quiet 2-core machine) still gives enough
// saturated intervals to judge flatness by (5 s intervals left none once four processes claimed without contention)
const intervalMs = Number(option("interval") ?? (ci ? 0.5 : 10)) * 1000
const workersN = Number(option("workers") ?? 4)
const concurrency = Number(option("concurrency") ?? 10)
const steadyRate = Number(option("steady-rate") ?? 200)
const orgs = Number(option("orgs") ?? 10)
/**
 * `--drop-rows R`: before the run, R expired history rows in a partition of their own (a day 30 days ahead, so
 * no real row shares it; the workers then keep history 60 days so their rows never expire within the test's
 * clock), dropped `--drop-at-s` seconds into the run (60 by default) as housekeeping drops an expired
 * partition: the drain in that interval against the saturated intervals around it.
 */
const dropRows = Number(option("drop-rows") ?? 0)
const dropAtS = Number(option("drop-at-s") ?? 60)
/**
 * Shortcuts for a short run, labelled as such in the summary: `--payload-index-cron "* * * * *"` checks the payload
 * index every minute instead of on the code's schedule; `--payload-index-min-mb M` lowers its 64 MiB floor (the
 * index must still be larger than the `jobs` table). Both change the `pgfiber.payload-index` schedule's row as an
 * operator could.
 */
const payloadIndexCron = option("payload-index-cron")
// whole MB: the task's payload takes an integer (a fraction would make every worker's schedule declaration fail)
const payloadIndexMinMB = option("payload-index-min-mb") === undefined ? undefined : Math.floor(Number(option("payload-index-min-mb")))
/**
 * The workers run pgfiber's housekeeping stage and its schedules (the payload index's rebuild among them), as
 * `pgfiber start` does; `--no-housekeeping` leaves them out (the shortcuts below change a housekeeping schedule, so
 * they need it). Until 2026-11-28 a worker with housekeeping drained the CI-sized soak ~30 % slower: the Waker's
 * timer woke the idle housekeeping pool for the soak's backlog, again and again (docs/benchmarks.md).
 */
const housekeeping = !args.includes("--no-housekeeping")
if (!housekeeping && (payloadIndexCron !== undefined || payloadIndexMinMB !== undefined)) {
  console.error("--payload-index-cron and --payload-index-min-mb change a housekeeping schedule: drop --no-housekeeping")
  process.exit(2)
}
/**
 * `--payload-values K` (a shortcut too): each job's payload holds K values of its own instead of one, so the payload
 * index grows K times as fast and passes the table within a short run, as it does after ~3M jobs in the 10M run.
 */
const payloadValues = Number(option("payload-values") ?? 1)
/**
 * `--autovacuum-naptime S` (a shortcut too): the server's autovacuum naptime (60 s by default). The index is rebuilt
 * only once larger than the table's heap, and a short run's heap is set by the dead rows of the minutes before its
 * first autovacuum (450 MB in a 600,000-job run), which it never gives back while draining.
 */
const autovacuumNaptimeS = option("autovacuum-naptime")
const payloadIndexShortcut = payloadIndexCron !== undefined || payloadIndexMinMB !== undefined || payloadValues !== 1 ||
  autovacuumNaptimeS !== undefined
const bulkBatch = 1_000
const bulkBacklog = 20_000
/**
 * `--bulk-calls K`: the bulk producer's calls in flight (1). On two cores one call at a time enqueues about what four
 * workers drain (~4,000 jobs/s), so few intervals are saturated; with 2 the producer outruns them at first, then takes
 * the CPU they had, and the drain falls from ~8,000 to ~5,000 jobs/s for no reason of the queue's.
 */
const bulkCalls = Number(option("bulk-calls") ?? 1)
/**
 * An interval is saturated when at least this many jobs waited at its start and at its end: half again
 * what the workers can hold (running and claimed ahead). Below that their claims come back short and the drain is
 * the backlog's, not the queue's: with 1,000, the CI run's last third was the producer's tail (2,000–3,000 jobs/s at
 * 1,000–2,000 waiting, against 9,000–11,000 early on) and the check failed a healthy run.
 */
const saturatedBacklog = Math.ceil(1.5 * workersN * (concurrency + maxAheadFor(concurrency)))
const schema = "pgfiber"
const stage = "soak"
/** CI's bound: a saturated last third drains at least this share of the first third's rate. */
const flatShare = 0.5

interface Sample {
  readonly atS: number
  readonly enqueued: number
  readonly completed: number
  readonly drainPerSec: number
  readonly backlog: number
  readonly saturated: boolean
  /** The bulk producer ran at the interval's start and at its end (not the steady producer's tail alone). */
  readonly producing: boolean
  readonly walMBPerSec: number
  readonly claimP50Ms: number
  readonly claimP99Ms: number
  readonly claims: number
  readonly tables: Record<"jobs" | "archive" | "events", TableStats>
  readonly partitions: number
  /** `jobs_payload` alone (null: no such index), and whether its file changed since the last sample: a rebuild. */
  readonly payloadIndexMB: number | null
  readonly payloadIndexRebuilt: boolean
}

interface TableStats {
  readonly heapMB: number
  readonly indexMB: number
  readonly live: number
  readonly dead: number
  readonly autovacuums: number
  readonly autoanalyzes: number
}

const mb = (bytes: number) => Math.round(bytes / 1048576 * 10) / 10

/** One table's (or a partitioned table's leaves') sizes and vacuum counters. */
const tableStats = async (sql: ReturnType<typeof connect>, table: string): Promise<TableStats> => {
  const [row] = await sql<Array<{ heap: string; idx: string; live: string; dead: string; av: string; aa: string }>>`
    with leaves as (
      -- a partitioned table's partitions, or the plain table itself
      select relid from pg_partition_tree(${`${schema}.${table}`}::regclass) where isleaf
      union
      select c.oid from pg_class c where c.oid = ${`${schema}.${table}`}::regclass and c.relkind = 'r'
    )
    select coalesce(sum(pg_relation_size(l.relid)), 0)::text as heap, coalesce(sum(pg_indexes_size(l.relid)), 0)::text as idx,
           coalesce(sum(s.n_live_tup), 0)::text as live, coalesce(sum(s.n_dead_tup), 0)::text as dead,
           coalesce(sum(s.autovacuum_count), 0)::text as av, coalesce(sum(s.autoanalyze_count), 0)::text as aa
    from leaves l left join pg_stat_user_tables s on s.relid = l.relid`
  return {
    heapMB: mb(Number(row!.heap)),
    indexMB: mb(Number(row!.idx)),
    live: Number(row!.live),
    dead: Number(row!.dead),
    autovacuums: Number(row!.av),
    autoanalyzes: Number(row!.aa)
  }
}

const cleanups: Array<() => Promise<unknown>> = []
const cleanUp = async () => {
  for (const f of cleanups.splice(0).reverse()) await f().catch(() => undefined)
}

const main = async () => {
  const started = Date.now()
  log(`soak${ci ? " (CI)" : ""}: ${totalJobs} jobs, ${workersN} worker processes × concurrency ${concurrency}, fairness on across ${orgs} orgs, history kept, ${housekeeping ? "housekeeping running" : "no housekeeping (--no-housekeeping)"}; bulk producer ${bulkBatch}/call (backlog ~${bulkBacklog}), steady producer ${steadyRate}/s; every ${intervalMs / 1000} s`)
  const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-soak-pg-"))
  const cluster = await startCluster({
    dataDir,
    flags: ["-c", "max_connections=100", ...(autovacuumNaptimeS === undefined ? [] : ["-c", `autovacuum_naptime=${autovacuumNaptimeS}s`])]
  })
  cleanups.push(() => cluster.close())
  const url = await cluster.createDatabase("soak")
  log(`postgres ${cluster.version} on port ${cluster.port}`)
  const runtime = ManagedRuntime.make(PgQueue.layer().pipe(Layer.provideMerge(Db.layerWith({ url: Redacted.make(url), schema, poolMax: 6, applicationName: "soak-producer" }))))
  cleanups.push(() => runtime.dispose())
  await runtime.runPromise(Migrations.migrate())
  const monitor = connect(url, { max: 1, schema, app: "soak-monitor" })
  cleanups.push(() => monitor.end({ timeout: 5 }))

  if (dropRows > 0) {
    await monitor`select archive_create_partitions(interval '1 day', interval '1 day', now() + interval '30 days')`
    for (let done = 0; done < dropRows; done += 100_000) {
      await monitor`
        insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, finished_at, keep_until)
        select -(${done}::int + g), 'soak_expired', jsonb_build_object('n', g), 50, 'completed', 1, 5, t, t, t + interval '1 hour'
        from generate_series(1, ${Math.min(100_000, dropRows - done)}::int) g,
             lateral (select date_trunc('day', now() + interval '30 days') + interval '1 hour' as t) x`
    }
    await monitor`vacuum analyze jobs_archive`
    // the workers' rows must outlive the clock the drop is run at
    process.env.PGFIBER_RETAIN_COMPLETED = "60 days"
    log(`${dropRows} expired history rows in their own partition, to be dropped at ${dropAtS} s`)
  }
  const compiled = await compileWorker("soakWorker.ts")
  const crashes: Array<string> = []
  let stopping = false
  const completedBy = new Map<string, number>()
  let claimMs: Array<number> = []
  const workers: Array<WorkerChild> = []
  for (let i = 1; i <= workersN; i++) {
    const id = `soak-w${i}`
    const payloadIndex = payloadIndexShortcut ? { cron: payloadIndexCron, minMB: payloadIndexMinMB } : undefined
    const child = spawnWorker("soakWorker.ts", { url, schema, workerId: id, stage, concurrency, payloadIndex, housekeeping, reportMs: Math.min(1000, intervalMs / 5) } satisfies SoakWorkerConfig, { compiled })
    child.onMessage((m) => {
      if (m.t === "metrics") completedBy.set(id, m.completed)
      if (m.t === "claims") claimMs.push(...m.ms)
    })
    void child.exited.then((code) => {
      if (!stopping) crashes.push(`${id} exited with ${code}: ${child.stderrTail().slice(-600)}`)
    })
    workers.push(child)
  }
  cleanups.push(() => Promise.all(workers.map((w) => w.stop(10_000))))
  for (const w of workers) {
    if ((await w.waitFor("ready", 120_000)) === null) throw new Error(`a worker did not start: ${w.stderrTail()}`)
  }
  const completed = () => [...completedBy.values()].reduce((a, b) => a + b, 0)

  // the producers share one count, so together they enqueue exactly `totalJobs`
  let enqueued = 0
  let enqueueFailures = 0
  const enqueue = (jobs: ReadonlyArray<Queue.NewJob>) =>
    runtime.runPromise(Effect.flatMap(Queue.Queue, (q) => q.enqueue(jobs))).catch((e: unknown) => {
      enqueueFailures++
      log(`enqueue failed: ${e instanceof Error ? e.message : String(e)}`)
    })
  const payload = (n: number) => {
    const p: Record<string, number> = { n }
    for (let k = 1; k < payloadValues; k++) p[`v${k}`] = n * payloadValues + k
    return p
  }
  const job = (n: number): Queue.NewJob => ({ stage, orgId: `org-${n % orgs}`, payload: payload(n) })
  let bulkDone = false
  const bulkLoop = async () => {
    while (totalJobs - enqueued >= bulkBatch * 2) {
      if (enqueued - completed() >= bulkBacklog) {
        await sleep(50)
        continue
      }
      const first = enqueued
      enqueued += bulkBatch
      await enqueue(Array.from({ length: bulkBatch }, (_, i) => job(first + i)))
    }
  }
  const bulk = Promise.all(Array.from({ length: bulkCalls }, bulkLoop))
  const steady = (async () => {
    const periodMs = 1000 / steadyRate
    const t0 = Date.now()
    const inFlight = new Set<Promise<unknown>>()
    for (let seq = 0; enqueued < totalJobs; seq++) {
      const waitMs = t0 + seq * periodMs - Date.now()
      if (waitMs > 0) await sleep(waitMs)
      // the bulk producer keeps the last two batches' worth for this one; past that it waits for bulk to stop
      if (totalJobs - enqueued <= bulkBatch * 2 && !bulkDone) {
        await sleep(10)
        continue
      }
      const n = enqueued++
      const p = enqueue([job(n)]).finally(() => inFlight.delete(p))
      inFlight.add(p)
      if (inFlight.size >= 50) await Promise.race(inFlight)
    }
    await Promise.all(inFlight)
  })()
  void bulk.then(() => (bulkDone = true))

  const samples: Array<Sample> = []
  const t0 = Date.now()
  let lastAt = t0
  let lastCompleted = 0
  let [walRow] = await monitor<Array<{ wal: string }>>`select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text as wal`
  let lastWal = Number(walRow!.wal)
  let producing = true
  let lastBacklog = 0
  let lastBulkActive = true
  let lastPayloadFile: string | null = null
  void Promise.all([bulk, steady]).then(() => (producing = false))
  const deadlineMs = Math.max(600_000, totalJobs * 5)
  let drop: { atS: number; ms: number; dropped: ReadonlyArray<string>; sample: number } | null = null
  const dropper = connect(url, { max: 1, schema, app: "soak-housekeeping" })
  cleanups.push(() => dropper.end({ timeout: 5 }))
  const dropping = dropRows === 0 ? Promise.resolve() : (async () => {
    await sleep(dropAtS * 1000 - (Date.now() - t0))
    const atS = (Date.now() - t0) / 1000
    const d0 = Date.now()
    const rows = await dropper<Array<{ name: string }>>`
      select name from archive_drop_expired_partitions(date_trunc('day', now() + interval '30 days') + interval '1 day 2 hours') as name`
    drop = { atS, ms: Date.now() - d0, dropped: rows.map((r) => r.name), sample: samples.length }
    log(`dropped ${drop.dropped.join(", ") || "nothing"} in ${drop.ms} ms at ${atS.toFixed(1)} s`)
  })()
  const header = "    t s  enqueued  done/s  backlog | jobs MB (idx)  dead  av | payload idx MB | archive MB (idx)  dead  av | events MB  dead  av | WAL MB/s | claim p50/p99 ms"
  log(header)
  for (;;) {
    await sleep(intervalMs - ((Date.now() - t0) % intervalMs))
    const now = Date.now()
    const done = completed()
    ;[walRow] = await monitor<Array<{ wal: string }>>`select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::text as wal`
    const wal = Number(walRow!.wal)
    const [jobs, archive, events] = await Promise.all([tableStats(monitor, "jobs"), tableStats(monitor, "jobs_archive"), tableStats(monitor, "job_events")])
    const [parts] = await monitor<Array<{ n: number }>>`select count(*)::int as n from pg_partition_tree(${`${schema}.jobs_archive`}::regclass) where isleaf`
    // REINDEX CONCURRENTLY builds a new index under the old name: its file is another
    const [payloadIdx] = await monitor<Array<{ bytes: string | null; file: string | null }>>`
      select pg_relation_size(to_regclass(${`${schema}.jobs_payload`}))::text as bytes,
             pg_relation_filenode(to_regclass(${`${schema}.jobs_payload`}))::text as file`
    const payloadFile = payloadIdx!.file
    const claims = claimMs
    claimMs = []
    const seconds = (now - lastAt) / 1000
    const sample: Sample = {
      atS: Math.round((now - t0) / 100) / 10,
      enqueued,
      completed: done,
      drainPerSec: Math.round((done - lastCompleted) / seconds),
      backlog: enqueued - done,
      // the workers had a backlog to drain throughout: at the interval's start and at its end
      saturated: lastBacklog >= saturatedBacklog && enqueued - done >= saturatedBacklog,
      producing: lastBulkActive && !bulkDone,
      walMBPerSec: mb((wal - lastWal) / seconds),
      claimP50Ms: Math.round(percentile(claims, 50) * 100) / 100,
      claimP99Ms: Math.round(percentile(claims, 99) * 100) / 100,
      claims: claims.length,
      tables: { jobs, archive, events },
      partitions: parts!.n,
      payloadIndexMB: payloadIdx!.bytes === null ? null : mb(Number(payloadIdx!.bytes)),
      payloadIndexRebuilt: lastPayloadFile !== null && payloadFile !== null && payloadFile !== lastPayloadFile
    }
    samples.push(sample)
    const t = (s: TableStats) => `${s.heapMB.toFixed(1).padStart(7)} (${s.indexMB.toFixed(1)}) ${String(s.dead).padStart(6)} ${String(s.autovacuums).padStart(3)}`
    const payloadCell = `${(sample.payloadIndexMB ?? Number.NaN).toFixed(1).padStart(8)}${sample.payloadIndexRebuilt ? " rebuilt" : "        "}`
    log(`${sample.atS.toFixed(0).padStart(7)} ${String(enqueued).padStart(9)} ${String(sample.drainPerSec).padStart(7)} ${String(sample.backlog).padStart(8)} | ${t(jobs)} | ${payloadCell} | ${t(archive)} | ${events.heapMB.toFixed(1).padStart(9)} ${String(events.dead).padStart(6)} ${String(events.autovacuums).padStart(3)} | ${sample.walMBPerSec.toFixed(1).padStart(8)} | ${sample.claimP50Ms.toFixed(1)}/${sample.claimP99Ms.toFixed(1)}`)
    lastAt = now
    lastCompleted = done
    lastWal = wal
    lastBacklog = sample.backlog
    lastBulkActive = !bulkDone
    lastPayloadFile = payloadFile ?? lastPayloadFile
    if (!producing && done >= totalJobs) break
    if (crashes.length > 0 || now - t0 > deadlineMs) break
  }
  const elapsedS = (Date.now() - t0) / 1000
  await dropping

  // the books: every job ran once, none is left, every one is in the history
  // (housekeeping's own jobs share the tables: only the soak's stage is counted)
  const [books] = await monitor<Array<{ live: number; archived: number; distinct_ids: number; completed: number; dead: number }>>`
    select (select count(*)::int from jobs where stage = ${stage}) as live,
           (select count(*)::int from jobs_archive where stage = ${stage}) as archived,
           (select count(distinct id)::int from jobs_archive where stage = ${stage}) as distinct_ids,
           (select count(*)::int from jobs_archive where stage = ${stage} and status = 'completed') as completed,
           (select count(*)::int from dead_letters where stage = ${stage}) as dead`
  // the payload index's checks that ran (each a housekeeping job, kept in the history), and housekeeping's failures
  const [upkeep] = await monitor<Array<{ checks: number; dead: number }>>`
    select (select count(*)::int from jobs_archive where stage = 'pgfiber.housekeeping' and status = 'completed'
              and payload->>'task' = 'payload-index') as checks,
           (select count(*)::int from dead_letters where stage = 'pgfiber.housekeeping') as dead`
  stopping = true

  // flatness, over the intervals the bulk producer ran through, all but the first (workers warming up) and the last.
  // While it runs the drain is the queue's rate or the producer's, whichever is lower, and which one it is depends on
  // how they share the machine's cores: a CI run whose producer enqueued as fast as four workers drained had no
  // saturated interval at all (the check failed on none), and an earlier one set the first third's drain of the first
  // backlog (9,000–11,000 jobs/s) against the last third's producer (2,000–3,000). So the last third is judged by the
  // queue's rate only where the queue set it: when most of its intervals are saturated, their median drain must be at
  // least `flatShare` of the first third's. When most are not, the workers kept up with the producer to the end, which
  // a queue slowed by its history would not: its backlog would grow until it saturated them.
  const judged = samples.filter((s) => s.producing).slice(1, -1)
  const third = Math.max(1, Math.floor(judged.length / 3))
  const firstThird = judged.slice(0, third)
  const lastThird = judged.slice(-third)
  const lastSaturated = lastThird.filter((s) => s.saturated)
  const queueBound = lastSaturated.length * 2 > lastThird.length
  const drainFirst = median(firstThird.map((s) => s.drainPerSec))
  const drainLast = median((queueBound ? lastSaturated : lastThird).map((s) => s.drainPerSec))
  const drainShare = drainLast / drainFirst
  const claimP99First = median(firstThird.map((s) => s.claimP99Ms))
  const claimP99Last = median(lastThird.map((s) => s.claimP99Ms))
  const lastMaxWaiting = Math.max(0, ...lastThird.map((s) => s.backlog))
  const lastThirdDetail = queueBound
    ? `the last third saturated (${lastSaturated.length} of ${lastThird.length} intervals): the queue's rate`
    : `the last third kept up with the producer (${lastSaturated.length} of ${lastThird.length} intervals saturated, at most ${lastMaxWaiting} waiting)`
  const totalCompleted = completed()
  const checks = [
    { name: "every job enqueued", ok: enqueued === totalJobs && enqueueFailures === 0, detail: `${enqueued}/${totalJobs}, ${enqueueFailures} failed enqueue call(s)` },
    { name: "every job completed once and kept in the history", ok: books!.live === 0 && books!.completed === totalJobs && books!.archived === totalJobs && books!.distinct_ids === totalJobs && books!.dead === 0, detail: `${books!.completed} completed in the history (${books!.distinct_ids} distinct ids of ${books!.archived} rows), ${books!.live} left in jobs, ${books!.dead} dead letters, workers counted ${totalCompleted}` },
    { name: "no worker crashed", ok: crashes.length === 0, detail: crashes.length === 0 ? "0 crashes" : crashes.join("; ") },
    { name: `the drain stays flat: the last third of the run drains ≥ ${flatShare * 100} % of the first third's rate or keeps up with the producer`, ok: judged.length >= 3 && (!queueBound || drainShare >= flatShare), detail: `${drainFirst} → ${drainLast} jobs/s (${(drainShare * 100).toFixed(0)} %) over ${judged.length} intervals; ${lastThirdDetail}` }
  ]
  // the interval the drop fell in, against the saturated intervals up to three either side of it
  const dropDone = drop as { atS: number; ms: number; dropped: ReadonlyArray<string>; sample: number } | null
  const dropEffect = dropDone === null ? null : (() => {
    const during = samples[dropDone.sample]
    const around = samples.slice(Math.max(0, dropDone.sample - 3), dropDone.sample + 4)
      .filter((s) => s !== during && s.saturated && samples.indexOf(s) > 0)
    const aroundPerSec = median(around.map((s) => s.drainPerSec))
    return {
      ...dropDone,
      rowsDropped: dropRows,
      duringPerSec: during?.drainPerSec ?? null,
      duringSaturated: during?.saturated ?? false,
      aroundPerSec,
      share: during ? Math.round(during.drainPerSec / aroundPerSec * 100) / 100 : null
    }
  })()
  // `jobs`' indexes over the run, every sample (not only the saturated ones: the index grows with the jobs done)
  const sampleThird = Math.max(1, Math.floor(samples.length / 3))
  const indexMB = samples.map((s) => s.tables.jobs.indexMB)
  const payloadMB = samples.map((s) => s.payloadIndexMB ?? 0)
  const tenth = (x: number) => Math.round(x * 10) / 10
  const rebuiltAtS = samples.filter((s) => s.payloadIndexRebuilt).map((s) => s.atS)
  const jobsIndexes = {
    firstThirdMB: tenth(median(indexMB.slice(0, sampleThird))),
    lastThirdMB: tenth(median(indexMB.slice(-sampleThird))),
    maxMB: Math.max(...indexMB),
    payloadFirstThirdMB: tenth(median(payloadMB.slice(0, sampleThird))),
    payloadLastThirdMB: tenth(median(payloadMB.slice(-sampleThird))),
    payloadMaxMB: Math.max(...payloadMB),
    rebuilds: rebuiltAtS.length,
    rebuiltAtS,
    checksRun: upkeep!.checks,
    housekeepingDeadLetters: upkeep!.dead,
    shortcut: payloadIndexShortcut ? { cron: payloadIndexCron ?? null, minMB: payloadIndexMinMB ?? null, payloadValues, autovacuumNaptimeS: autovacuumNaptimeS === undefined ? null : Number(autovacuumNaptimeS) } : null
  }
  const passed = checks.filter((c) => c.ok).length
  const last = samples.at(-1)!
  const summary = {
    numPassedTests: passed,
    numFailedTests: checks.length - passed,
    numTotalTests: checks.length,
    success: passed === checks.length,
    ci,
    jobs: totalJobs,
    workers: workersN,
    concurrency,
    orgs,
    steadyRate,
    bulkBatch,
    postgres: cluster.version,
    machine: { cpus: Os.cpus().length, loadAverage: Os.loadavg().map((x) => Math.round(x * 10) / 10) },
    elapsedSeconds: Math.round(elapsedS * 10) / 10,
    averageDrainPerSec: Math.round(totalCompleted / elapsedS),
    flatness: {
      intervals: judged.length,
      saturatedBacklog,
      drainFirstThird: drainFirst,
      drainLastThird: drainLast,
      drainShare: Math.round(drainShare * 100) / 100,
      lastThird: { intervals: lastThird.length, saturated: lastSaturated.length, queueBound, maxWaiting: lastMaxWaiting },
      claimP99FirstThirdMs: claimP99First,
      claimP99LastThirdMs: claimP99Last
    },
    jobsIndexes,
    walTotalMB: mb(samples.reduce((a, s) => a + s.walMBPerSec * intervalMs / 1000 * 1048576, 0)),
    end: { ...last.tables, partitions: last.partitions },
    partitionDrop: dropEffect,
    checks,
    samples
  }
  const lines = [
    "",
    `soak ${summary.success ? "PASSED" : "FAILED"}${ci ? " (CI)" : ""}: ${totalJobs} jobs in ${summary.elapsedSeconds} s (${summary.averageDrainPerSec} jobs/s on average)`,
    `  drain, first → last third of the intervals the producers ran through: ${drainFirst} → ${drainLast} jobs/s (${(drainShare * 100).toFixed(0)} %; ${lastThirdDetail}); claim p99 ${claimP99First} → ${claimP99Last} ms`,
    `  at the end: jobs ${last.tables.jobs.heapMB} MB + ${last.tables.jobs.indexMB} MB indexes (${last.tables.jobs.autovacuums} autovacuums); history ${last.tables.archive.heapMB} MB + ${last.tables.archive.indexMB} MB in ${last.partitions} partitions; events ${last.tables.events.heapMB} MB; WAL ${summary.walTotalMB} MB`,
    `  jobs' indexes, first → last third of the samples: ${jobsIndexes.firstThirdMB} → ${jobsIndexes.lastThirdMB} MB (largest ${jobsIndexes.maxMB} MB); the payload index ${jobsIndexes.payloadFirstThirdMB} → ${jobsIndexes.payloadLastThirdMB} MB (largest ${jobsIndexes.payloadMaxMB} MB), rebuilt ${jobsIndexes.rebuilds} time(s)${jobsIndexes.rebuilds > 0 ? ` (at ${jobsIndexes.rebuiltAtS.join(", ")} s)` : ""} in ${jobsIndexes.checksRun} check(s); ${jobsIndexes.housekeepingDeadLetters} housekeeping dead letter(s)`,
    ...(jobsIndexes.shortcut === null ? [] : [
      `  (shortcuts for a short run, not the defaults: the payload-index schedule ${jobsIndexes.shortcut.cron ?? "as in code"}, minMB ${jobsIndexes.shortcut.minMB ?? "as in code"}, ${jobsIndexes.shortcut.payloadValues} payload value(s) per job, autovacuum naptime ${jobsIndexes.shortcut.autovacuumNaptimeS ?? 60} s)`
    ]),
    ...(dropEffect === null ? [] : [
      `  partition drop (${dropRows} expired rows) at ${dropEffect.atS.toFixed(0)} s took ${dropEffect.ms} ms: the drain in its interval ${dropEffect.duringPerSec} jobs/s against ${dropEffect.aroundPerSec} around it (${((dropEffect.share ?? 0) * 100).toFixed(0)} %${dropEffect.duringSaturated ? "" : ", not a saturated interval"})`
    ]),
    ...checks.map((c) => `  ${c.ok ? "✓" : "✗"} ${c.name}: ${c.detail}`),
    ""
  ]
  process.stdout.write(lines.join("\n"))
  const out = jsonPath ?? (ci ? undefined : Path.join(benchDir, "results", "soak-latest.json"))
  if (out) {
    Fs.mkdirSync(Path.dirname(Path.resolve(out)), { recursive: true })
    Fs.writeFileSync(out, JSON.stringify(summary, null, 2) + "\n")
  }
  await cleanUp()
  log(`soak: ${((Date.now() - started) / 1000).toFixed(0)} s in all`)
  process.exitCode = summary.success ? 0 : 1
}

await main().catch(async (e) => {
  log(`soak: the run itself failed: ${e instanceof Error ? e.stack : String(e)}`)
  await cleanUp()
  writeFailedRun(jsonPath, e)
  process.exit(1)
})
