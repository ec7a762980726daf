/**
 * A pgfiber worker process, as deployed: `Worker.layer([stage])` on `PgQueue` and `Db` from the compiled
 * package, launched with `Layer.launch` under `NodeRuntime.runMain` (SIGTERM drains and exits 0).
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Duration, Effect, Layer, Redacted, Schema } from "effect"
// the package as a user installs it: `pgfiber` resolves (by its own `exports`) to the compiled dist/
import { Db, PgQueue, PgSchedules, Scheduler, Stage, Worker } from "pgfiber"
import { nowNs, tell } from "../lib.js"
import { makeJob, readConfig } from "./hooks.js"
import { schema } from "./pgfiber.js"
import { queueName } from "./types.js"

const config = readConfig()
const job = makeJob(config)

const bench = Stage.make({
  name: queueName,
  payload: Schema.Struct({ seq: Schema.Number }),
  concurrency: config.concurrency,
  limits: { fair: config.fair ?? true, ...(config.rate ? { rate: config.rate } : {}) },
  // a plain function wrapped as its own synchronous code would be, a Promise-returning one as the README shows
  handler: config.handler === "sync"
    ? ({ seq }) => Effect.sync(() => job.sync(seq))
    : ({ seq }) => Effect.promise(() => job.async(seq))
})

const reportReady = Layer.effectDiscard(
  Effect.flatMap(Worker.WorkerInfo, () => Effect.sync(() => tell({ t: "ready", at: nowNs() })))
)

const worker = Worker.layer([bench], { ...Worker.defaults(), workerId: `bench-${process.pid}` })
// with a schedule: the Scheduler in the same worker, as `pgfiber worker` runs it
const withSchedule = config.schedule === undefined
  ? worker
  : Scheduler.layer([{ name: "bench-schedule", stage: queueName, cron: config.schedule, payload: { seq: -1 } }]).pipe(
    Layer.provide(PgSchedules.layer),
    Layer.provideMerge(worker)
  )

tell({ t: "starting", at: nowNs() })
Layer.launch(
  reportReady.pipe(
    Layer.provide(withSchedule),
    // variant "noretain": finished jobs are deleted at once (PGFIBER_RETAIN_COMPLETED=0), as before the kept
    // history; the default subject keeps them 7 days (the default), handed to jobs_archive by the settle
    Layer.provide(PgQueue.layer({
      knownStages: [queueName],
      ...(config.variant === "noretain" ? { retention: { default: Duration.zero } } : { retention: { default: Duration.days(7) } })
    })),
    Layer.provide(Db.layerWith({ url: Redacted.make(config.url), schema, poolMax: 10 }))
  )
).pipe(NodeRuntime.runMain)
