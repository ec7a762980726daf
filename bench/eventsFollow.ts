/**
 * What followers of the event log cost the drain: 20,000 jobs (enqueued in batches of 1,000), drained by an
 * in-process worker (async no-op handler, concurrency 10), with no follower, with one `Events.follow` (what
 * each `GET /events` client is) and with three, in the same process, interleaved, in a fresh database each time.
 * Prints per run and as medians: the drain rate, this process's and the server's CPU per 1,000 jobs (steadier
 * than the rate on a loaded machine), the event-log statements the followers sent per 1,000 jobs, and the
 * 1-minute load.
 *
 *   node --import tsx bench/eventsFollow.ts [--rounds 4] [--jobs 20000] [--modes 0,1,3]
 */
import { Context, Duration, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope, Stream } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as EventFeed from "../packages/pgfiber/src/runtime/EventFeed.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import * as Os from "node:os"
import { connect, log, median, msSince, nowNs, serverCpuMsOf, sleep, startCluster } from "./lib.js"

const args = process.argv.slice(2)
const option = (name: string) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : undefined
}
const rounds = Number(option("rounds") ?? 4)
const jobs = Number(option("jobs") ?? 20_000)
/** How many followers each mode runs (0: none). */
const modes = (option("modes") ?? "0,1,3").split(",").map(Number)

const stage = Stage.make({
  name: "bench_follow",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 10,
  handler: () => Effect.promise(async () => undefined)
})

/** The followers' statements: the event log's reads and cursors (every one names the snapshot's xmin). */
const isFollowerStatement = (query: string) => query.includes("pg_snapshot_xmin")

const drainOnce = async (url: string, dataDir: string, followers: number) => {
  const scope = Effect.runSync(Scope.make())
  const build = <A, E>(layer: Layer.Layer<A, E, never>) => Effect.runPromise(Layer.buildWithScope(layer, scope))
  let statements = 0
  const onStatement = (query: string) => {
    if (isFollowerStatement(query)) statements++
  }
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 6, onStatement }))
  const base = await build(Layer.mergeAll(PgQueue.layer(), EventLog.layer).pipe(Layer.provideMerge(dbLayer)))
  const queue = Context.get(base, Queue.Queue)
  for (let i = 0; i < jobs; i += 1000) {
    await Effect.runPromise(queue.enqueue(Array.from({ length: Math.min(1000, jobs - i) }, (_, n) => ({ stage: stage.name, payload: { n } }))))
  }
  const seen = Array.from({ length: followers }, () => 0)
  const options: Worker.WorkerOptions = {
    workerId: `bench-${followers}`,
    shutdownGrace: Duration.seconds(2),
    sweepInterval: Duration.seconds(60),
    pollInterval: Duration.seconds(2),
    concurrency: {}
  }
  const statementsAtStart = statements
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
  for (;;) {
    const [row] = await sql<Array<{ n: number }>>`select count(*)::int as n from jobs`
    if (row!.n === 0) break
    await sleep(20)
  }
  const ms = msSince(started)
  const cpu = process.cpuUsage(cpuAtStart)
  const serverMs = (serverCpuMsOf(dataDir) ?? 0) - serverAtStart
  const statementsPer1k = (statements - statementsAtStart) / (jobs / 1000)
  await sql.end({ timeout: 5 })
  await Effect.runPromise(Scope.close(scope, Exit.void))
  return { rate: (jobs / ms) * 1000, seen, cpuPer1k: ((cpu.user + cpu.system) / 1000) / (jobs / 1000), serverPer1k: serverMs / (jobs / 1000), statementsPer1k }
}

const load1 = () => Os.loadavg()[0]!

const main = async () => {
  const cluster = await startCluster({ flags: ["-c", "shared_buffers=512MB"] })
  const results = new Map(modes.map((m) => [m, { rate: [] as Array<number>, cpu: [] as Array<number>, server: [] as Array<number>, statements: [] as Array<number>, load: [] as Array<number> }]))
  const label = (m: number) => (m === 0 ? "no follower" : m === 1 ? "1 follower" : `${m} followers`)
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
        const { cpuPer1k, rate, seen, serverPer1k, statementsPer1k } = await drainOnce(url, cluster.dataDir, mode)
        const m = results.get(mode)!
        m.rate.push(rate)
        m.cpu.push(cpuPer1k)
        m.server.push(serverPer1k)
        m.statements.push(statementsPer1k)
        m.load.push(load)
        log(`round ${r + 1} ${label(mode)} (load ${load.toFixed(2)}): drain ${Math.round(rate)} jobs/s, this process ${cpuPer1k.toFixed(0)} ms and the server ${serverPer1k.toFixed(0)} ms CPU per 1k jobs${mode > 0 ? `, ${statementsPer1k.toFixed(1)} follower statements per 1k jobs (they read ${seen.join(", ")} events)` : ""}`)
        await cluster.dropDatabase(name)
      }
    }
    const base = median(results.get(modes[0]!)!.rate)
    for (const mode of modes) {
      const m = results.get(mode)!
      const rate = median(m.rate)
      log(`median ${label(mode)}: drain ${Math.round(rate)} jobs/s (${((rate / base - 1) * 100).toFixed(1)} % against ${label(modes[0]!)}), CPU per 1k jobs this process ${median(m.cpu).toFixed(0)} ms, server ${median(m.server).toFixed(0)} ms, follower statements per 1k jobs ${median(m.statements).toFixed(1)}, load ${median(m.load).toFixed(2)}`)
    }
  } finally {
    await cluster.close()
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
