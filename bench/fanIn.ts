/**
 * A fan-in's release: a parent waiting on 10,000 children (`Queue.enqueueFlow`), drained by one in-process worker
 * (children: an async handler awaiting 2 ms of I/O, concurrency 16; the parent: concurrency 1), in a fresh database
 * each run. Measures the time from the last child's completion (its `finished_at` in the history) to the parent's
 * start (its `started_at`): the release happens in the statement that settles the last child, so this is that
 * settle, the NOTIFY and the parent's claim. Prints each run and the p50.
 *
 *   node --import tsx bench/fanIn.ts [--runs 5] [--children 10000]
 */
import { Duration, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import { connect, log, median, option, sleep, startCluster } from "./lib.js"

const runs = Number(option("runs") ?? 5)
const children = Number(option("children") ?? 10_000)

const child = Stage.make({
  name: "bench_fan_child",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 16,
  handler: () => Effect.promise(() => sleep(2))
})

const parent = Stage.make({
  name: "bench_fan_parent",
  payload: Schema.Struct({}),
  concurrency: 1,
  handler: () => Effect.void
})

const fanInOnce = async (url: string) => {
  const scope = Effect.runSync(Scope.make())
  const build = <A, E>(layer: Layer.Layer<A, E, never>) => Effect.runPromise(Layer.buildWithScope(layer, scope))
  const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(url), schema: "pgfiber", poolMax: 6 }))
  const base = await build(PgQueue.layer().pipe(Layer.provideMerge(dbLayer)))
  const flow = await Effect.runPromise(Queue.enqueueFlow({
    job: { stage: parent.name, payload: {} },
    children: Array.from({ length: children }, (_, n) => ({ job: { stage: child.name, payload: { n } } }))
  }).pipe(Effect.provide(base)))
  const options: Worker.WorkerOptions = {
    workerId: "bench-fan-in",
    shutdownGrace: Duration.seconds(2),
    sweepInterval: Duration.seconds(60),
    pollInterval: Duration.seconds(2),
    concurrency: {}
  }
  await build(Worker.layer([child, parent], options).pipe(Layer.provide(Layer.succeedContext(base))))
  const sql = connect(url, { max: 1, schema: "pgfiber" })
  try {
    for (;;) {
      const [row] = await sql<Array<{ status: string }>>`select status from jobs_archive where id = ${flow.id}`
      if (row?.status === "completed") break
      await sleep(20)
    }
    const [row] = await sql<Array<{ gap_ms: number }>>`
      select extract(epoch from (select started_at from jobs_archive where id = ${flow.id})
             - (select max(finished_at) from jobs_archive where stage = ${child.name})) * 1000 as gap_ms`
    return Number(row!.gap_ms)
  } finally {
    await sql.end({ timeout: 5 })
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

const main = async () => {
  const cluster = await startCluster({ flags: ["-c", "shared_buffers=512MB"] })
  const gaps: Array<number> = []
  try {
    const { migratePgfiber } = await import("./workloads.js")
    for (let r = 0; r < runs; r++) {
      const url = await cluster.createDatabase(`bench_fan_in_${r}`)
      await migratePgfiber(url)
      const gap = await fanInOnce(url)
      gaps.push(gap)
      log(`run ${r + 1}: a fan-in of ${children}: last child's completion → parent's start ${gap.toFixed(1)} ms`)
      await cluster.dropDatabase(`bench_fan_in_${r}`)
    }
    log(`p50 of ${runs}: ${median(gaps).toFixed(1)} ms (all: ${gaps.map((g) => g.toFixed(1)).join(", ")})`)
  } finally {
    await cluster.close()
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
