/**
 * A chaos worker process: the real pgfiber worker (`Worker.layer` under `NodeRuntime.runMain`) with one stage
 * whose handler records each execution it starts, then sleeps a random while. Its database sessions carry
 * the worker id as application_name, so the database can tell which process completed a job. Every 250 ms it
 * reports its counters (claimed, completed, fenced) to the chaos harness, which keeps the last report of a
 * worker it SIGKILLs.
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import { Duration, Effect, Layer, Metric, Random, Redacted, Schedule, Schema } from "effect"
import * as Db from "../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../packages/pgfiber/src/queue/PgQueue.js"
import * as Metrics from "../packages/pgfiber/src/runtime/Metrics.js"
import * as Stage from "../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../packages/pgfiber/src/runtime/Worker.js"
import { nowNs, tell } from "./lib.js"

export interface ChaosWorkerConfig {
  readonly url: string
  readonly schema: string
  readonly workerId: string
  readonly stage: string
  readonly concurrency: number
  readonly sleepMinMs: number
  readonly sleepMaxMs: number
}

const config = JSON.parse(process.argv[2] ?? "{}") as ChaosWorkerConfig

const recordExecution = (jobId: string, attempt: number) =>
  Effect.flatMap(Db.Db, (db) =>
    db.run((sql) => sql`insert into chaos_executions (job_id, worker, attempt) values (${jobId}, ${config.workerId}, ${attempt})`)
  ).pipe(
    // the database may be restarting: an execution is recorded once it can be, never skipped
    Effect.retry({ schedule: Schedule.spaced("100 millis"), while: (e) => e.unavailable, times: 300 }),
    Effect.orDie
  )

const chaos = Stage.make({
  name: config.stage,
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: config.concurrency,
  maxAttempts: 100,
  handler: (_payload, job) =>
    Effect.gen(function*() {
      yield* recordExecution(job.id, job.attempt)
      const ms = yield* Random.nextIntBetween(config.sleepMinMs, config.sleepMaxMs + 1)
      yield* Effect.sleep(Duration.millis(ms))
    })
})

const counter = (m: Metric.Metric.Counter<number>) =>
  Effect.map(Metric.value(Metrics.forStage(m, config.stage)), (s) => s.count)

const report = Effect.gen(function*() {
  const [claimed, completed, fenced] = [yield* counter(Metrics.claimed), yield* counter(Metrics.completed), yield* counter(Metrics.fenced)]
  tell({ t: "metrics", claimed, completed, fenced })
})

const reportCounters = Layer.scopedDiscard(
  Effect.zipRight(
    Effect.sync(() => tell({ t: "ready", at: nowNs() })),
    Effect.forkScoped(Effect.repeat(report, Schedule.spaced("250 millis")))
  )
)

tell({ t: "starting", at: nowNs() })
Layer.launch(
  reportCounters.pipe(
    Layer.provideMerge(Worker.layer([chaos], { ...Worker.defaults(), workerId: config.workerId, shutdownGrace: Duration.seconds(5) })),
    Layer.provide(PgQueue.layer({ knownStages: [config.stage] })),
    Layer.provideMerge(Db.layerWith({ url: Redacted.make(config.url), schema: config.schema, poolMax: 10, applicationName: config.workerId }))
  )
).pipe(
  // the last word, after the pools have drained: what this process completed and how often it was fenced out
  Effect.ensuring(report),
  NodeRuntime.runMain
)
