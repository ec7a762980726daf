/**
 * What a follower of the event log costs the drain: 20,000 jobs (enqueued in batches of 1,000), drained by an
 * in-process worker (async no-op handler, concurrency 10), with no follower and with one `Events.follow` (what
 * each `GET /events` client is) in the same process, alternating, in a fresh database each time. Prints the
 * drain rate of each run and the medians.
 *
 *   node --import tsx bench/eventsFollow.ts [--rounds 4] [--jobs 20000]
 */
import { Context, Duration, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope, Stream } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as EventFeed from "../packages/pgfiber/src/runtime/EventFeed.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import { connect, log, median, msSince, nowNs, serverCpuMsOf, sleep, startCluster } from "./lib.js"

const args = process.argv.slice(2)
const option = (name: string) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : undefined
}
const rounds = Number(option("rounds") ?? 4)
const jobs = Number(option("jobs") ?? 20_000)

const stage = Stage.make({
  name: "bench_follow",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 10,
  handler: () => Effect.promise(async () => undefined)
})

const drainOnce = async (url: string, dataDir: string, follow: boolean) => {
  const scope = Effect.runSync(Scope.make())
  const build = <A, E>(layer: Layer.Layer<A, E, never>) => Effect.runPromise(Layer.buildWithScope(layer, scope))
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 6 }))
  const base = await build(Layer.mergeAll(PgQueue.layer(), EventLog.layer).pipe(Layer.provideMerge(dbLayer)))
  const queue = Context.get(base, Queue.Queue)
  for (let i = 0; i < jobs; i += 1000) {
    await Effect.runPromise(queue.enqueue(Array.from({ length: Math.min(1000, jobs - i) }, (_, n) => ({ stage: stage.name, payload: { n } }))))
  }
  let seen = 0
  const options: Worker.WorkerOptions = {
    workerId: `bench-${follow ? "follow" : "none"}`,
    shutdownGrace: Duration.seconds(2),
    sweepInterval: Duration.seconds(60),
    pollInterval: Duration.seconds(2),
    concurrency: {}
  }
  const started = nowNs()
  const cpuAtStart = process.cpuUsage()
  const serverAtStart = serverCpuMsOf(dataDir) ?? 0
  const worker = await build(Worker.layer([stage], options).pipe(Layer.provide(Layer.succeedContext(base))))
  if (follow) {
    const feed = await build(EventFeed.layer.pipe(Layer.provide(Layer.succeedContext(Context.merge(base, worker)))))
    Effect.runFork(EventFeed.follow({}, { from: "beginning" }).pipe(
      Stream.runForEach(() => Effect.sync(() => void seen++)),
      Effect.provide(feed),
      Effect.forkIn(scope),
      Effect.flatMap(Fiber.join)
    ))
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
  await sql.end({ timeout: 5 })
  await Effect.runPromise(Scope.close(scope, Exit.void))
  return { rate: (jobs / ms) * 1000, seen, cpuPer1k: ((cpu.user + cpu.system) / 1000) / (jobs / 1000), serverPer1k: serverMs / (jobs / 1000) }
}

const main = async () => {
  const cluster = await startCluster({ flags: ["-c", "shared_buffers=512MB"] })
  const rates: Record<string, Array<number>> = { none: [], follow: [] }
  const cpus: Record<string, Array<number>> = { none: [], follow: [] }
  const servers: Record<string, Array<number>> = { none: [], follow: [] }
  try {
    for (let r = 0; r < rounds; r++) {
      // alternate which goes first
      for (const mode of r % 2 === 0 ? ["none", "follow"] : ["follow", "none"]) {
        const url = await cluster.createDatabase(`bench_follow_${r}_${mode}`)
        const { migratePgfiber } = await import("./workloads.js")
        await migratePgfiber(url)
        const { cpuPer1k, rate, seen, serverPer1k } = await drainOnce(url, cluster.dataDir, mode === "follow")
        rates[mode]!.push(rate)
        cpus[mode]!.push(cpuPer1k)
        servers[mode]!.push(serverPer1k)
        log(`round ${r + 1} ${mode}: drain ${Math.round(rate)} jobs/s, this process ${cpuPer1k.toFixed(0)} ms and the server ${serverPer1k.toFixed(0)} ms CPU per 1k jobs${mode === "follow" ? ` (the follower read ${seen} events)` : ""}`)
        await cluster.dropDatabase(`bench_follow_${r}_${mode}`)
      }
    }
    const a = median(rates.none!)
    const b = median(rates.follow!)
    log(`median drain: no follower ${Math.round(a)} jobs/s, one follower ${Math.round(b)} jobs/s (${((b / a - 1) * 100).toFixed(1)} %)`)
    log(`median CPU per 1k jobs: this process ${median(cpus.none!).toFixed(0)} → ${median(cpus.follow!).toFixed(0)} ms, the server ${median(servers.none!).toFixed(0)} → ${median(servers.follow!).toFixed(0)} ms`)
  } finally {
    await cluster.close()
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
