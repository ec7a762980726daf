/**
 * What reading the event log costs per event, on each side of the wire: a real drain of `--jobs` jobs (an
 * in-process worker, async no-op handler, concurrency 10) fills the log, then the whole log is read from the
 * beginning `--rounds` times, as the process's shared reader reads it (`EventLog.readRows`, pages of 5,000), with
 * nothing else running on the server. Prints this process's and the server's CPU per 1,000 events and per 1,000
 * jobs (CPU time, so steadier than a drain's rate on a loaded machine). A follower's cost to a drain is roughly
 * these two figures per 1,000 jobs against the drain's own (bench/eventsFollow.ts).
 *
 *   node --import tsx bench/eventsReadCost.ts [--jobs 20000] [--rounds 10] [--keep]
 *
 * `--keep`: leaves the server running with the filled log afterwards and prints how to reach it (to try a
 * statement by hand), until interrupted.
 */
import { Context, Duration, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as EventLog from "../packages/pgfiber/src/queue/EventLog.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import * as Os from "node:os"
import { connect, log, median, option, serverCpuMsOf, sleep, startCluster } from "./lib.js"
import { migratePgfiber } from "./workloads.js"

const args = process.argv.slice(2)
const jobs = Number(option("jobs") ?? 20_000)
const rounds = Number(option("rounds") ?? 10)
const keep = args.includes("--keep")

const stage = Stage.make({
  name: "bench_read",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 10,
  handler: () => Effect.promise(async () => undefined)
})

const main = async () => {
  const cluster = await startCluster({ flags: ["-c", "shared_buffers=512MB"] })
  const scope = Effect.runSync(Scope.make())
  try {
    const url = await cluster.createDatabase("bench_read")
    await migratePgfiber(url)
    const build = <A, E>(layer: Layer.Layer<A, E, never>) => Effect.runPromise(Layer.buildWithScope(layer, scope))
    const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 6 }))
    const base = await build(Layer.mergeAll(PgQueue.layer(), EventLog.layer).pipe(Layer.provideMerge(dbLayer)))
    const queue = Context.get(base, Queue.Queue)
    const eventLog = Context.get(base, EventLog.EventLog)
    for (let i = 0; i < jobs; i += 1000) {
      await Effect.runPromise(queue.enqueue(Array.from({ length: Math.min(1000, jobs - i) }, (_, n) => ({ stage: stage.name, payload: { n } }))))
    }
    const workerScope = Effect.runSync(Scope.make())
    await Effect.runPromise(Layer.buildWithScope(
      Worker.layer([stage], { workerId: "bench-read", shutdownGrace: Duration.seconds(2), sweepInterval: Duration.seconds(60), pollInterval: Duration.seconds(2), concurrency: {} })
        .pipe(Layer.provide(Layer.succeedContext(base))),
      workerScope
    ))
    const sql = connect(url, { max: 1, schema: "pgfiber" })
    for (;;) {
      const [row] = await sql<Array<{ n: number }>>`select count(*)::int as n from jobs`
      if (row!.n === 0) break
      await sleep(50)
    }
    await Effect.runPromise(Scope.close(workerScope, Exit.void))
    const [shape] = await sql<Array<{ rows: number; events: number }>>`select count(*)::int as rows, sum(cardinality(job_ids))::int as events from job_events`
    await sql.end({ timeout: 5 })
    log(`the log: ${shape!.events} events in ${shape!.rows} rows for ${jobs} jobs`)

    const client: Array<number> = [], server: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      const cpu0 = process.cpuUsage()
      const server0 = serverCpuMsOf(cluster.dataDir) ?? 0
      let cursor = EventLog.beginning
      let events = 0
      for (;;) {
        const page = await Effect.runPromise(eventLog.readRows(cursor, {}, 5000))
        for (const row of page.rows) events += row.events.length
        cursor = page.next
        if (!page.full) break
      }
      const cpu = process.cpuUsage(cpu0)
      const serverMs = (serverCpuMsOf(cluster.dataDir) ?? 0) - server0
      const clientMs = (cpu.user + cpu.system) / 1000
      client.push(clientMs / (jobs / 1000))
      server.push(serverMs / (jobs / 1000))
      log(`round ${r + 1}: ${events} events; this process ${(clientMs / events * 1000).toFixed(2)} µs and the server ${(serverMs / events * 1000).toFixed(2)} µs per event (load ${Os.loadavg()[0]!.toFixed(2)})`)
    }
    log(`median per 1,000 jobs (${(shape!.events / jobs).toFixed(2)} events per job): this process ${median(client).toFixed(2)} ms, the server ${median(server).toFixed(2)} ms of CPU`)
    if (keep) {
      log(`kept: psql '${url}' (schema pgfiber); interrupt to stop`)
      await new Promise((resolve) => process.once("SIGINT", resolve))
    }
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    await cluster.close()
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
