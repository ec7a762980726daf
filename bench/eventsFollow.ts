/**
 * What followers of the event log cost the drain: 20,000 jobs (enqueued in batches of 1,000), drained by an
 * in-process worker (async no-op handler, concurrency 10), with no follower, with one `Events.follow` (what
 * each `GET /events` client is) and with three, in the same process, interleaved, in a fresh database each time.
 * Prints per run and as medians: the drain rate, this process's and the server's CPU per 1,000 jobs (steadier
 * than the rate on a loaded machine), the event-log statements the followers sent per 1,000 jobs, and the
 * 1-minute load.
 *
 * Mode `sse` is a subscriber as users open one: the service (`pgfiber start`, the compiled CLI: run `npm run
 * build` first) in a process of its own on the same database, started before the jobs are enqueued, and an SSE
 * client here on `GET /events` with an org's key from the log's beginning (`Last-Event-ID: 0`), open while they
 * are enqueued, that counts the events it receives (it does not parse them: a real subscriber is elsewhere). Its
 * CPU figures add the service's process. Mode `svc` runs the service with no client: what the service costs the
 * drain by itself. Every mode drains once the server (and the service) have been quiet for a second.
 *
 *   node --import tsx bench/eventsFollow.ts [--rounds 4] [--jobs 20000] [--modes 0,1,3,svc,sse] [--statements]
 */
import { Context, Duration, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope, Stream } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as EventFeed from "../packages/pgfiber/src/runtime/EventFeed.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import * as Child from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Os from "node:os"
import * as Path from "node:path"
import * as ApiKeys from "../packages/service/src/auth/ApiKeys.js"
import { connect, cpuMsOf, statementsByQuery, type Sql, freePort, log, median, msSince, nowNs, option, serverCpuMsOf, sleep, startCluster } from "./lib.js"

const rounds = Number(option("rounds") ?? 4)
const jobs = Number(option("jobs") ?? 20_000)
/** How many followers each mode runs (0: none), or `svc` / `sse` (the service in a process of its own; with an SSE client). */
type Mode = number | "svc" | "sse"
const modes: Array<Mode> = (option("modes") ?? "0,1,3").split(",").map((m) => (m === "sse" || m === "svc" ? m : Number(m)))
const org = "bench-org"
/**
 * `--statements`: the cluster keeps pg_stat_statements, and each run prints its database's costliest statements
 * from the worker's start to the last job gone (execution time, which a loaded machine stretches: not CPU).
 */
const showStatements = process.argv.includes("--statements")

const stage = Stage.make({
  name: "bench_follow",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 10,
  handler: () => Effect.promise(async () => undefined)
})

/** The followers' statements: the event log's reads and cursors (every one names the snapshot's xmin). */
const isFollowerStatement = (query: string) => query.includes("pg_snapshot_xmin")

/** `pgfiber start` on the bench's database, in a process of its own; resolves once /healthz answers. */
const startService = async (url: string) => {
  const port = await freePort()
  const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "pgfiber-bench-svc-"))
  // BENCH_SERVICE_PROFILE=DIR: a CPU profile of the service's process, written when it stops
  const profile = process.env["BENCH_SERVICE_PROFILE"] ? ["--cpu-prof", "--cpu-prof-dir", process.env["BENCH_SERVICE_PROFILE"]] : []
  const child = Child.spawn(process.execPath, [...profile, Path.resolve(import.meta.dirname, "../packages/service/dist/cli.js"), "start"], {
    env: { ...process.env, DATABASE_URL: url, HTTP_HOST: "127.0.0.1", HTTP_PORT: String(port), ADMIN_PORT: "0", LOG_LEVEL: "warning", PGFIBER_DATA_DIR: dataDir },
    stdio: ["ignore", "ignore", "inherit"]
  })
  const base = `http://127.0.0.1:${port}`
  for (const deadline = Date.now() + 120_000; ;) {
    if (child.exitCode !== null) throw new Error(`pgfiber start exited with ${child.exitCode}`)
    const ok = await fetch(`${base}/healthz`).then((r) => r.ok, () => false)
    if (ok) break
    if (Date.now() > deadline) throw new Error("pgfiber start did not answer /healthz within 2 minutes")
    await sleep(100)
  }
  return {
    base,
    pid: child.pid!,
    stop: async () => {
      const exited = new Promise((resolve) => child.once("exit", resolve))
      child.kill("SIGTERM")
      await exited
      Fs.rmSync(dataDir, { recursive: true, force: true })
    }
  }
}

/**
 * An SSE client from the log's beginning: counts the events it receives (frames with an id) in the raw bytes
 * (node:http, no decoding: a real subscriber is elsewhere, and its cost is not the drain's).
 */
const openSse = async (base: string, token: string) => {
  const url = new URL(`${base}/events`)
  const marker = Buffer.from("\nid: ")
  let events = 0
  // the first frame starts the body: as if after a newline
  let tail: Buffer = Buffer.from("\n")
  const request = Http.get({
    host: url.hostname,
    port: url.port,
    path: url.pathname,
    headers: { authorization: `Bearer ${token}`, accept: "text/event-stream", "last-event-id": "0" }
  })
  const response = await new Promise<Http.IncomingMessage>((resolve, reject) => {
    request.once("response", resolve)
    request.once("error", reject)
  })
  if (response.statusCode !== 200) throw new Error(`GET /events answered ${response.statusCode}`)
  response.on("data", (chunk: Buffer) => {
    const bytes = tail.length > 0 ? Buffer.concat([tail, chunk]) : chunk
    let at = 0
    for (;;) {
      const i = bytes.indexOf(marker, at)
      if (i < 0) break
      events++
      at = i + marker.length
    }
    tail = bytes.subarray(Math.max(at, bytes.length - marker.length + 1))
  })
  response.on("error", () => undefined)
  return { received: () => events, close: async () => void request.destroy() }
}

/**
 * Waits until the server (and the service, when one runs) have been quiet for a second: under 10 ms of the
 * server's CPU and 5 ms of the service's in each half second. A service just started is still warming up (its
 * stages' first claims, schedules, compilation): a user's has run for a while. Gives up after a minute, saying so.
 */
const quiet = async (dataDir: string, servicePid: number | null) => {
  let calm = 0
  let [server, service] = [serverCpuMsOf(dataDir) ?? 0, servicePid === null ? 0 : (cpuMsOf(servicePid) ?? 0)]
  for (const deadline = Date.now() + 60_000; calm < 2;) {
    if (Date.now() > deadline) return log("the server or the service was not quiet within a minute: draining anyway")
    await sleep(500)
    const [nextServer, nextService] = [serverCpuMsOf(dataDir) ?? 0, servicePid === null ? 0 : (cpuMsOf(servicePid) ?? 0)]
    calm = nextServer - server < 10 && nextService - service < 5 ? calm + 1 : 0
    ;[server, service] = [nextServer, nextService]
  }
}

const drainOnce = async (url: string, dataDir: string, mode: Mode, admin: Sql, database: string) => {
  const followers = typeof mode === "number" ? mode : 0
  const scope = Effect.runSync(Scope.make())
  const build = <A, E>(layer: Layer.Layer<A, E, never>) => Effect.runPromise(Layer.buildWithScope(layer, scope))
  let statements = 0
  const onStatement = (query: string) => {
    if (isFollowerStatement(query)) statements++
  }
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 6, onStatement }))
  const base = await build(Layer.mergeAll(PgQueue.layer(), EventLog.layer).pipe(Layer.provideMerge(dbLayer)))
  const queue = Context.get(base, Queue.Queue)
  // the service runs before the jobs come, as a user's does, and its client is open while they are enqueued
  const service = typeof mode === "number" ? null : await startService(url)
  if (service !== null) await quiet(dataDir, service.pid)
  const token = service === null ? null : await Effect.runPromise(
    ApiKeys.make.pipe(Effect.flatMap((keys) => keys.create({ orgId: org })), Effect.provide(Layer.succeedContext(base)))
  )
  const sse = service === null || token === null || mode !== "sse" ? null : await openSse(service.base, Redacted.value(token.token))
  for (let i = 0; i < jobs; i += 1000) {
    await Effect.runPromise(queue.enqueue(Array.from({ length: Math.min(1000, jobs - i) }, (_, n) => ({ stage: stage.name, orgId: org, payload: { n } }))))
  }
  if (sse !== null) {
    // the client has had every Enqueued before the drain starts: the drain's window holds the drain's events
    for (const deadline = Date.now() + 120_000; sse.received() < jobs && Date.now() < deadline;) await sleep(20)
    if (sse.received() < jobs) log(`the SSE client had ${sse.received()} of ${jobs} Enqueued events after 2 minutes: draining anyway`)
  }
  // every mode starts its drain on a quiet server (and service): no startup or insert work left in the window
  await quiet(dataDir, service?.pid ?? null)
  const serviceCpuAtStart = service === null ? 0 : (cpuMsOf(service.pid) ?? 0)
  const seen = Array.from({ length: followers }, () => 0)
  const options: Worker.WorkerOptions = {
    workerId: `bench-${followers}`,
    shutdownGrace: Duration.seconds(2),
    sweepInterval: Duration.seconds(60),
    pollInterval: Duration.seconds(2),
    concurrency: {}
  }
  const statementsAtStart = statements
  if (showStatements) await admin`select public.pg_stat_statements_reset()`
  const started = nowNs()
  const cpuAtStart = process.cpuUsage()
  const serverAtStart = serverCpuMsOf(dataDir) ?? 0
  const worker = await build(Worker.layer([stage], options).pipe(Layer.provide(Layer.succeedContext(base))))
  if (followers > 0) {
    const feed = await build(EventFeed.layer.pipe(Layer.provide(Layer.succeedContext(Context.merge(base, worker)))))
    for (let f = 0; f < followers; f++) {
      Effect.runFork(EventFeed.follow({}, { from: "beginning" }).pipe(
        Stream.runForEach(() => Effect.sync(() => void seen[f]!++)),
        Effect.provide(feed),
        Effect.forkIn(scope),
        Effect.flatMap(Fiber.join)
      ))
    }
  }
  const sql = connect(url, { max: 1, schema: "pgfiber" })
  // drained once no job is left: one index probe a look (a count of the table every 20 ms cost the server as much
  // as 8 ms per 1,000 jobs, a fifth of the drain's own statements, in every mode)
  for (;;) {
    const [row] = await sql<Array<{ left: boolean }>>`select exists (select 1 from jobs) as left`
    if (!row!.left) break
    await sleep(20)
  }
  const ms = msSince(started)
  const cpu = process.cpuUsage(cpuAtStart)
  // the drain's statements (from the worker's start to the last job gone), read before the client catches up
  const statementLines = !showStatements ? [] : (await statementsByQuery(admin, database, 8)).map((s) =>
    `  ${s.calls} calls, ${s.total_ms.toFixed(0)} ms (${(s.total_ms / (jobs / 1000)).toFixed(2)} ms per 1k jobs): ${s.query}`)
  const serviceCpu = service === null ? 0 : (cpuMsOf(service.pid) ?? 0) - serviceCpuAtStart
  // the service's CPU until its client had every event: what the SSE path costs per event, also the part after
  // the drain (the client may still be catching up when the last job completes)
  let serviceCpuAll = serviceCpu
  if (sse !== null) {
    // every event of the drain reaches the client (3 per job, the enqueued ones read from the log's beginning)
    for (const deadline = Date.now() + 120_000; sse.received() < jobs * 3 && Date.now() < deadline;) await sleep(20)
    if (sse.received() < jobs * 3) log(`the SSE client had ${sse.received()} of ${jobs * 3} events 2 minutes after the drain: its figures are short`)
    serviceCpuAll = (cpuMsOf(service!.pid) ?? 0) - serviceCpuAtStart
    seen.push(sse.received())
    await sse.close()
  }
  if (service !== null) await service.stop()
  for (const line of statementLines) log(line)
  const serverMs = (serverCpuMsOf(dataDir) ?? 0) - serverAtStart
  const statementsPer1k = (statements - statementsAtStart) / (jobs / 1000)
  await sql.end({ timeout: 5 })
  await Effect.runPromise(Scope.close(scope, Exit.void))
  return { rate: (jobs / ms) * 1000, seen, cpuPer1k: ((cpu.user + cpu.system) / 1000 + serviceCpu) / (jobs / 1000), servicePer1k: serviceCpu / (jobs / 1000), serviceAllPer1k: serviceCpuAll / (jobs / 1000), serverPer1k: serverMs / (jobs / 1000), statementsPer1k }
}

const load1 = () => Os.loadavg()[0]!

const main = async () => {
  const cluster = await startCluster({
    flags: ["-c", "shared_buffers=512MB", ...(showStatements ? ["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=top"] : [])]
  })
  const results = new Map(modes.map((m) => [m, { rate: [] as Array<number>, cpu: [] as Array<number>, service: [] as Array<number>, serviceAll: [] as Array<number>, server: [] as Array<number>, statements: [] as Array<number>, load: [] as Array<number> }]))
  const label = (m: Mode) =>
    m === "sse" ? "an SSE client of the service" : m === "svc" ? "the service, no client" : m === 0 ? "no follower" : m === 1 ? "1 follower" : `${m} followers`
  try {
    for (let r = 0; r < rounds; r++) {
      // rotate which goes first
      const order = modes.map((_, i) => modes[(i + r) % modes.length]!)
      for (const mode of order) {
        const name = `bench_follow_${r}_${mode}`
        const url = await cluster.createDatabase(name)
        const { migratePgfiber } = await import("./workloads.js")
        await migratePgfiber(url)
        const load = load1()
        const { cpuPer1k, rate, seen, serviceAllPer1k, servicePer1k, serverPer1k, statementsPer1k } = await drainOnce(url, cluster.dataDir, mode, cluster.admin, name)
        const m = results.get(mode)!
        m.rate.push(rate)
        m.cpu.push(cpuPer1k)
        m.service.push(servicePer1k)
        m.serviceAll.push(serviceAllPer1k)
        m.server.push(serverPer1k)
        m.statements.push(statementsPer1k)
        m.load.push(load)
        log(`round ${r + 1} ${label(mode)} (load ${load.toFixed(2)}): drain ${Math.round(rate)} jobs/s, this process${typeof mode === "string" ? ` and the service's (${servicePer1k.toFixed(0)} ms of it; ${serviceAllPer1k.toFixed(1)} ms until its client had every event)` : ""} ${cpuPer1k.toFixed(0)} ms and the server ${serverPer1k.toFixed(0)} ms CPU per 1k jobs${mode !== 0 ? `, ${statementsPer1k.toFixed(1)} follower statements per 1k jobs (they read ${seen.join(", ")} events)` : ""}`)
        await cluster.dropDatabase(name)
      }
    }
    const base = median(results.get(modes[0]!)!.rate)
    for (const mode of modes) {
      const m = results.get(mode)!
      const rate = median(m.rate)
      log(`median ${label(mode)}: drain ${Math.round(rate)} jobs/s (${((rate / base - 1) * 100).toFixed(1)} % against ${label(modes[0]!)}), CPU per 1k jobs this process ${median(m.cpu).toFixed(0)} ms${typeof mode === "string" ? ` (the service ${median(m.service).toFixed(1)} ms; ${median(m.serviceAll).toFixed(1)} ms until its client had every event)` : ""}, server ${median(m.server).toFixed(0)} ms, follower statements per 1k jobs ${median(m.statements).toFixed(1)}, load ${median(m.load).toFixed(2)}`)
    }
  } finally {
    await cluster.close()
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
