/**
 * The workloads, each measured once per call on a fresh database: bulk (enqueue + drain, with each kind of
 * handler), steady (single jobs from a producer process at a fixed rate), latency (enqueue → handler start),
 * idle (statements and connections of idle workers), backlog (pgfiber drain at 10k vs 1M queued) and the
 * raw-SQL ceiling. Every worker runs the async handler (`subjects/hooks.ts`) unless the workload says
 * otherwise. `run.ts` interleaves the calls and takes medians.
 */
import { Effect, Redacted } from "effect"
import * as Child from "node:child_process"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"
import * as BrowseSql from "../packages/pgfiber/src/queue/BrowseSql.js"
import * as BulkSql from "../packages/pgfiber/src/queue/BulkSql.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import type * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import {
  type Cluster, connect, cpuMsOf, log, median, msSince, nowNs, openConnections, percentile, resetStatements, rssOf, serverCpuMsOf, sleep,
  serverCpuByProcess, type ServerProcessKind, serverProcessKinds,
  claimedAt, compileWorker, spawnWorker, statementCount, statementsByQuery, tallyStatements, type WorkerChild
} from "./lib.js"
import type { HandlerKind, Subject, WorkerConfig } from "./subjects/types.js"
import { queueName } from "./subjects/types.js"

export const concurrency = 10

const dbName = (workload: string, key: string, run: number) => `bench_${workload}_${key.replace(/[^a-z0-9]/g, "_")}_${run}`

/** Each subject's worker script compiled to plain JavaScript (`compileSubjects`), run under plain node. */
const compiledScripts = new Map<string, string>()

/** Compiles the subjects' worker scripts once, before any workload: every worker then runs as its users run it. */
export const compileSubjects = async (subjects: ReadonlyArray<Subject>) => {
  for (const subject of subjects) compiledScripts.set(subject.workerScript, await compileWorker(subject.workerScript))
}

const spawnOptions = (subject: Subject, execArgv?: ReadonlyArray<string>) => {
  const compiled = compiledScripts.get(subject.workerScript)
  return { ...(execArgv ? { execArgv } : {}), ...(compiled !== undefined ? { compiled } : {}) }
}

interface StartOptions extends Partial<Pick<WorkerConfig, "handler" | "concurrency" | "fair" | "rate">> {
  readonly execArgv?: ReadonlyArray<string> | undefined
}

const startWorker = (
  subject: Subject, url: string, mode: WorkerConfig["mode"], expect: number,
  { execArgv, handler = "async", concurrency: c = concurrency, ...extra }: StartOptions = {}
) =>
  spawnWorker(subject.workerScript, {
    subject: subject.key,
    variant: subject.variant,
    url,
    mode,
    handler,
    expect,
    concurrency: c,
    ...extra
  } satisfies WorkerConfig, spawnOptions(subject, execArgv))

const stopWorker = async (worker: WorkerChild) => {
  const code = await worker.stop(10_000)
  return code
}

const requireMessage = async <T extends "starting" | "ready">(worker: WorkerChild, t: T, timeoutMs: number) => {
  const m = await worker.waitFor(t, timeoutMs)
  if (m === null) throw new Error(`worker sent no "${t}" within ${timeoutMs} ms; stderr:\n${worker.stderrTail()}`)
  return m
}

// ---- bulk ---------------------------------------------------------------------------------------------------

export interface BulkResult {
  readonly handler: HandlerKind
  readonly concurrency: number
  readonly jobs: number
  readonly batchSize: number
  readonly enqueueMs: number
  readonly enqueuePerSec: number
  /** From the worker's start (modules loaded) to the last completion recorded in the database. */
  readonly drainMs: number
  readonly drainPerSec: number
  /** The same, counted from spawning the Node process (module loading included). */
  readonly drainFromSpawnPerSec: number
  readonly moduleLoadMs: number
  /** From the worker's start to its first handler call: connecting, the layers, the first claim. */
  readonly firstJobMs: number | null
  /** The drain from the first handler call to the last completion: the running rate, start-up excluded. */
  readonly drainAfterFirstJobPerSec: number
  readonly completed: number
  readonly capped: boolean
  readonly statementsPerJob: number
  /** The subject's claim statements (`Subject.statements`) during the drain, per 1,000 jobs. */
  readonly claimsPer1kJobs: number
  /** Its settle (complete) statements, per 1,000 jobs. */
  readonly settlesPer1kJobs: number
  /** The worker process's CPU time (user + system) during the drain, per 1,000 jobs. */
  readonly workerCpuMsPer1kJobs: number
  /** The database server's CPU time (every PostgreSQL process) during the drain, per 1,000 jobs. */
  readonly serverCpuMsPer1kJobs: number
  readonly rssPeakMiB: number | null
  readonly topStatements: ReadonlyArray<{ calls: string; total_ms: number; mean_ms: number; query: string }>
}

/** From the worker's `starting` to its first handler call, when it told one. */
const firstAt = (worker: WorkerChild, startingAt: number): number | null => {
  const first = worker.messages.find((m) => m.t === "first")
  return first ? (first.at - startingAt) / 1e6 : null
}

/**
 * The I/O-bound drain's ceiling on this machine with no queue at all: a plain Node process in which `concurrency`
 * loops each await the same timer as the bench's `io` handler, `jobs` times in all. The timer fires late (its
 * millisecond granularity, and the event loop's lag when the machine is loaded), so this is below the nominal
 * bound of concurrency × 1000 / ms jobs/s; a queue's drain cannot beat it.
 */
export const timerCeiling = (jobs: number, concurrency: number, ms: number): Promise<number> => {
  const script = `
    let left = ${jobs}
    const wait = () => new Promise((resolve) => setTimeout(resolve, ${ms}))
    const t0 = process.hrtime.bigint()
    const loop = async () => { while (left > 0) { left--; await wait() } }
    Promise.all(Array.from({ length: ${concurrency} }, loop)).then(() => {
      console.log(${jobs} / (Number(process.hrtime.bigint() - t0) / 1e9))
    })`
  return new Promise((resolve, reject) => {
    Child.execFile(process.execPath, ["-e", script], (error, stdout) => {
      const perSec = Number(stdout.trim())
      if (error || !Number.isFinite(perSec)) reject(error ?? new Error(`timer ceiling: unexpected output ${JSON.stringify(stdout)}`))
      else resolve(perSec)
    })
  })
}

export const bulk = async (
  cluster: Cluster, subject: Subject, run: number,
  options: { jobs: number; batchSize: number; handler: HandlerKind; concurrency: number; execArgv?: ReadonlyArray<string> }
): Promise<BulkResult> => {
  const name = dbName(`bulk_${options.handler}`, subject.key, run)
  const url = await cluster.createDatabase(name)
  try {
    await subject.install(url)
    const producer = await subject.producer(url)
    try {
      const t0 = nowNs()
      for (let i = 0; i < options.jobs; i += options.batchSize) {
        await producer.enqueueBatch(Array.from({ length: Math.min(options.batchSize, options.jobs - i) }, (_, k) => i + k))
      }
      const enqueueMs = msSince(t0)
      await resetStatements(cluster.admin)
      const worker = startWorker(subject, url, "bulk", options.jobs, {
        execArgv: options.execArgv, handler: options.handler, concurrency: options.concurrency
      })
      try {
        const starting = await requireMessage(worker, "starting", 30_000)
        const cpuAtStart = cpuMsOf(worker.pid)
        const serverCpuAtStart = serverCpuMsOf(cluster.dataDir)
        const drained = await worker.waitFor("drained", subject.drainCapMs)
        let endNs: number
        let completed: number
        if (drained !== null) {
          // handlers have all run; the drain ends when the last completion is committed
          while ((await producer.pending()) > 0) await sleep(2)
          endNs = nowNs()
          completed = options.jobs
        } else {
          endNs = nowNs()
          completed = options.jobs - (await producer.pending())
        }
        const rss = rssOf(worker.pid)
        const cpuAtEnd = cpuMsOf(worker.pid)
        const serverCpuAtEnd = serverCpuMsOf(cluster.dataDir)
        const statements = await statementCount(cluster.admin, name)
        const { worker: tally } = await tallyStatements(cluster.admin, name, subject.statements)
        const topStatements = await statementsByQuery(cluster.admin, name, 6)
        const drainMs = (endNs - starting.at) / 1e6
        const firstJobMs = firstAt(worker, starting.at)
        const per1k = (n: number) => (completed > 0 ? (n / completed) * 1000 : Number.NaN)
        return {
          handler: options.handler,
          concurrency: options.concurrency,
          jobs: options.jobs,
          batchSize: options.batchSize,
          enqueueMs,
          enqueuePerSec: options.jobs / (enqueueMs / 1000),
          drainMs,
          drainPerSec: completed / (drainMs / 1000),
          drainFromSpawnPerSec: completed / ((endNs - worker.spawnedAt) / 1e9),
          moduleLoadMs: (starting.at - worker.spawnedAt) / 1e6,
          firstJobMs,
          drainAfterFirstJobPerSec: firstJobMs === null ? Number.NaN : completed / ((drainMs - firstJobMs) / 1000),
          completed,
          capped: drained === null,
          statementsPerJob: completed > 0 ? statements / completed : Number.NaN,
          claimsPer1kJobs: per1k(tally.claim),
          settlesPer1kJobs: per1k(tally.settle),
          workerCpuMsPer1kJobs: cpuAtStart !== null && cpuAtEnd !== null && completed > 0
            ? ((cpuAtEnd - cpuAtStart) / completed) * 1000
            : Number.NaN,
          serverCpuMsPer1kJobs: serverCpuAtStart !== null && serverCpuAtEnd !== null && completed > 0
            ? ((serverCpuAtEnd - serverCpuAtStart) / completed) * 1000
            : Number.NaN,
          rssPeakMiB: rss?.peakMiB ?? null,
          topStatements
        }
      } finally {
        await stopWorker(worker)
      }
    } finally {
      await producer.close()
    }
  } finally {
    await cluster.dropDatabase(name)
  }
}

// ---- latency ------------------------------------------------------------------------------------------------

export interface LatencyResult {
  readonly jobs: number
  readonly spacingMs: number
  readonly p50Ms: number
  readonly p95Ms: number
  readonly p99Ms: number
  readonly maxMs: number
  readonly missing: number
  readonly samplesMs: ReadonlyArray<number>
}

export const latency = async (
  cluster: Cluster, subject: Subject, run: number, options: { jobs: number; spacingMs: number }
): Promise<LatencyResult> => {
  const name = dbName("latency", subject.key, run)
  const url = await cluster.createDatabase(name)
  try {
    await subject.install(url)
    const producer = await subject.producer(url)
    try {
      // warm the producer's connections so the first sample measures the queue, not a TCP handshake
      await producer.pending()
      const worker = startWorker(subject, url, "latency", options.jobs)
      try {
        await requireMessage(worker, "ready", 30_000)
        await sleep(1500) // idle: start-up catch-up claims are over
        const returned = new Map<number, number>()
        const started = new Map<number, number>()
        worker.onMessage((m) => {
          if (m.t === "start" && !started.has(m.seq)) started.set(m.seq, m.at)
        })
        for (const m of worker.messages) if (m.t === "start" && !started.has(m.seq)) started.set(m.seq, m.at)
        const t0 = nowNs()
        for (let seq = 0; seq < options.jobs; seq++) {
          await producer.enqueueOne(seq)
          returned.set(seq, nowNs())
          const nextAt = t0 + (seq + 1) * options.spacingMs * 1e6
          const wait = (nextAt - nowNs()) / 1e6
          if (wait > 0) await sleep(wait)
        }
        const deadline = nowNs() + 5_000 * 1e6
        while (started.size < options.jobs && nowNs() < deadline) await sleep(20)
        const samples: Array<number> = []
        for (const [seq, at] of returned) {
          const s = started.get(seq)
          if (s !== undefined) samples.push((s - at) / 1e6)
        }
        return {
          jobs: options.jobs,
          spacingMs: options.spacingMs,
          p50Ms: percentile(samples, 50),
          p95Ms: percentile(samples, 95),
          p99Ms: percentile(samples, 99),
          maxMs: Math.max(...samples),
          missing: options.jobs - samples.length,
          samplesMs: samples.map((x) => Math.round(x * 1000) / 1000)
        }
      } finally {
        await stopWorker(worker)
      }
    } finally {
      await producer.close()
    }
  } finally {
    await cluster.dropDatabase(name)
  }
}

// ---- steady rate --------------------------------------------------------------------------------------------

/** What the harness passes to the steady workload's producer process (`steadyProducer.ts`). */
export interface SteadyProducerConfig {
  readonly subject: string
  /** The database's URL as `producerRole`. */
  readonly url: string
  readonly ratePerSec: number
  readonly durationMs: number
  /** The producer's pool (`Subject.producer`). */
  readonly connections: number
}

/** The steady producer's pool: enough that its calls never wait for a connection at 300 jobs/s (`Subject.producer`). */
const steadyProducerConnections = 20

export interface SteadyResult {
  readonly ratePerSec: number
  readonly concurrency: number
  readonly warmupMs: number
  /** The measured window, after the warm-up. */
  readonly windowMs: number
  /** Enqueue calls that started in the window: what "per job" divides by. */
  readonly jobs: number
  /** Handlers that started in the window ÷ its length: whether the worker kept up with the producer. */
  readonly handledPerSec: number
  /** The producer's scheduling: how late its latest enqueue call started, ms (open loop: it never waits for one). */
  readonly producerLateMs: number
  /** How long its enqueue calls took to return, p50 / p99 over the whole run, ms: a queue of calls shows here. */
  readonly enqueueCallP50Ms: number
  readonly enqueueCallP99Ms: number
  readonly workerCpuMsPerJob: number
  /** Every PostgreSQL process's CPU over the window (the producer's inserts and the worker's statements). */
  readonly serverCpuMsPerJob: number
  /** The same by process (`serverCpuShares`): the worker's backends, the producer's, the rest of the server. */
  readonly serverCpuMsPerJobByProcess: Readonly<Record<string, number>>
  readonly producerCpuMsPerJob: number
  readonly workerStatementsPerJob: number
  readonly producerStatementsPerJob: number
  readonly claimsPerJob: number
  readonly settlesPerJob: number
  /** Enqueue call started → handler started, on the shared monotonic clock, for the window's jobs. */
  readonly p50Ms: number
  readonly p95Ms: number
  readonly p99Ms: number
  readonly maxMs: number
  /** The window's jobs whose handler had not started 5 s after the producer stopped. */
  readonly missing: number
  readonly topStatements: ReadonlyArray<{ calls: string; total_ms: number; mean_ms: number; query: string }>
}

/**
 * Each kind of backend's CPU per job over a window, from `serverCpuByProcess` read at both ends: a backend open at
 * both counts its difference, one opened in between all of its time. The rest of the server's is its total less
 * theirs: the WAL writer, checkpointer, autovacuum, and connections closed in between (a pool's churn).
 */
const serverCpuShares = (
  from: Map<number, { readonly ms: number }>, to: Map<number, { readonly kind: ServerProcessKind; readonly ms: number }>,
  totalPerJob: number, perJob: (x: number, y: number) => number
): Record<string, number> => {
  const spent = new Map<ServerProcessKind, number>(serverProcessKinds.map((kind) => [kind, 0]))
  for (const [pid, now] of to) spent.set(now.kind, spent.get(now.kind)! + now.ms - (from.get(pid)?.ms ?? 0))
  const shares: Record<string, number> = {}
  for (const kind of serverProcessKinds) shares[kind] = perJob(0, spent.get(kind)!)
  shares["the rest of the server (background processes, connections closed in the window)"] =
    totalPerJob - serverProcessKinds.reduce((sum, kind) => sum + shares[kind]!, 0)
  return shares
}

/**
 * A worker (the async handler, concurrency 10) fed single jobs by a producer in a process of its own: one
 * `enqueueOne` call every 1/rate s on a fixed schedule (open loop: a slow call delays none after it). After
 * `warmupMs` the window opens: CPU of the worker, the server and the producer, and statements by who sent them
 * (the producer connects as `producerRole`), until `windowMs` later.
 */
export const steady = async (
  cluster: Cluster, subject: Subject, run: number,
  options: { ratePerSec: number; warmupMs: number; windowMs: number; execArgv?: ReadonlyArray<string> }
): Promise<SteadyResult> => {
  const name = dbName(`steady_${options.ratePerSec}`, subject.key, run)
  const url = await cluster.createDatabase(name)
  try {
    await subject.install(url)
    const worker = startWorker(subject, url, "steady", 0, { execArgv: options.execArgv })
    try {
      await requireMessage(worker, "ready", 60_000)
      await sleep(1000) // idle: start-up catch-up claims are over
      const started = new Map<number, number>()
      const enqueued = new Map<number, number>()
      worker.onMessage((m) => {
        if (m.t === "starts") m.seqs.forEach((seq, i) => started.has(seq) || started.set(seq, m.ats[i]!))
      })
      const producer = spawnWorker("steadyProducer.ts", {
        subject: subject.key,
        url: cluster.asProducer(url),
        ratePerSec: options.ratePerSec,
        durationMs: options.warmupMs + options.windowMs + 1000,
        connections: steadyProducerConnections
      } satisfies SteadyProducerConfig)
      try {
        producer.onMessage((m) => {
          if (m.t === "enqueued") m.seqs.forEach((seq, i) => enqueued.set(seq, m.ats[i]!))
        })
        // generous: the producer runs under tsx, slow to start on a loaded machine
        const ready = await requireMessage(producer, "ready", 120_000)
        const warmLeftMs = options.warmupMs - (nowNs() - ready.at) / 1e6
        if (warmLeftMs > 0) await sleep(warmLeftMs)
        await resetStatements(cluster.admin)
        const byProcess0 = await serverCpuByProcess(cluster.admin, name)
        const cpu0 = { worker: cpuMsOf(worker.pid), server: serverCpuMsOf(cluster.dataDir), producer: cpuMsOf(producer.pid) }
        const from = nowNs()
        await sleep(options.windowMs)
        const cpu1 = { worker: cpuMsOf(worker.pid), server: serverCpuMsOf(cluster.dataDir), producer: cpuMsOf(producer.pid) }
        const byProcess1 = await serverCpuByProcess(cluster.admin, name)
        const to = nowNs()
        const tally = await tallyStatements(cluster.admin, name, subject.statements)
        const topStatements = await statementsByQuery(cluster.admin, name, 8)
        const produced = await producer.waitFor("produced", options.windowMs + 30_000)
        if (produced === null) throw new Error(`the producer did not finish; stderr:\n${producer.stderrTail()}`)
        if (produced.failed > 0) throw new Error(`${produced.failed} enqueue calls failed; stderr:\n${producer.stderrTail()}`)
        const inWindow = [...enqueued].filter(([, at]) => at >= from && at < to)
        const deadline = nowNs() + 5_000 * 1e6
        while (inWindow.some(([seq]) => !started.has(seq)) && nowNs() < deadline) await sleep(50)
        const samples = inWindow.flatMap(([seq, at]) => {
          const s = started.get(seq)
          return s === undefined ? [] : [(s - at) / 1e6]
        })
        const handled = [...started.values()].filter((at) => at >= from && at < to).length
        const jobs = inWindow.length
        const perJob = (x: number | null, y: number | null) => (x !== null && y !== null && jobs > 0 ? (y - x) / jobs : Number.NaN)
        const windowMs = (to - from) / 1e6
        return {
          ratePerSec: options.ratePerSec,
          concurrency,
          warmupMs: options.warmupMs,
          windowMs,
          jobs,
          handledPerSec: handled / (windowMs / 1000),
          producerLateMs: produced.lateMs,
          enqueueCallP50Ms: produced.callP50Ms,
          enqueueCallP99Ms: produced.callP99Ms,
          workerCpuMsPerJob: perJob(cpu0.worker, cpu1.worker),
          serverCpuMsPerJob: perJob(cpu0.server, cpu1.server),
          serverCpuMsPerJobByProcess: serverCpuShares(byProcess0, byProcess1, perJob(cpu0.server, cpu1.server), perJob),
          producerCpuMsPerJob: perJob(cpu0.producer, cpu1.producer),
          workerStatementsPerJob: tally.worker.total / jobs,
          producerStatementsPerJob: tally.producer.total / jobs,
          claimsPerJob: tally.worker.claim / jobs,
          settlesPerJob: tally.worker.settle / jobs,
          p50Ms: percentile(samples, 50),
          p95Ms: percentile(samples, 95),
          p99Ms: percentile(samples, 99),
          maxMs: Math.max(...samples),
          missing: jobs - samples.length,
          topStatements
        }
      } finally {
        await producer.stop(10_000)
      }
    } finally {
      await stopWorker(worker)
    }
  } finally {
    await cluster.dropDatabase(name)
  }
}

// ---- idle ---------------------------------------------------------------------------------------------------

export interface IdleResult {
  readonly windowMs: number
  readonly statements: number
  readonly statementsPer10s: number
  readonly connections: number
  readonly rssMiB: number | null
  readonly statementsSeen: ReadonlyArray<{ calls: string; query: string }>
}

/** Every subject's worker idles at once, each in its own database; pg_stat_statements tells them apart. */
export const idle = async (
  cluster: Cluster, subjects: ReadonlyArray<Subject>, run: number, options: { windowMs: number; warmMs: number }
): Promise<Record<string, IdleResult | { error: string }>> => {
  const prepared = await Promise.all(subjects.map(async (subject) => {
    const name = dbName("idle", subject.key, run)
    const url = await cluster.createDatabase(name)
    await subject.install(url)
    return { subject, name, url }
  }))
  const workers = prepared.map((p) => ({ ...p, worker: startWorker(p.subject, p.url, "idle", 0) }))
  try {
    for (const w of workers) await requireMessage(w.worker, "ready", 30_000)
    await sleep(options.warmMs)
    await resetStatements(cluster.admin)
    await sleep(options.windowMs)
    const out: Record<string, IdleResult | { error: string }> = {}
    for (const w of workers) {
      const statements = await statementCount(cluster.admin, w.name)
      const seen = await statementsByQuery(cluster.admin, w.name, 8)
      out[w.subject.key] = {
        windowMs: options.windowMs,
        statements,
        statementsPer10s: statements / (options.windowMs / 10_000),
        connections: await openConnections(cluster.admin, w.name),
        rssMiB: rssOf(w.worker.pid)?.rssMiB ?? null,
        statementsSeen: seen.map((s) => ({ calls: s.calls, query: s.query }))
      }
    }
    return out
  } finally {
    await Promise.all(workers.map((w) => stopWorker(w.worker)))
    for (const p of prepared) await cluster.dropDatabase(p.name)
  }
}

/**
 * pgfiber's idle worker with one schedule every minute: the window opens just after a tick (and its job) is
 * done, so it measures the statements between ticks, which must stay as low as with no schedule at all.
 */
export const idleScheduled = async (
  cluster: Cluster, subject: Subject, run: number, options: { windowMs: number; warmMs: number }
): Promise<IdleResult & { tickToWindowMs: number }> => {
  const name = dbName("idlesched", subject.key, run)
  const url = await cluster.createDatabase(name)
  await subject.install(url)
  const worker = spawnWorker(subject.workerScript, {
    subject: subject.key,
    variant: subject.variant,
    url,
    mode: "idle",
    handler: "async",
    expect: 0,
    concurrency,
    schedule: "* * * * *"
  } satisfies WorkerConfig, spawnOptions(subject))
  try {
    // generous: a loaded machine compiles the worker (tsx) slowly
    await requireMessage(worker, "ready", 120_000)
    const tick = await worker.waitFor("tick", 90_000)
    if (tick === null) throw new Error(`no scheduled job ran within 90 s; stderr:\n${worker.stderrTail()}`)
    await sleep(options.warmMs)
    await resetStatements(cluster.admin)
    // the next tick is a minute after the last: stay clear of it
    const windowMs = Math.min(options.windowMs, 60_000 - options.warmMs - 5_000)
    await sleep(windowMs)
    const statements = await statementCount(cluster.admin, name)
    const seen = await statementsByQuery(cluster.admin, name, 8)
    return {
      windowMs,
      statements,
      statementsPer10s: statements / (windowMs / 10_000),
      connections: await openConnections(cluster.admin, name),
      rssMiB: rssOf(worker.pid)?.rssMiB ?? null,
      statementsSeen: seen.map((s) => ({ calls: s.calls, query: s.query })),
      tickToWindowMs: options.warmMs
    }
  } finally {
    await stopWorker(worker)
    await cluster.dropDatabase(name)
  }
}

// ---- backlog (pgfiber) --------------------------------------------------------------------------------------

const pgfiberSchema = "pgfiber"

export const migratePgfiber = (url: string) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.flatMap(Db.make({ url: Redacted.make(url), schema: pgfiberSchema, poolMax: 2 }), (db) =>
        Migrations.migrate().pipe(Effect.provideService(Db.Db, db)))
    )
  )

/** Server-side generated jobs for the bench stage, `chunk` rows per statement; spread over `orgs` orgs when given. */
const fillJobs = async (url: string, count: number, chunk = 100_000, orgs = 0) => {
  const sql = connect(url, { max: 1, schema: pgfiberSchema })
  try {
    for (let done = 0; done < count; done += chunk) {
      const n = Math.min(chunk, count - done)
      await sql`insert into jobs (stage, org_id, payload)
                select ${queueName}, case when ${orgs}::int > 0 then 'org-' || (g % ${orgs}::int) end, jsonb_build_object('seq', g)
                from generate_series(1, ${n}::int) g`
    }
  } finally {
    await sql.end({ timeout: 5 })
  }
}

export interface BacklogResult {
  readonly queued: number
  readonly windowMs: number
  readonly completed: number
  readonly perSec: number
  readonly topStatements: ReadonlyArray<{ calls: string; total_ms: number; mean_ms: number; query: string }>
}

export interface BacklogDbs {
  readonly small: { name: string; url: string }
  readonly large: { name: string; url: string }
}

export const prepareBacklog = async (cluster: Cluster, large: number): Promise<BacklogDbs> => {
  const small = { name: "bench_backlog_small", url: await cluster.createDatabase("bench_backlog_small") }
  const big = { name: "bench_backlog_large", url: await cluster.createDatabase("bench_backlog_large") }
  await migratePgfiber(small.url)
  await migratePgfiber(big.url)
  const t0 = nowNs()
  await fillJobs(big.url, large)
  log(`  backlog: ${large.toLocaleString("en-US")} jobs queued in ${(msSince(t0) / 1000).toFixed(1)} s`)
  const sql = connect(big.url, { max: 1, schema: pgfiberSchema })
  await sql`vacuum analyze jobs`
  await sql.end({ timeout: 5 })
  return { small, large: big }
}

const countJobs = async (url: string) => {
  const sql = connect(url, { max: 1, schema: pgfiberSchema })
  try {
    return Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

/**
 * Drain rate with `queued` jobs waiting. Small: the whole backlog, from worker start to the last completion.
 * Large: the jobs completed in `windowMs` from worker start (the table is topped up to `queued` first).
 * With `checkpoint`, a CHECKPOINT first.
 */
export const backlog = async (
  cluster: Cluster, subject: Subject, db: { name: string; url: string }, queued: number, windowMs: number | null,
  options: { readonly checkpoint?: boolean } = {}
): Promise<BacklogResult> => {
  const present = await countJobs(db.url)
  if (present < queued) await fillJobs(db.url, queued - present)
  // the whole cluster's dirty pages written now, not during the window
  if (options.checkpoint) await cluster.admin`checkpoint`
  await resetStatements(cluster.admin)
  const sql = connect(db.url, { max: 1, schema: pgfiberSchema })
  const worker = startWorker(subject, db.url, "bulk", windowMs === null ? queued : Number.MAX_SAFE_INTEGER)
  try {
    const starting = await requireMessage(worker, "starting", 30_000)
    let completed: number
    let endNs: number
    if (windowMs === null) {
      const drained = await worker.waitFor("drained", 120_000)
      if (drained === null) throw new Error("backlog drain did not finish in 120 s")
      while (Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n) > 0) await sleep(2)
      endNs = nowNs()
      completed = queued
    } else {
      const waitMs = windowMs - (nowNs() - starting.at) / 1e6
      if (waitMs > 0) await sleep(waitMs)
      endNs = nowNs()
      // the count's snapshot is taken when it starts, i.e. at endNs
      completed = queued - Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n)
    }
    const ms = (endNs - starting.at) / 1e6
    return {
      queued,
      windowMs: ms,
      completed,
      perSec: completed / (ms / 1000),
      topStatements: await statementsByQuery(cluster.admin, db.name, 6)
    }
  } finally {
    await stopWorker(worker)
    await sql.end({ timeout: 5 })
  }
}

// ---- kept history: pruning a large archive while a worker drains ---------------------------------------------

export interface PruneResult {
  /** Finished jobs in jobs_archive past their retention when the drain starts. */
  readonly archived: number
  readonly pruned: number
  readonly pruneMs: number
  /** Jobs drained while the pruner ran beside the worker. */
  readonly jobs: number
  readonly drainPerSec: number
  /** The longest a single prune batch (one statement, one transaction) took. */
  readonly longestBatchMs: number
}

/**
 * The archive holds `archived` expired rows; a worker (retention on) drains `jobs` while a pruner deletes them
 * in batches of 5,000 (JobsSql.pruneArchive, what housekeeping runs) on its own connection. Reports the drain
 * rate beside the pruning (compare with bulk's) and the pruning's duration.
 */
export const pruneWhileDraining = async (
  cluster: Cluster, subject: Subject, run: number, options: { archived: number; jobs: number }
): Promise<PruneResult> => {
  const name = dbName("prune", subject.key, run)
  const url = await cluster.createDatabase(name)
  const sql = connect(url, { max: 2, schema: pgfiberSchema })
  try {
    await migratePgfiber(url)
    for (let done = 0; done < options.archived; done += 100_000) {
      const n = Math.min(100_000, options.archived - done)
      // negative ids: never a live job's
      await sql`
        insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, finished_at, keep_until)
        select -(${done}::int + g), ${queueName}, jsonb_build_object('seq', g), 50, 'completed', 0, 5,
               now() - interval '8 days', now() - interval '8 days', now() - interval '1 day'
        from generate_series(1, ${n}::int) g`
    }
    await sql`vacuum analyze jobs_archive`
    await fillJobs(url, options.jobs)
    const worker = startWorker(subject, url, "bulk", options.jobs)
    try {
      const starting = await requireMessage(worker, "starting", 30_000)
      let pruned = 0
      let longestBatchMs = 0
      const t0 = nowNs()
      const pruning = (async () => {
        for (;;) {
          const b0 = nowNs()
          const [row] = await JobsSql.pruneArchive(sql, null, 5000)
          longestBatchMs = Math.max(longestBatchMs, msSince(b0))
          pruned += row?.n ?? 0
          if ((row?.n ?? 0) < 5000) return msSince(t0)
        }
      })()
      const drained = await worker.waitFor("drained", 120_000)
      if (drained === null) throw new Error("drain beside the pruner did not finish in 120 s")
      while (Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n) > 0) await sleep(2)
      const drainMs = (nowNs() - starting.at) / 1e6
      const pruneMs = await pruning
      return { archived: options.archived, pruned, pruneMs, jobs: options.jobs, drainPerSec: options.jobs / (drainMs / 1000), longestBatchMs }
    } finally {
      await stopWorker(worker)
    }
  } finally {
    await sql.end({ timeout: 5 })
    await cluster.dropDatabase(name)
  }
}

// ---- fairness (pgfiber) ------------------------------------------------------------------------------------

export interface FairnessResult {
  readonly queued: number
  readonly orgs: number
  readonly fairPerSec: number
  readonly unfairPerSec: number
  /** Fair drain ÷ unfair drain: the cost of taking turns (target ≥ 75 %). */
  readonly fairVsUnfair: number
  readonly fairTopStatements: ReadonlyArray<{ calls: string; total_ms: number; mean_ms: number; query: string }>
}

/**
 * Drain rate over `windowMs` with `queued` jobs spread evenly over `orgs` orgs, fairness on, then off (the
 * table topped up to `queued` before each), in one database.
 */
export const fairness = async (
  cluster: Cluster, subject: Subject, run: number, options: { queued: number; orgs: number; windowMs: number }
): Promise<FairnessResult> => {
  const name = dbName("fair", subject.key, run)
  const url = await cluster.createDatabase(name)
  try {
    await migratePgfiber(url)
    const sql = connect(url, { max: 1, schema: pgfiberSchema })
    const drainWith = async (fair: boolean) => {
      const present = Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n)
      if (present < options.queued) await fillJobs(url, options.queued - present, 100_000, options.orgs)
      await sql`vacuum analyze jobs`
      await resetStatements(cluster.admin)
      const worker = startWorker(subject, url, "bulk", Number.MAX_SAFE_INTEGER, { fair })
      try {
        const starting = await requireMessage(worker, "starting", 30_000)
        const waitMs = options.windowMs - (nowNs() - starting.at) / 1e6
        if (waitMs > 0) await sleep(waitMs)
        const endNs = nowNs()
        const left = Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs`)[0]!.n)
        const perSec = (options.queued - left) / ((endNs - starting.at) / 1e9)
        return { perSec, top: await statementsByQuery(cluster.admin, name, 6) }
      } finally {
        await stopWorker(worker)
      }
    }
    try {
      const fair = await drainWith(true)
      const unfair = await drainWith(false)
      return {
        queued: options.queued,
        orgs: options.orgs,
        fairPerSec: fair.perSec,
        unfairPerSec: unfair.perSec,
        fairVsUnfair: fair.perSec / unfair.perSec,
        fairTopStatements: fair.top
      }
    } finally {
      await sql.end({ timeout: 5 })
    }
  } finally {
    await cluster.dropDatabase(name)
  }
}

/**
 * An idle pgfiber worker whose stage is rate-limited (`rate`, burst 1) with jobs ready: after the first token
 * is spent it waits for the next one by its timer, so it must send no more statements than an idle worker.
 */
export const idleRateLimited = async (
  cluster: Cluster, subject: Subject, run: number, options: { windowMs: number; warmMs: number; rate: string }
): Promise<IdleResult> => {
  const name = dbName("idlerate", subject.key, run)
  const url = await cluster.createDatabase(name)
  await migratePgfiber(url)
  await fillJobs(url, 10)
  const worker = startWorker(subject, url, "idle", 0, { rate: options.rate })
  try {
    await requireMessage(worker, "ready", 120_000)
    await sleep(options.warmMs)
    await resetStatements(cluster.admin)
    await sleep(options.windowMs)
    const statements = await statementCount(cluster.admin, name)
    const seen = await statementsByQuery(cluster.admin, name, 8)
    return {
      windowMs: options.windowMs,
      statements,
      statementsPer10s: statements / (options.windowMs / 10_000),
      connections: await openConnections(cluster.admin, name),
      rssMiB: rssOf(worker.pid)?.rssMiB ?? null,
      statementsSeen: seen.map((s) => ({ calls: s.calls, query: s.query }))
    }
  } finally {
    await stopWorker(worker)
    await cluster.dropDatabase(name)
  }
}

// ---- raw SQL ceiling ----------------------------------------------------------------------------------------

export interface RawResult {
  /** Bare `insert … select from unnest($payloads)` in batches of 1,000, one connection. */
  readonly enqueuePerSec: number
  /** pgfiber's claim and complete statements, one job per claim, on `concurrency` connections. */
  readonly unbatchedPerSec: number
  /** The same, claiming up to 10 and completing them in one statement, on one connection (pgfiber's shape). */
  readonly batched10PerSec: number
  /** Claims and completes of 100 at a time on 2 connections: what this Postgres does with the table. */
  readonly batched100PerSec: number
}

export const raw = async (cluster: Cluster, run: number, options: { jobs: number }): Promise<RawResult> => {
  const name = `bench_raw_${run}`
  const url = await cluster.createDatabase(name)
  await migratePgfiber(url)
  const sql = connect(url, { max: concurrency, schema: pgfiberSchema })
  try {
    const enqueue = async () => {
      const t0 = nowNs()
      for (let i = 0; i < options.jobs; i += 1000) {
        const payloads = Array.from({ length: Math.min(1000, options.jobs - i) }, (_, k) => JSON.stringify({ seq: i + k }))
        await sql`insert into jobs (stage, payload) select ${queueName}, p::jsonb from unnest(${payloads}::text[]) as p`
      }
      return options.jobs / (msSince(t0) / 1000)
    }
    const drain = async (connections: number, batch: number) => {
      let done = 0
      const t0 = nowNs()
      await Promise.all(Array.from({ length: connections }, async (_, c) => {
        for (;;) {
          const [{ jobs }] = await JobsSql.claimReady(sql, null, queueName, batch, `raw-${c}`, 10_000)
          if (jobs.length === 0) return
          const ids = jobs.map((j) => String(j[claimedAt.id]))
          const leases = jobs.map((j) => Number(j[claimedAt.lease]))
          const fenced = await JobsSql.completeOutcomes(sql, null, pgfiberSchema, {
            ids, leases, outputs: ids.map(() => null), runMs: ids.map(() => null)
          }, null, { defaultMs: 0, byStage: "{}" })
          done += ids.length - fenced.length
        }
      }))
      return done / (msSince(t0) / 1000)
    }
    const enqueuePerSec = await enqueue()
    const unbatchedPerSec = await drain(concurrency, 1)
    await enqueue()
    const batched10PerSec = await drain(1, 10)
    await enqueue()
    const batched100PerSec = await drain(2, 100)
    return { enqueuePerSec, unbatchedPerSec, batched10PerSec, batched100PerSec }
  } finally {
    await sql.end({ timeout: 5 })
    await cluster.dropDatabase(name)
  }
}

// ---- bulk actions and search (pgfiber) ------------------------------------------------------------------------

/** Runs `f` with a PgQueue on its own small pool (what `pgfiber jobs cancel … --yes` runs). */
const withQueue = <A>(url: string, f: (q: Queue.Queue["Type"]) => Effect.Effect<A, unknown>) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function*() {
        const db = yield* Db.make({ url: Redacted.make(url), schema: pgfiberSchema, poolMax: 2 })
        const q = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))
        return yield* f(q)
      })
    )
  )

/** Jobs of another stage that nobody runs, `campaign` 1 on `matching` of them: the bulk action's targets. */
const fillCampaign = async (url: string, stage: string, matching: number, others: number) => {
  const sql = connect(url, { max: 1, schema: pgfiberSchema })
  try {
    for (const [n, campaign] of [[matching, 1], [others, 2]] as const) {
      for (let done = 0; done < n; done += 100_000) {
        await sql`insert into jobs (stage, org_id, payload)
                  select ${stage}, 'org-' || (g % 100), jsonb_build_object('campaign', ${campaign}::int, 'seq', g)
                  from generate_series(1, ${Math.min(100_000, n - done)}::int) g`
      }
    }
  } finally {
    await sql.end({ timeout: 5 })
  }
}

export interface BulkCancelResult {
  /** Rest after each batch, × the batch's time (Bulk.BulkOptions.pace). */
  readonly pace: number
  readonly cancelled: number
  readonly cancelMs: number
  /** The longest and the mean batch statement (1,000 rows), from pg_stat_statements. */
  readonly longestBatchMs: number
  readonly meanBatchMs: number
  readonly drainAlonePerSec: number
  readonly drainDuringPerSec: number
  /** During ÷ alone. */
  readonly ratio: number
}

/**
 * A worker drains the bench stage (`drainJobs` queued) while `cancel` queued jobs of another stage, chosen by a
 * payload filter among twice as many, are bulk-cancelled (Queue.bulk.apply: batches of 1,000, SKIP LOCKED) on
 * their own connection. The drain's rate is measured over the cancel, and over `aloneMs` before it and after it.
 */
export const bulkCancelWhileDraining = async (
  cluster: Cluster, subject: Subject, run: number, options: { cancel: number; drainJobs: number; aloneMs: number; pace: number }
): Promise<BulkCancelResult> => {
  const name = dbName(`bulkcancel_p${options.pace}`, subject.key, run)
  const url = await cluster.createDatabase(name)
  const sql = connect(url, { max: 2, schema: pgfiberSchema })
  const stage = "bench_campaign"
  const remaining = async () =>
    Number((await sql<Array<{ n: string }>>`select count(*)::text as n from jobs where stage = ${queueName}`)[0]!.n)
  try {
    await migratePgfiber(url)
    await fillCampaign(url, stage, options.cancel, options.cancel)
    await fillJobs(url, options.drainJobs)
    await sql`vacuum analyze jobs`
    await cluster.admin`checkpoint`
    const worker = startWorker(subject, url, "bulk", options.drainJobs)
    try {
      await requireMessage(worker, "starting", 30_000)
      // past start-up: the first completions are in
      while ((await remaining()) > options.drainJobs - 1000) await sleep(20)
      const a0 = nowNs()
      const aloneStart = await remaining()
      await sleep(options.aloneMs)
      const aloneEnd = await remaining()
      const aloneMs = msSince(a0)
      await resetStatements(cluster.admin)
      const c0 = nowNs()
      const duringStart = await remaining()
      const result = await withQueue(url, (q) =>
        q.bulk.apply({ stage, payload: { campaign: 1 } }, { kind: "cancel" }, { actor: "bench", pace: options.pace }))
      const duringEnd = await remaining()
      const cancelMs = msSince(c0)
      if (duringEnd === 0) throw new Error(`the drain finished before the bulk cancel did (${Math.round(cancelMs)} ms, ${result.affected} cancelled, ${duringStart} left at its start): give it more jobs`)
      // alone again, after: "alone" is the mean of the windows either side, so a drift in the machine's load during
      // the measurement does not land on one side only
      const b0 = nowNs()
      const afterStart = await remaining()
      await sleep(options.aloneMs)
      const afterEnd = await remaining()
      const afterMs = msSince(b0)
      if (afterEnd === 0) throw new Error("the drain finished before the window after the cancel did: give it more jobs")
      const [longest] = await cluster.admin<Array<{ max_ms: number; mean_ms: number }>>`
        select coalesce(max(max_exec_time), 0)::float8 as max_ms, coalesce(max(mean_exec_time), 0)::float8 as mean_ms
        from pg_stat_statements where query like '%with picked as%'`
      const drainAlonePerSec = ((aloneStart - aloneEnd) / (aloneMs / 1000) + (afterStart - afterEnd) / (afterMs / 1000)) / 2
      const drainDuringPerSec = (duringStart - duringEnd) / (cancelMs / 1000)
      return {
        pace: options.pace,
        cancelled: result.affected,
        cancelMs,
        longestBatchMs: longest?.max_ms ?? 0,
        meanBatchMs: longest?.mean_ms ?? 0,
        drainAlonePerSec,
        drainDuringPerSec,
        ratio: drainDuringPerSec / drainAlonePerSec
      }
    } finally {
      await stopWorker(worker)
    }
  } finally {
    await sql.end({ timeout: 5 })
    await cluster.dropDatabase(name)
  }
}

export interface SearchCost {
  readonly what: string
  readonly medianMs: number
  readonly rows: number
  /** The plan's scan on `jobs`, from EXPLAIN. */
  readonly plan: string
}

export interface SearchResult {
  readonly queued: number
  readonly trigram: boolean
  readonly searches: ReadonlyArray<SearchCost>
  /** Enqueue of 50,000 jobs in batches of 1,000 (JobsSql.insertJobs) into the backlog's table, with and without the payload index (medians of 3, in turns). */
  readonly enqueueWithIndexPerSec: number
  readonly enqueueWithoutIndexPerSec: number
}

/**
 * The search's cost at a backlog of `queued` jobs (payloads `{customer: seq % 1000, region, seq}`, one in 100
 * with a last error): the job list's search (100 rows), a bulk action's preview count, and the dashboard's
 * browse, each the median of 5; and what the payload index costs an enqueue.
 */
export const searchAtBacklog = async (cluster: Cluster, queued: number): Promise<SearchResult> => {
  const name = "bench_search"
  const url = await cluster.createDatabase(name)
  const sql = connect(url, { max: 1, schema: pgfiberSchema })
  try {
    await migratePgfiber(url)
    for (let done = 0; done < queued; done += 100_000) {
      await sql`insert into jobs (stage, org_id, payload, last_error, attempts)
                select case when g % 10 = 0 then 'bench_other' else ${queueName} end, 'org-' || (g % 100),
                       jsonb_build_object('customer', g % 1000, 'region', case when g % 2 = 0 then 'eu' else 'us' end, 'seq', ${done}::int + g),
                       case when g % 100 = 0 then 'upstream timeout after 30 s (attempt ' || (g / 100 % 5) || ')' end,
                       case when g % 100 = 0 then 1 else 0 end
                from generate_series(1, ${Math.min(100_000, queued - done)}::int) g`
    }
    await sql`vacuum analyze jobs`
    const trigram = (await sql`select 1 from pg_indexes where indexname = 'jobs_last_error' and schemaname = ${pgfiberSchema}`).length > 0
    const timed = async (what: string, query: () => Promise<ReadonlyArray<unknown>>, explain: () => Promise<ReadonlyArray<Record<string, string>>>) => {
      const ms: Array<number> = []
      let rows = 0
      for (let i = 0; i < 5; i++) {
        const t0 = nowNs()
        rows = (await query()).length
        ms.push(msSince(t0))
      }
      const lines = (await explain()).map((r) => Object.values(r)[0]!)
      const plan = lines.filter((l) => /Scan|Bitmap/.test(l)).map((l) => l.trim().replace(/\s+\(cost.*$/, "")).join(" / ")
      return { what, medianMs: median(ms), rows, plan }
    }
    const count = (f: Parameters<typeof BulkSql.countApplicable>[2]) => [
      () => BulkSql.countApplicable(sql, null, f, { kind: "cancel" }),
      () => sql`explain ${BulkSql.countApplicable(sql, null, f, { kind: "cancel" })}`
    ] as const
    const list = (f: Parameters<typeof BulkSql.searchJobs>[2]) => [
      () => BulkSql.searchJobs(sql, null, f, null, null, 100),
      () => sql`explain ${BulkSql.searchJobs(sql, null, f, null, null, 100)}`
    ] as const
    const browse = (payload: string | null, error: string | null) => {
      const f = { stage: null, status: null, org: null, subject: null, since: null, until: null, id: null, before: null, payload, error }
      return [() => BrowseSql.browseJobs(sql, f, 51), () => sql`explain ${BrowseSql.browseJobs(sql, f, 51)}`] as const
    }
    const searches: Array<SearchCost> = []
    const cases: ReadonlyArray<readonly [string, readonly [() => Promise<ReadonlyArray<unknown>>, () => Promise<ReadonlyArray<Record<string, string>>>]]> = [
      ["GET /jobs?payload=customer=42 (100 rows of ~1,000)", list({ payload: { customer: 42 } })],
      ["GET /jobs?stage=bench&payload=customer=42", list({ stage: queueName, payload: { customer: 42 } })],
      ["GET /jobs?payload=region=eu (100 rows of ~500,000)", list({ payload: { region: "eu" } })],
      ["GET /jobs?error=timeout (100 rows of ~10,000)", list({ error: "timeout" })],
      ["GET /jobs?error=attempt 3 (100 rows of ~2,000)", list({ error: "attempt 3" })],
      ["bulk preview: payload customer=42 (count ~1,000)", count({ payload: { customer: 42 } })],
      ["bulk preview: stage bench, payload region=eu (count ~450,000)", count({ stage: queueName, payload: { region: "eu" } })],
      ["bulk preview: error timeout (count ~10,000)", count({ error: "timeout" })],
      ["dashboard browse: payload customer=42 (51 rows)", browse(JSON.stringify({ customer: 42 }), null)],
      ["dashboard browse: error attempt 3 (51 rows)", browse(null, "attempt 3")]
    ]
    for (const [what, [query, explain]] of cases) searches.push(await timed(what, query, explain))

    // what the payload index costs an enqueue into this table: 50 batches of 1,000, with it, then without it
    const enqueueRate = async () => {
      const t0 = nowNs()
      for (let b = 0; b < 50; b++) {
        const jobs = Array.from({ length: 1000 }, (_, i) => ({
          stage: "bench_enqueue", payloadJson: JSON.stringify({ customer: i % 1000, region: "eu", seq: b * 1000 + i }), payload: null,
          orgId: null, subjectId: null, priority: 50, delayMs: 0, runAt: null, maxAttempts: 5, dedupeKey: null, dedupeMode: "first" as const, timeoutMs: null,
          dependsOn: [], uniqueForMs: null, batchId: null
        }))
        await JobsSql.insertJobs(sql, null, jobs)
      }
      return 50_000 / (msSince(t0) / 1000)
    }
    // with and without the index in turns (three each, medians), each from a checkpoint; the index rebuilt between
    const withIndex: Array<number> = []
    const withoutIndex: Array<number> = []
    for (let round = 0; round < 3; round++) {
      await sql`checkpoint`
      withIndex.push(await enqueueRate())
      await sql`drop index jobs_payload`
      await sql`checkpoint`
      withoutIndex.push(await enqueueRate())
      await sql`create index jobs_payload on jobs using gin (payload jsonb_path_ops)`
    }
    const enqueueWithIndexPerSec = median(withIndex)
    const enqueueWithoutIndexPerSec = median(withoutIndex)
    return { queued, trigram, searches, enqueueWithIndexPerSec, enqueueWithoutIndexPerSec }
  } finally {
    await sql.end({ timeout: 5 })
    await cluster.dropDatabase(name)
  }
}
