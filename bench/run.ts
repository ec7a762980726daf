/**
 * `npm run bench`: one embedded PostgreSQL, every subject on a fresh database per run, the same workloads
 * interleaved (A B C D, A B C D, …), medians of the runs. Writes bench/results/latest.{json,md}.
 *
 * Flags: --runs N (3) · --quick (1 run, small sizes: a smoke test) · --render
 *        --only bulk,steady,latency,idle,backlog,history,fairness,raw,dashboards
 *               (opt-in, not in the default set: bulk-cancel, search: pgfiber's bulk actions and search, docs/benchmarks.md)
 *        --handlers async,io,sync (the bulk drain's handlers) · --rates 100,300 (the steady workload's jobs/s)
 *        --subjects pgfiber,pgfiber-noretain,graphile,graphile-batched,pgboss
 *        --profile (CPU-profile pgfiber's worker in its first bulk drain with each handler, and at the highest steady rate)
 *        --out DIR (bench/results)
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { benchDir, log, machineInfo, median, msSince, nowNs, option, packageVersion, startCluster } from "./lib.js"
import * as Dashboards from "./dashboards.js"
import { all as allSubjects } from "./subjects/index.js"
import * as PgBoss from "./subjects/pgboss.js"
import * as Pgfiber from "./subjects/pgfiber.js"
import { type HandlerKind, ioJobMs, type Subject } from "./subjects/types.js"
import * as W from "./workloads.js"

const args = process.argv.slice(2)
const flag = (name: string) => args.includes(`--${name}`)

const quick = flag("quick")
const runs = Number(option("runs") ?? (quick ? 1 : 3))
const only = new Set((option("only") ?? "bulk,steady,latency,idle,backlog,history,fairness,raw,dashboards").split(","))
const handlerKinds: ReadonlyArray<HandlerKind> = ["async", "io", "sync"]
const handlers = (option("handlers")?.split(",") ?? handlerKinds).filter((h): h is HandlerKind => handlerKinds.includes(h as HandlerKind))
const rates = (option("rates") ?? "100,300").split(",").map(Number)
const outDir = Path.resolve(option("out") ?? Path.join(benchDir, "results"))
// CPU profiles are large and machine-specific: kept out of the repository (.data is ignored)
const profileDir = Path.join(benchDir, "..", ".data", "bench-profiles")
const sizes = {
  bulkJobs: quick ? 5_000 : 20_000,
  batchSize: 1_000,
  /** The bulk drain's concurrency with I/O-bound jobs (10 with the others): its bound is ioConcurrency × 1000 / ioJobMs jobs/s. */
  ioConcurrency: 100,
  ioJobMs,
  steadyWarmupMs: quick ? 2_000 : 5_000,
  steadyWindowMs: quick ? 8_000 : 30_000,
  latencyJobs: quick ? 50 : 200,
  spacingMs: 20,
  idleWindowMs: quick ? 10_000 : 30_000,
  idleWarmMs: 3_000,
  backlogSmall: 10_000,
  backlogLarge: quick ? 100_000 : 1_000_000,
  backlogWindowMs: 10_000,
  fairQueued: quick ? 20_000 : 1_000_000,
  fairOrgs: quick ? 100 : 1_000,
  fairWindowMs: quick ? 5_000 : 10_000,
  idleRate: "1/10m",
  rawJobs: 20_000,
  dashboardWindowMs: quick ? 10_000 : 30_000,
  dashboardViewers: 20,
  /** Expired finished jobs pruned while a worker drains `bulkJobs` (kept history). */
  archivedToPrune: quick ? 50_000 : 1_000_000,
  /** Queued jobs of another stage bulk-cancelled by a payload filter (among as many that do not match) while a worker drains. */
  bulkCancel: quick ? 20_000 : 100_000,
  bulkCancelDrain: quick ? 300_000 : 600_000,
  bulkCancelAloneMs: 5_000,
  /** The backlog the search is timed at. */
  searchQueued: quick ? 100_000 : 1_000_000
}

const wanted = option("subjects")?.split(",")
const subjects = wanted ? allSubjects.filter((s) => wanted.includes(s.key)) : allSubjects
// the steady workload compares pgfiber with its peers; retention off adds nothing there
const steadySubjects = subjects.filter((s) => s.key !== Pgfiber.noRetention.key)

type Runs<T> = Record<string, Array<T | { error: string }>>
const ok = <T>(xs: ReadonlyArray<T | { error: string }> | undefined): Array<T> =>
  (xs ?? []).filter((x): x is T => !(typeof x === "object" && x !== null && "error" in x))

/** The 1-minute load average when each measurement started: this machine is shared, and it shows. */
const loads: Array<number> = []

const attempt = async <T>(what: string, f: () => Promise<T>): Promise<T | { error: string }> => {
  const t0 = nowNs()
  const load1 = Os.loadavg()[0]!
  loads.push(load1)
  try {
    const r = await f()
    log(`  ${what}: done in ${(msSince(t0) / 1000).toFixed(1)} s (load average ${load1.toFixed(1)} at start)`)
    if (typeof r === "object" && r !== null && !Array.isArray(r)) Object.assign(r, { load1AtStart: Math.round(load1 * 100) / 100 })
    return r
  } catch (e) {
    log(`  ${what}: FAILED: ${e instanceof Error ? e.message : String(e)}`)
    return { error: e instanceof Error ? e.message : String(e) }
  }
}

/** `--render`: rewrite latest.md from latest.json (after a change to the table's layout), without running. */
const renderOnly = () => {
  const results = JSON.parse(Fs.readFileSync(Path.join(outDir, "latest.json"), "utf8"))
  Fs.writeFileSync(Path.join(outDir, "latest.md"), render(results))
}

const main = async () => {
  const started = nowNs()
  log(`bench: ${runs} run(s), subjects ${subjects.map((s) => s.key).join(", ")}, workloads ${[...only].join(", ")}`)
  const cluster = await startCluster({
    flags: [
      "-c", "shared_preload_libraries=pg_stat_statements",
      "-c", "pg_stat_statements.track=top",
      "-c", "max_connections=200",
      "-c", "shared_buffers=512MB"
    ]
  })
  log(`postgres ${cluster.version} on port ${cluster.port}`)
  await W.compileSubjects(subjects)
  log(`workers compiled to plain JavaScript (.data/bench-build), run under plain node`)
  const machine = machineInfo(cluster.version)
  const bulk: Partial<Record<HandlerKind, Runs<W.BulkResult>>> = {}
  const steady: Record<string, Runs<W.SteadyResult>> = {}
  const latency: Runs<W.LatencyResult> = {}
  const idle: Runs<W.IdleResult> = {}
  const idleScheduled: Array<W.IdleResult | { error: string }> = []
  const idleRateLimited: Array<W.IdleResult | { error: string }> = []
  const fairness: Array<W.FairnessResult | { error: string }> = []
  const backlog: { small: Array<W.BacklogResult | { error: string }>; large: Array<W.BacklogResult | { error: string }> } = { small: [], large: [] }
  const history: {
    largeOn: Array<W.BacklogResult | { error: string }>
    largeOff: Array<W.BacklogResult | { error: string }>
    prune: Array<W.PruneResult | { error: string }>
  } = { largeOn: [], largeOff: [], prune: [] }
  const raw: Array<W.RawResult | { error: string }> = []
  const ioCeiling: Array<number | { error: string }> = []
  const dashboards: Array<Dashboards.DashboardsResult | { error: string }> = []
  const bulkActions: { cancel: Array<W.BulkCancelResult | { error: string }>; search: Array<W.SearchResult | { error: string }> } = { cancel: [], search: [] }
  const push = <T>(into: Runs<T>, key: string, value: T | { error: string }) => (into[key] ??= []).push(value)
  const rawRound = async (run: number) => {
    const r = await attempt(`raw SQL ceiling run ${run} (${sizes.rawJobs} jobs, pgfiber's statements without the runtime)`, () =>
      W.raw(cluster, run, { jobs: sizes.rawJobs }))
    if (!("error" in r)) {
      log(`    enqueue ${Math.round(r.enqueuePerSec)} · unbatched ${Math.round(r.unbatchedPerSec)} · batched×10 ${Math.round(r.batched10PerSec)} · batched×100 ${Math.round(r.batched100PerSec)} jobs/s`)
    }
    raw.push(r)
  }
  try {
    if (only.has("bulk")) {
      log(`== bulk: enqueue ${sizes.bulkJobs} in batches of ${sizes.batchSize}, then one worker drains; handlers ${handlers.join(", ")} ` +
        `(concurrency ${W.concurrency}, ${sizes.ioConcurrency} for io)`)
      for (let run = 1; run <= runs; run++) {
        for (const handler of handlers) {
          for (const s of subjects) {
            const execArgv = flag("profile") && s.key === "pgfiber" && run === 1
              ? ["--cpu-prof", "--cpu-prof-dir", profileDir, "--cpu-prof-name", `pgfiber-bulk-${handler}.cpuprofile`]
              : undefined
            const c = handler === "io" ? sizes.ioConcurrency : W.concurrency
            const r = await attempt(`bulk ${s.key} ${handler} handler run ${run}`, () =>
              W.bulk(cluster, s, run, { jobs: sizes.bulkJobs, batchSize: sizes.batchSize, handler, concurrency: c, ...(execArgv ? { execArgv } : {}) }))
            if (!("error" in r)) {
              log(`    enqueue ${Math.round(r.enqueuePerSec)} jobs/s · drain ${Math.round(r.drainPerSec)} jobs/s${r.capped ? ` (cut off at ${r.completed} done)` : ""} ` +
                `(${Math.round(r.drainAfterFirstJobPerSec)} from the first job) · ${r.claimsPer1kJobs.toFixed(1)} claims, ${r.settlesPer1kJobs.toFixed(1)} settles per 1k jobs · ` +
                `${r.statementsPerJob.toFixed(2)} statements/job · worker CPU ${r.workerCpuMsPer1kJobs.toFixed(0)} · server CPU ${r.serverCpuMsPer1kJobs.toFixed(0)} ms per 1k jobs`)
            }
            push(bulk[handler] ??= {}, s.key, r)
          }
          if (handler === "io") {
            const r = await attempt(`timer ceiling run ${run} (no queue)`, () => W.timerCeiling(sizes.bulkJobs, sizes.ioConcurrency, sizes.ioJobMs))
            if (typeof r === "number") log(`    the same timers with no queue: ${Math.round(r)} jobs/s`)
            ioCeiling.push(r)
          }
        }
        // the raw ceiling joins each round, so it is measured under the same conditions as the subjects
        if (only.has("raw")) await rawRound(run)
      }
    } else if (only.has("raw")) {
      for (let run = 1; run <= runs; run++) await rawRound(run)
    }
    if (only.has("steady")) {
      log(`== steady: single jobs from a producer process at ${rates.join(", ")} jobs/s, async handler, concurrency ${W.concurrency}; ` +
        `${sizes.steadyWindowMs / 1000} s window after ${sizes.steadyWarmupMs / 1000} s of warm-up`)
      for (let run = 1; run <= runs; run++) {
        for (const rate of rates) {
          for (const s of steadySubjects) {
            const execArgv = flag("profile") && s.key === "pgfiber" && run === 1 && rate === Math.max(...rates)
              ? ["--cpu-prof", "--cpu-prof-dir", profileDir, "--cpu-prof-name", `pgfiber-steady-${rate}.cpuprofile`]
              : undefined
            const r = await attempt(`steady ${rate}/s ${s.key} run ${run}`, () =>
              W.steady(cluster, s, run, { ratePerSec: rate, warmupMs: sizes.steadyWarmupMs, windowMs: sizes.steadyWindowMs, ...(execArgv ? { execArgv } : {}) }))
            if (!("error" in r)) {
              log(`    ${Math.round(r.handledPerSec)} jobs/s handled · worker CPU ${r.workerCpuMsPerJob.toFixed(2)} · server CPU ${r.serverCpuMsPerJob.toFixed(2)} ms/job · ` +
                `statements/job worker ${r.workerStatementsPerJob.toFixed(2)} (claims ${r.claimsPerJob.toFixed(2)}, settles ${r.settlesPerJob.toFixed(2)}), ` +
                `producer ${r.producerStatementsPerJob.toFixed(2)} · enqueue call p50 ${r.enqueueCallP50Ms.toFixed(2)}, p99 ${r.enqueueCallP99Ms.toFixed(2)} ms · p50 ${r.p50Ms.toFixed(2)} · p99 ${r.p99Ms.toFixed(2)} ms${r.missing ? ` · ${r.missing} missing` : ""}`)
            }
            push(steady[String(rate)] ??= {}, s.key, r)
          }
        }
      }
    }
    if (only.has("latency")) {
      log(`== latency: ${sizes.latencyJobs} single enqueues ${sizes.spacingMs} ms apart to an idle worker`)
      for (let run = 1; run <= runs; run++) {
        for (const s of subjects) {
          const r = await attempt(`latency ${s.key} run ${run}`, () =>
            W.latency(cluster, s, run, { jobs: sizes.latencyJobs, spacingMs: sizes.spacingMs }))
          if (!("error" in r)) log(`    p50 ${r.p50Ms.toFixed(2)} · p95 ${r.p95Ms.toFixed(2)} · p99 ${r.p99Ms.toFixed(2)} ms${r.missing ? ` · ${r.missing} missing` : ""}`)
          push(latency, s.key, r)
        }
      }
    }
    if (only.has("idle")) {
      log(`== idle: every subject's worker idles side by side for ${sizes.idleWindowMs / 1000} s`)
      for (let run = 1; run <= runs; run++) {
        const r = await attempt(`idle run ${run}`, () =>
          W.idle(cluster, subjects, run, { windowMs: sizes.idleWindowMs, warmMs: sizes.idleWarmMs }))
        for (const s of subjects) {
          const all = r as Record<string, W.IdleResult | { error: string }>
          const one: W.IdleResult | { error: string } = typeof all.error === "string" ? { error: all.error } : all[s.key] ?? { error: "missing" }
          if (!("error" in one)) log(`    ${s.key}: ${one.statementsPer10s.toFixed(1)} statements/10 s · ${one.connections} connections · ${one.rssMiB?.toFixed(0)} MiB`)
          push(idle, s.key, one)
        }
        if (subjects.some((s) => s.key === "pgfiber")) {
          const r = await attempt(`idle pgfiber with one schedule every minute, run ${run}`, () =>
            W.idleScheduled(cluster, Pgfiber.subject, run, { windowMs: sizes.idleWindowMs, warmMs: sizes.idleWarmMs }))
          if (!("error" in r)) log(`    pgfiber + 1 schedule/min, between ticks: ${r.statementsPer10s.toFixed(1)} statements/10 s`)
          idleScheduled.push(r)
          const rl = await attempt(`idle pgfiber with a rate-limited stage waiting (${sizes.idleRate}), run ${run}`, () =>
            W.idleRateLimited(cluster, Pgfiber.subject, run, { windowMs: sizes.idleWindowMs, warmMs: 10_000, rate: sizes.idleRate }))
          if (!("error" in rl)) log(`    pgfiber, rate-limited stage waiting: ${rl.statementsPer10s.toFixed(1)} statements/10 s`)
          idleRateLimited.push(rl)
        }
      }
    }
    if (only.has("backlog") && subjects.some((s) => s.key === "pgfiber")) {
      log(`== backlog: pgfiber drain rate, ${sizes.backlogSmall} vs ${sizes.backlogLarge} queued`)
      const dbs = await W.prepareBacklog(cluster, sizes.backlogLarge)
      for (let run = 1; run <= runs; run++) {
        const small = await attempt(`backlog ${sizes.backlogSmall} run ${run}`, () =>
          W.backlog(cluster, Pgfiber.subject, dbs.small, sizes.backlogSmall, null))
        if (!("error" in small)) log(`    ${Math.round(small.perSec)} jobs/s`)
        backlog.small.push(small)
        const large = await attempt(`backlog ${sizes.backlogLarge} run ${run}`, () =>
          W.backlog(cluster, Pgfiber.subject, dbs.large, sizes.backlogLarge, sizes.backlogWindowMs))
        if (!("error" in large)) log(`    ${Math.round(large.perSec)} jobs/s (${large.completed} in ${(large.windowMs / 1000).toFixed(1)} s)`)
        backlog.large.push(large)
      }
      await cluster.dropDatabase(dbs.small.name)
      await cluster.dropDatabase(dbs.large.name)
    }
    if (only.has("history") && subjects.some((s) => s.key === "pgfiber")) {
      log(`== history: the ${sizes.backlogLarge}-backlog drain with retention on vs off; pruning ${sizes.archivedToPrune} expired rows while draining`)
      const dbs = await W.prepareBacklog(cluster, sizes.backlogLarge)
      for (let run = 1; run <= runs; run++) {
        const pair = [["on", Pgfiber.subject, history.largeOn], ["off", Pgfiber.noRetention, history.largeOff]] as const
        // each goes first in every other run, each from a fresh checkpoint: the first drain after the backlog's fill
        // (or the last run's pruning) otherwise pays that write burst's checkpoint and full-page writes alone
        for (const [label, subject, into] of run % 2 === 1 ? pair : [...pair].reverse()) {
          const r = await attempt(`backlog ${sizes.backlogLarge}, retention ${label}, run ${run}`, () =>
            W.backlog(cluster, subject, dbs.large, sizes.backlogLarge, sizes.backlogWindowMs, { checkpoint: true }))
          if (!("error" in r)) log(`    retention ${label}: ${Math.round(r.perSec)} jobs/s (${r.completed} in ${(r.windowMs / 1000).toFixed(1)} s)`)
          into.push(r)
        }
        const p = await attempt(`prune ${sizes.archivedToPrune} while draining ${sizes.bulkJobs}, run ${run}`, () =>
          W.pruneWhileDraining(cluster, Pgfiber.subject, run, { archived: sizes.archivedToPrune, jobs: sizes.bulkJobs }))
        if (!("error" in p)) {
          log(`    pruned ${p.pruned} in ${(p.pruneMs / 1000).toFixed(1)} s (longest batch ${Math.round(p.longestBatchMs)} ms) while draining at ${Math.round(p.drainPerSec)} jobs/s`)
        }
        history.prune.push(p)
      }
      await cluster.dropDatabase(dbs.small.name)
      await cluster.dropDatabase(dbs.large.name)
    }
    if (only.has("fairness") && subjects.some((s) => s.key === "pgfiber")) {
      log(`== fairness: pgfiber drain rate with ${sizes.fairQueued} queued over ${sizes.fairOrgs} orgs, fair vs not`)
      for (let run = 1; run <= runs; run++) {
        const r = await attempt(`fairness run ${run}`, () =>
          W.fairness(cluster, Pgfiber.subject, run, { queued: sizes.fairQueued, orgs: sizes.fairOrgs, windowMs: sizes.fairWindowMs }))
        if (!("error" in r)) log(`    fair ${Math.round(r.fairPerSec)} jobs/s, unfair ${Math.round(r.unfairPerSec)} jobs/s (${(r.fairVsUnfair * 100).toFixed(0)} %)`)
        fairness.push(r)
      }
    }
    if (only.has("bulk-cancel") && subjects.some((s) => s.key === "pgfiber")) {
      log(`== bulk-cancel: ${sizes.bulkCancel} queued jobs of another stage cancelled by a payload filter while a worker drains ${sizes.bulkCancelDrain}`)
      for (let run = 1; run <= runs; run++) {
        // paced as shipped (rest as long as each batch took), unpaced, and resting three times as long
        for (const pace of run % 2 === 1 ? [1, 0, 3] : [3, 0, 1]) {
          const r = await attempt(`bulk-cancel pace ${pace} run ${run}`, () =>
            W.bulkCancelWhileDraining(cluster, Pgfiber.subject, run, { cancel: sizes.bulkCancel, drainJobs: sizes.bulkCancelDrain, aloneMs: sizes.bulkCancelAloneMs, pace }))
          if (!("error" in r)) {
            log(`    pace ${pace}: cancelled ${r.cancelled} in ${(r.cancelMs / 1000).toFixed(1)} s (batch mean ${Math.round(r.meanBatchMs)} ms, longest ${Math.round(r.longestBatchMs)} ms); ` +
              `drain ${Math.round(r.drainAlonePerSec)} jobs/s alone, ${Math.round(r.drainDuringPerSec)} during (${(r.ratio * 100).toFixed(0)} %)`)
          }
          bulkActions.cancel.push(r)
        }
      }
    }
    if (only.has("search")) {
      log(`== search: payload and error search at a backlog of ${sizes.searchQueued}`)
      const r = await attempt("search", () => W.searchAtBacklog(cluster, sizes.searchQueued))
      if (!("error" in r)) {
        log(`    trigram index on last_error: ${r.trigram ? "yes" : "no (pg_trgm unavailable)"}`)
        for (const c of r.searches) log(`    ${c.what}: ${c.medianMs.toFixed(1)} ms, ${c.rows} row(s); ${c.plan}`)
        log(`    enqueue (50 × 1,000 into the backlog): ${Math.round(r.enqueueWithIndexPerSec)} jobs/s with the payload index, ${Math.round(r.enqueueWithoutIndexPerSec)} without`)
      }
      bulkActions.search.push(r)
    }
    if (only.has("dashboards")) {
      log(`== dashboards: statements of an idle database with 0, 1 and ${sizes.dashboardViewers} open live dashboards, ${sizes.dashboardWindowMs / 1000} s each`)
      for (let run = 1; run <= runs; run++) {
        const r = await attempt(`dashboards run ${run}`, () =>
          Dashboards.dashboards(cluster, run, { windowMs: sizes.dashboardWindowMs, viewers: sizes.dashboardViewers }))
        if (!("error" in r)) {
          log(`    ${Object.entries(r.statementsPerSecond).map(([n, x]) => `${n} open: ${x.toFixed(2)}/s`).join(" · ")}`)
        }
        dashboards.push(r)
      }
    }
  } finally {
    await cluster.close()
  }
  const elapsedS = msSince(started) / 1000
  const results = {
    generatedAt: new Date().toISOString(),
    elapsedSeconds: Math.round(elapsedS),
    runs,
    quick,
    sizes,
    machine: { ...machine, loadAverageAtEnd: Os.loadavg().map((x) => Math.round(x * 100) / 100), medianLoadDuringMeasurements: Math.round(median(loads) * 100) / 100 },
    postgresSettings: cluster.settings,
    versions: {
      pgfiber: packageVersion("../"),
      effect: packageVersion("effect"),
      postgresJs: packageVersion("postgres"),
      graphileWorker: packageVersion("graphile-worker"),
      pgBoss: packageVersion("pg-boss")
    },
    subjects: subjects.map((s) => ({ key: s.key, label: s.label, notes: s.notes })),
    summary: summarize(subjects, bulk, steady, latency, idle, backlog, raw, idleScheduled, idleRateLimited, fairness, dashboards, ioCeiling),
    ioCeiling,
    fairness,
    idleRateLimited,
    bulk,
    steady,
    latency,
    idle,
    idleScheduled,
    backlog,
    history,
    raw,
    dashboards,
    bulkActions
  }
  Fs.mkdirSync(outDir, { recursive: true })
  const markdown = render(results)
  Fs.writeFileSync(Path.join(outDir, "latest.json"), JSON.stringify(results, null, 2) + "\n")
  Fs.writeFileSync(Path.join(outDir, "latest.md"), markdown)
  process.stdout.write(markdown)
  log(`bench: finished in ${elapsedS.toFixed(0)} s; wrote ${Path.relative(process.cwd(), outDir)}/latest.{json,md}`)
  if (flag("profile")) log(`CPU profiles of the pgfiber worker (first bulk run per handler, steady at the highest rate): ${Path.relative(process.cwd(), profileDir)}/`)
}

// ---- summary ------------------------------------------------------------------------------------------------

interface SubjectSummary {
  enqueuePerSec: number
  p50Ms: number
  p95Ms: number
  p99Ms: number
  idleStatementsPer10s: number
  idleConnections: number
  rssIdleMiB: number
  /** The async handler's drain (the sync one's in results from before the handlers were told apart). */
  rssPeakMiB: number
}

/** One subject's bulk drain with one kind of handler, medians of the runs. */
interface DrainSummary {
  concurrency: number
  drainPerSec: number
  drainAfterFirstJobPerSec: number
  drainCapped: boolean
  firstJobMs: number
  statementsPerJob: number
  claimsPer1kJobs: number
  settlesPer1kJobs: number
  workerCpuMsPer1kJobs: number
  serverCpuMsPer1kJobs: number
  rssPeakMiB: number
}

/** One subject at one steady rate, medians of the runs. */
interface SteadySummary {
  handledPerSec: number
  workerCpuMsPerJob: number
  serverCpuMsPerJob: number
  /** The server's CPU per job by whose backends spent it (`W.SteadyResult.serverCpuMsPerJobByProcess`), medians. */
  serverCpuByProcess: Record<string, number>
  producerCpuMsPerJob: number
  workerStatementsPerJob: number
  producerStatementsPerJob: number
  claimsPerJob: number
  settlesPerJob: number
  p50Ms: number
  p99Ms: number
  enqueueCallP50Ms: number
  enqueueCallP99Ms: number
  missing: number
}

const summarizeDrains = (results: Runs<W.BulkResult>): Record<string, DrainSummary> =>
  Object.fromEntries(Object.entries(results).map(([key, runs]) => {
    const b = ok(runs)
    const med = (f: (r: W.BulkResult) => number) => median(b.map(f))
    return [key, {
      concurrency: b[0]?.concurrency ?? Number.NaN,
      drainPerSec: med((r) => r.drainPerSec),
      drainAfterFirstJobPerSec: med((r) => r.drainAfterFirstJobPerSec),
      drainCapped: b.some((r) => r.capped),
      firstJobMs: med((r) => r.firstJobMs ?? Number.NaN),
      statementsPerJob: med((r) => r.statementsPerJob),
      claimsPer1kJobs: med((r) => r.claimsPer1kJobs),
      settlesPer1kJobs: med((r) => r.settlesPer1kJobs),
      workerCpuMsPer1kJobs: med((r) => r.workerCpuMsPer1kJobs),
      serverCpuMsPer1kJobs: med((r) => r.serverCpuMsPer1kJobs),
      rssPeakMiB: med((r) => r.rssPeakMiB ?? Number.NaN)
    }]
  }))

const summarizeSteady = (results: Runs<W.SteadyResult>): Record<string, SteadySummary> =>
  Object.fromEntries(Object.entries(results).map(([key, runs]) => {
    const med = (f: (r: W.SteadyResult) => number) => median(ok(runs).map(f))
    return [key, {
      handledPerSec: med((r) => r.handledPerSec),
      workerCpuMsPerJob: med((r) => r.workerCpuMsPerJob),
      serverCpuMsPerJob: med((r) => r.serverCpuMsPerJob),
      // results from before the breakdown have none
      serverCpuByProcess: Object.fromEntries(Object.keys(ok(runs)[0]?.serverCpuMsPerJobByProcess ?? {})
        .map((kind) => [kind, med((r) => r.serverCpuMsPerJobByProcess?.[kind] ?? Number.NaN)])),
      producerCpuMsPerJob: med((r) => r.producerCpuMsPerJob),
      workerStatementsPerJob: med((r) => r.workerStatementsPerJob),
      producerStatementsPerJob: med((r) => r.producerStatementsPerJob),
      claimsPerJob: med((r) => r.claimsPerJob),
      settlesPerJob: med((r) => r.settlesPerJob),
      p50Ms: med((r) => r.p50Ms),
      p99Ms: med((r) => r.p99Ms),
      enqueueCallP50Ms: med((r) => r.enqueueCallP50Ms),
      enqueueCallP99Ms: med((r) => r.enqueueCallP99Ms),
      missing: med((r) => r.missing)
    }]
  }))

const summarize = (
  subjects: ReadonlyArray<Subject>,
  bulk: Partial<Record<HandlerKind, Runs<W.BulkResult>>>,
  steady: Record<string, Runs<W.SteadyResult>>,
  latency: Runs<W.LatencyResult>,
  idle: Runs<W.IdleResult>,
  backlog: { small: Array<W.BacklogResult | { error: string }>; large: Array<W.BacklogResult | { error: string }> },
  raw: Array<W.RawResult | { error: string }>,
  idleScheduled: Array<W.IdleResult | { error: string }> = [],
  idleRateLimited: Array<W.IdleResult | { error: string }> = [],
  fairness: Array<W.FairnessResult | { error: string }> = [],
  dashboards: Array<Dashboards.DashboardsResult | { error: string }> = [],
  ioCeiling: Array<number | { error: string }> = []
) => {
  const per: Record<string, SubjectSummary> = {}
  for (const s of subjects) {
    // the enqueue is the same whatever the handler: every bulk run's
    const enqueues = Object.values(bulk).flatMap((runs) => ok(runs?.[s.key]))
    const l = ok(latency[s.key])
    const i = ok(idle[s.key])
    per[s.key] = {
      enqueuePerSec: median(enqueues.map((r) => r.enqueuePerSec)),
      p50Ms: median(l.map((r) => r.p50Ms)),
      p95Ms: median(l.map((r) => r.p95Ms)),
      p99Ms: median(l.map((r) => r.p99Ms)),
      idleStatementsPer10s: median(i.map((r) => r.statementsPer10s)),
      idleConnections: median(i.map((r) => r.connections)),
      rssIdleMiB: median(i.map((r) => r.rssMiB ?? Number.NaN)),
      rssPeakMiB: median(ok(bulk.async?.[s.key]).map((r) => r.rssPeakMiB ?? Number.NaN))
    }
  }
  const rawOk = ok(raw)
  const small = median(ok(backlog.small).map((r) => r.perSec))
  const large = median(ok(backlog.large).map((r) => r.perSec))
  return {
    subjects: per,
    drains: Object.fromEntries(Object.entries(bulk).map(([h, runs]) => [h, summarizeDrains(runs ?? {})])) as Partial<Record<HandlerKind, Record<string, DrainSummary>>>,
    steady: Object.fromEntries(Object.entries(steady).map(([rate, runs]) => [rate, summarizeSteady(runs)])),
    /** The I/O-bound drain's timers with no queue (`W.timerCeiling`), jobs/s. */
    ioCeilingPerSec: median(ok(ioCeiling)),
    idleScheduledStatementsPer10s: median(ok(idleScheduled).map((r) => r.statementsPer10s)),
    idleRateLimitedStatementsPer10s: median(ok(idleRateLimited).map((r) => r.statementsPer10s)),
    fairness: {
      fairPerSec: median(ok(fairness).map((r) => r.fairPerSec)),
      unfairPerSec: median(ok(fairness).map((r) => r.unfairPerSec)),
      fairVsUnfair: median(ok(fairness).map((r) => r.fairVsUnfair))
    },
    dashboards: {
      viewers: ok(dashboards)[0]?.viewers ?? 20,
      nonePerSec: median(ok(dashboards).map((r) => r.statementsPerSecond["0"] ?? Number.NaN)),
      onePerSec: median(ok(dashboards).map((r) => r.statementsPerSecond["1"] ?? Number.NaN)),
      manyPerSec: median(ok(dashboards).map((r) => r.statementsPerSecond[String(r.viewers)] ?? Number.NaN)),
      addedPerSec: median(ok(dashboards).map((r) => r.addedPerSecond))
    },
    backlog: { smallPerSec: small, largePerSec: large, largeVsSmall: large / small },
    raw: {
      enqueuePerSec: median(rawOk.map((r) => r.enqueuePerSec)),
      unbatchedPerSec: median(rawOk.map((r) => r.unbatchedPerSec)),
      batched10PerSec: median(rawOk.map((r) => r.batched10PerSec)),
      batched100PerSec: median(rawOk.map((r) => r.batched100PerSec))
    }
  }
}

// ---- markdown -----------------------------------------------------------------------------------------------

/** What each handler is, in every subject (`subjects/hooks.ts` and the worker scripts). */
const handlerLabels: Record<HandlerKind, string> = {
  async: "async no-op handler (`async (job) => record(job)`; pgfiber wraps it as `(p) => Effect.promise(() => handler(p))`)",
  io: `I/O-bound handler (the async no-op, then \`await\` a ${ioJobMs} ms timer)`,
  sync: "synchronous no-op handler, a labelled extra row for earlier figures, not what users write (pgfiber `Effect.sync`; " +
    "graphile-worker awaits the plain function's undefined; pg-boss's batch handler, async as pg-boss requires, calls it per job)"
}

const n0 = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString("en-US") : "–")
const n1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "–")
const n2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : "–")
const ratio = (a: number, b: number) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? `${(a / b).toFixed(1)}×` : "–")
const ratio2 = (a: number, b: number) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? `${(a / b).toFixed(2)}×` : "–")
const pct = (a: number, b: number) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? `${Math.round((a / b) * 100)} %` : "–")

const render = (r: {
  generatedAt: string
  elapsedSeconds: number
  runs: number
  quick: boolean
  sizes: typeof sizes
  machine: ReturnType<typeof machineInfo> & { medianLoadDuringMeasurements: number }
  postgresSettings: Record<string, string>
  versions: Record<string, string>
  subjects: ReadonlyArray<{ key: string; label: string; notes: string }>
  summary: ReturnType<typeof summarize>
  history?: {
    largeOn: Array<W.BacklogResult | { error: string }>
    largeOff: Array<W.BacklogResult | { error: string }>
    prune: Array<W.PruneResult | { error: string }>
  }
}) => {
  const S = r.summary.subjects
  const keys = r.subjects.map((s) => s.key)
  const labels = r.subjects.map((s) => s.label)
  const row = (label: string, f: (s: SubjectSummary) => string) =>
    `| ${label} | ${keys.map((k) => (S[k] ? f(S[k]!) : "–")).join(" | ")} |`
  const m = r.machine
  const pf = S.pgfiber
  const lines: Array<string> = []
  lines.push(`Measured ${r.generatedAt.slice(0, 16).replace("T", " ")} UTC on ${m.cpu}, ${m.cores} cores, ${m.ramGiB} GiB RAM, ${m.os};`)
  lines.push(`Node ${m.node}, PostgreSQL ${m.postgres} (embedded, one server for all subjects, a fresh database per subject and run;`)
  lines.push(`shared_buffers ${r.postgresSettings.shared_buffers ?? "?"}, fsync ${r.postgresSettings.fsync ?? "?"}, synchronous_commit ${r.postgresSettings.synchronous_commit ?? "?"}).`)
  lines.push(`graphile-worker ${r.versions.graphileWorker}, pg-boss ${r.versions.pgBoss}. Medians of ${r.runs} interleaved run(s)${r.quick ? " (--quick: reduced sizes)" : ""}; the whole run took ${Math.round(r.elapsedSeconds / 60 * 10) / 10} min.`)
  lines.push(`The machine is shared with other work: the median 1-minute load average when a measurement started was ${r.machine.medianLoadDuringMeasurements} on ${m.cores} cores.`)
  lines.push(`Every worker runs the same handler, written as users write it (the async no-op unless a table says otherwise).`)
  lines.push("")
  lines.push(`| | ${labels.join(" | ")} |`)
  lines.push(`| --- | ${keys.map(() => "---:").join(" | ")} |`)
  lines.push(row(`bulk enqueue, jobs/s (${n0(r.sizes.bulkJobs)} in batches of ${n0(r.sizes.batchSize)})`, (s) => n0(s.enqueuePerSec)))
  lines.push(row(`wake-up latency p50 / p95 / p99, ms`, (s) => `${n2(s.p50Ms)} / ${n2(s.p95Ms)} / ${n2(s.p99Ms)}`))
  lines.push(row(`idle: statements per 10 s`, (s) => n1(s.idleStatementsPer10s)))
  lines.push(row(`idle: open connections`, (s) => n0(s.idleConnections)))
  lines.push(row(`worker RSS idle / peak while draining (async handler), MiB (every worker compiled, under plain node)`, (s) => `${n0(s.rssIdleMiB)} / ${n0(s.rssPeakMiB)}`))
  if (pf) {
    lines.push(row(`ratio: the subject's p50 wake-up ÷ pgfiber's (> 1: pgfiber wakes sooner)`, (s) => (s === pf ? "1×" : ratio(s.p50Ms, pf.p50Ms))))
  }
  lines.push("")

  // the handlers' drains and the steady rates: pgfiber's targets (issue #27) beside each row, against
  // graphile-worker's performance-page configuration measured in the same run
  const peer = "graphile-batched"
  const peerLabel = r.subjects.find((s) => s.key === peer)?.label ?? "graphile-worker (batched)"
  const verdict = (what: string, met: boolean | null) => `${what}: ${met === null ? "–" : met ? "met" : "**missed**"}`
  const drains = r.summary.drains ?? {}
  const drainRows = (handler: HandlerKind, D: Record<string, DrainSummary>) => {
    const p = D.pgfiber
    const g = D[peer]
    const both = p !== undefined && g !== undefined
    const cells = (f: (d: DrainSummary) => string) => keys.map((k) => (D[k] ? f(D[k]!) : "–")).join(" | ")
    const line = (label: string, f: (d: DrainSummary) => string, target = "") => lines.push(`| ${label} | ${cells(f)} | ${target} |`)
    const c = p?.concurrency ?? g?.concurrency ?? Number.NaN
    lines.push(`| bulk drain, ${handlerLabels[handler]}; ${n0(r.sizes.bulkJobs)} jobs, concurrency ${n0(c)} | ${labels.join(" | ")} | pgfiber's target |`)
    lines.push(`| --- | ${keys.map(() => "---:").join(" | ")} | --- |`)
    line(`drain, jobs/s (worker start to the last completion)`, (d) => `${n0(d.drainPerSec)}${d.drainCapped ? " ¹" : ""}`)
    line(`running drain, jobs/s (first handler call to the last completion)`, (d) => n0(d.drainAfterFirstJobPerSec))
    if (handler === "io") {
      const bound = (c * 1000) / r.sizes.ioJobMs
      line(`running drain as a share of the bound (${n0(c)} × 1,000 / ${r.sizes.ioJobMs} ms = ${n0(bound)} jobs/s)`, (d) => pct(d.drainAfterFirstJobPerSec, bound),
        verdict("≥ 95 %", p ? p.drainAfterFirstJobPerSec >= 0.95 * bound : null))
      const ceiling = r.summary.ioCeilingPerSec ?? Number.NaN
      line(`running drain as a share of the same timers with no queue (${n0(ceiling)} jobs/s: one Node process, ${n0(c)} loops awaiting the ${r.sizes.ioJobMs} ms timer)`,
        (d) => pct(d.drainAfterFirstJobPerSec, ceiling))
      line(`running drain ÷ ${peerLabel}'s`, (d) => (g ? ratio2(d.drainAfterFirstJobPerSec, g.drainAfterFirstJobPerSec) : "–"),
        verdict("≥ 1.1×", both ? p.drainAfterFirstJobPerSec >= 1.1 * g.drainAfterFirstJobPerSec : null))
    } else {
      line(`drain ÷ ${peerLabel}'s`, (d) => (g ? ratio2(d.drainPerSec, g.drainPerSec) : "–"),
        handler === "async" ? verdict("≥ 1.0×", both ? p.drainPerSec >= g.drainPerSec : null) : "")
    }
    line(`of which start-up: worker start to its first handler call, ms`, (d) => n0(d.firstJobMs))
    line(`claim statements per 1,000 jobs`, (d) => n1(d.claimsPer1kJobs),
      handler === "async" ? verdict("≤ 5", p ? p.claimsPer1kJobs <= 5 : null) : "")
    line(`settle (complete) statements per 1,000 jobs`, (d) => n1(d.settlesPer1kJobs))
    line(`statements per job, all`, (d) => (d.statementsPerJob < 0.1 ? d.statementsPerJob.toFixed(4) : n2(d.statementsPerJob)))
    line(`worker CPU, ms per 1,000 jobs`, (d) => n0(d.workerCpuMsPer1kJobs),
      handler === "async" ? verdict(`≤ ${peerLabel}'s`, both ? p.workerCpuMsPer1kJobs <= g.workerCpuMsPer1kJobs : null) : "")
    line(`database server CPU (every PostgreSQL process), ms per 1,000 jobs`, (d) => n0(d.serverCpuMsPer1kJobs))
    line(`worker RSS peak, MiB`, (d) => n0(d.rssPeakMiB))
    lines.push("")
  }
  for (const handler of handlerKinds) {
    const D = drains[handler]
    if (D && Object.keys(D).length > 0) drainRows(handler, D)
  }

  for (const [rate, T] of Object.entries(r.summary.steady ?? {})) {
    const skeys = keys.filter((k) => T[k] !== undefined)
    if (skeys.length === 0) continue
    const p = T.pgfiber
    const g = T[peer]
    const both = p !== undefined && g !== undefined
    // a figure, and beside a peer's figure pgfiber's as a multiple of it
    const cells = (f: (t: SteadySummary) => string) => skeys.map((k) => f(T[k]!)).join(" | ")
    const vsPeer = (f: (t: SteadySummary) => number, fmt: (x: number) => string) => (t: SteadySummary) =>
      t === g || !g ? fmt(f(t)) : `${fmt(f(t))} (${ratio2(f(t), f(g))})`
    const line = (label: string, f: (t: SteadySummary) => string, target = "") => lines.push(`| ${label} | ${cells(f)} | ${target} |`)
    lines.push(`| steady ${rate} jobs/s: single jobs, one enqueue call each, from a producer process (open loop); async handler, concurrency ${W.concurrency}; ` +
      `${n0(r.sizes.steadyWindowMs / 1000)} s after ${n0(r.sizes.steadyWarmupMs / 1000)} s of warm-up. (×: ÷ ${peerLabel}'s) | ` +
      `${skeys.map((k) => r.subjects.find((s) => s.key === k)!.label).join(" | ")} | pgfiber's target |`)
    lines.push(`| --- | ${skeys.map(() => "---:").join(" | ")} | --- |`)
    line(`jobs handled per s (kept up: ≈ ${rate})`, (t) => n0(t.handledPerSec))
    line(`worker CPU, ms per job`, vsPeer((t) => t.workerCpuMsPerJob, n2),
      verdict(`≤ ${peerLabel}'s`, both ? p.workerCpuMsPerJob <= g.workerCpuMsPerJob : null))
    line(`database server CPU (the producer's inserts included), ms per job`, vsPeer((t) => t.serverCpuMsPerJob, n2),
      verdict(`≤ ${peerLabel}'s`, both ? p.serverCpuMsPerJob <= g.serverCpuMsPerJob : null))
    // pgfiber's only: its connections stay open, so each backend's CPU over the window is its share; a peer whose
    // pools open and close connections within the window has that work counted as the rest of the server's
    for (const kind of Object.keys(p?.serverCpuByProcess ?? {})) {
      line(`of which ${kind} (pgfiber's split)`, (t) => (t === p ? n2(t.serverCpuByProcess[kind] ?? Number.NaN) : "–"))
    }
    line(`worker statements per job`, vsPeer((t) => t.workerStatementsPerJob, n2), verdict("≤ 2", p ? p.workerStatementsPerJob <= 2 : null))
    line(`of which claims / settles per job`, (t) => `${n2(t.claimsPerJob)} / ${n2(t.settlesPerJob)}`)
    line(`producer statements per job`, (t) => n2(t.producerStatementsPerJob))
    line(`the producer's enqueue calls, p50 / p99, ms (large: the producer or the machine could not keep up)`,
      (t) => `${n2(t.enqueueCallP50Ms)} / ${n2(t.enqueueCallP99Ms)}`)
    line(`producer CPU, ms per job`, (t) => n2(t.producerCpuMsPerJob))
    line(`latency, enqueue call → handler start, p50 / p99, ms`, (t) => `${n2(t.p50Ms)} / ${n2(t.p99Ms)}${g && t !== g ? ` (p50 ${ratio2(t.p50Ms, g.p50Ms)})` : ""}`,
      verdict(`p50 ≤ ${peerLabel}'s`, both ? p.p50Ms <= g.p50Ms : null))
    lines.push("")
  }
  const h = r.history
  if (h && (ok(h.largeOn).length > 0 || ok(h.prune).length > 0)) {
    const on = median(ok(h.largeOn).map((x) => x.perSec))
    const offLarge = median(ok(h.largeOff).map((x) => x.perSec))
    const pr = ok(h.prune)
    lines.push("")
    lines.push(`| kept history | retention 7 days | retention off | on ÷ off |`)
    lines.push(`| --- | ---: | ---: | ---: |`)
    lines.push(`| drain with ${n0(r.sizes.backlogLarge)} queued, jobs/s | ${n0(on)} | ${n0(offLarge)} | ${pct(on, offLarge)} |`)
    if (pr.length > 0) {
      const prune = median(pr.map((x) => x.pruneMs))
      lines.push(`| pruning ${n0(pr[0]!.archived)} expired rows (batches of 5,000) beside a drain of ${n0(pr[0]!.jobs)}: prune time / longest batch / drain jobs/s | ` +
        `${n1(prune / 1000)} s / ${n0(median(pr.map((x) => x.longestBatchMs)))} ms / ${n0(median(pr.map((x) => x.drainPerSec)))} | | |`)
    }
    lines.push("")
  }
  const on = drains.async?.pgfiber
  const off = drains.async?.["pgfiber-noretain"]
  if (on && off) {
    lines.push("")
    lines.push(`Kept history (retention 7 days, finished jobs handed to jobs_archive in the settle statement) vs retention off ` +
      `(deleted at once): bulk drain (async handler) ${n0(on.drainPerSec)} vs ${n0(off.drainPerSec)} jobs/s, retention on at ${pct(on.drainPerSec, off.drainPerSec)} of off.`)
  }
  lines.push("")
  if (Object.values(drains).some((D) => Object.values(D ?? {}).some((d) => d.drainCapped))) {
    lines.push(`¹ cut off after ${(PgBoss.subject.drainCapMs / 1000)} s: the drain did not finish in time; the rate is what completed until then.`)
    lines.push("")
  }
  const b = r.summary.backlog
  if (Number.isFinite(b.smallPerSec)) {
    lines.push(`| pgfiber backlog | ${n0(r.sizes.backlogSmall)} queued | ${n0(r.sizes.backlogLarge)} queued | large ÷ small |`)
    lines.push(`| --- | ---: | ---: | ---: |`)
    lines.push(`| drain, jobs/s | ${n0(b.smallPerSec)} | ${n0(b.largePerSec)} | ${pct(b.largePerSec, b.smallPerSec)} |`)
    lines.push("")
  }
  const f = r.summary.fairness
  if (f && Number.isFinite(f.fairPerSec)) {
    lines.push(`| pgfiber fairness, ${n0(r.sizes.fairQueued)} queued over ${n0(r.sizes.fairOrgs)} orgs | fair | not fair | fair ÷ not |`)
    lines.push(`| --- | ---: | ---: | ---: |`)
    lines.push(`| drain, jobs/s | ${n0(f.fairPerSec)} | ${n0(f.unfairPerSec)} | ${pct(f.fairPerSec, f.unfairPerSec)} |`)
    lines.push("")
  }
  const raw = r.summary.raw
  // the ceiling and issue #12's drain targets were set with the synchronous handler: compared with that row
  const pfSync = drains.sync?.pgfiber
  const gbSync = drains.sync?.[peer]
  if (Number.isFinite(raw.unbatchedPerSec)) {
    lines.push(`| raw SQL ceiling (pgfiber's own statements, no runtime) | jobs/s | pgfiber (synchronous handler) as a fraction |`)
    lines.push(`| --- | ---: | ---: |`)
    lines.push(`| enqueue: insert … from unnest, 1,000 per statement | ${n0(raw.enqueuePerSec)} | ${pf ? pct(pf.enqueuePerSec, raw.enqueuePerSec) : "–"} |`)
    lines.push(`| claim 1 + complete 1, 10 connections (unbatched) | ${n0(raw.unbatchedPerSec)} | ${pfSync ? pct(pfSync.drainPerSec, raw.unbatchedPerSec) : "–"} |`)
    lines.push(`| claim 10 + complete 10, 1 connection (pgfiber's batch shape) | ${n0(raw.batched10PerSec)} | ${pfSync ? pct(pfSync.drainPerSec, raw.batched10PerSec) : "–"} |`)
    lines.push(`| claim 100 + complete 100, 2 connections (batched) | ${n0(raw.batched100PerSec)} | ${pfSync ? pct(pfSync.drainPerSec, raw.batched100PerSec) : "–"} |`)
    lines.push("")
  }
  if (pf) {
    const g = S.graphile
    const t = (label: string, measured: string, met: boolean | null) =>
      measured.startsWith("–") ? `| ${label} | not measured | – |` : `| ${label} | ${measured} | ${met === null ? "–" : met ? "met" : "**missed**"} |`
    lines.push(`| target | measured | |`)
    lines.push(`| --- | --- | --- |`)
    // issue #12's targets, as ratios against the peers measured in the same run (issue #27's are beside their rows above)
    lines.push(t("bulk drain (synchronous handler) ≥ 1.25× graphile-worker's performance-page configuration",
      pfSync && gbSync ? `${ratio(pfSync.drainPerSec, gbSync.drainPerSec)} (${(pfSync.drainPerSec / gbSync.drainPerSec).toFixed(2)})` : "–",
      pfSync && gbSync ? pfSync.drainPerSec >= 1.25 * gbSync.drainPerSec : null))
    lines.push(t("bulk drain (synchronous handler) ≥ 70 % of the raw batched SQL ceiling (claim 100 + complete 100)",
      pfSync && Number.isFinite(raw.batched100PerSec) ? pct(pfSync.drainPerSec, raw.batched100PerSec) : "–",
      pfSync && Number.isFinite(raw.batched100PerSec) ? pfSync.drainPerSec >= 0.7 * raw.batched100PerSec : null))
    lines.push(t("worker CPU per 1,000 jobs (synchronous handler) ≤ graphile-worker's (performance-page configuration)",
      pfSync && gbSync ? `${n0(pfSync.workerCpuMsPer1kJobs)} vs ${n0(gbSync.workerCpuMsPer1kJobs)} ms` : "–",
      pfSync && gbSync ? pfSync.workerCpuMsPer1kJobs <= gbSync.workerCpuMsPer1kJobs : null))
    lines.push(t("wake-up p50 ≤ graphile-worker's default p50", g ? `${n2(pf.p50Ms)} vs ${n2(g.p50Ms)} ms` : "–", g ? pf.p50Ms <= g.p50Ms : null))
    lines.push(t("wake-up p99 ≤ 5 ms", `${n2(pf.p99Ms)} ms`, pf.p99Ms <= 5))
    lines.push(t("≤ 1 statement per 10 s per idle process", n1(pf.idleStatementsPer10s), pf.idleStatementsPer10s <= 1))
    const sched = r.summary.idleScheduledStatementsPer10s ?? Number.NaN
    lines.push(t("≤ 1 statement per 10 s between ticks, one schedule every minute", Number.isFinite(sched) ? n1(sched) : "–", Number.isFinite(sched) ? sched <= 1 : null))
    const d = r.summary.dashboards
    lines.push(t(`${d?.viewers ?? 20} open dashboards add < 1 statement/s to an idle database`, d && Number.isFinite(d.addedPerSec) ? `${n2(d.addedPerSec)}/s (0 open: ${n2(d.nonePerSec)}/s, 1: ${n2(d.onePerSec)}/s, ${d.viewers}: ${n2(d.manyPerSec)}/s)` : "–",
      d && Number.isFinite(d.addedPerSec) ? d.addedPerSec < 1 : null))
    const rl = r.summary.idleRateLimitedStatementsPer10s ?? Number.NaN
    lines.push(t("≤ 1 statement per 10 s with a rate-limited stage waiting", Number.isFinite(rl) ? n1(rl) : "–", Number.isFinite(rl) ? rl <= 1 : null))
    const fv = r.summary.fairness?.fairVsUnfair ?? Number.NaN
    lines.push(t("fair claiming at 1M over 1,000 orgs within 25 % of unfair", Number.isFinite(fv) ? `${(fv * 100).toFixed(0)} %` : "–",
      Number.isFinite(fv) ? fv >= 0.75 : null))
    lines.push(t("drain at 1M backlog within 20 % of 10k", Number.isFinite(b.largeVsSmall) ? pct(b.largePerSec, b.smallPerSec) : "–",
      Number.isFinite(b.largeVsSmall) ? b.largeVsSmall >= 0.8 : null))
    lines.push("")
  }
  return lines.join("\n") + "\n"
}

if (flag("render")) renderOnly()
else await main()
