/**
 * Pause and resume across worker processes, on real Postgres: two workers run the same stages; pausing one
 * stage stops its claims in both (a job of another stage, enqueued after, still runs), enqueues still
 * succeed; resuming wakes both by notification — their safety sweep and polling are set to ten minutes, so
 * nothing else could. The resume-to-first-run latency is printed, not asserted (the bench measures it).
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { fixture, freshSchema, spawnWorkerProcess } from "../support/workerProcess.js"

const spawnWorker = (schema: string, workerId: string) =>
  spawnWorkerProcess(fixture("pauseWorker.ts"), {
    PGFIBER_SCHEMA: schema,
    WORKER_ID: workerId,
    LOG_LEVEL: "info",
    SWEEP_INTERVAL_MS: "600000",
    POLL_INTERVAL_MS: "600000"
  })

describe("pause across worker processes", () => {
  it.scopedLive("pausing a stage stops its claims in both workers; resuming wakes both by notification", () =>
    Effect.gen(function*() {
      const { schema, sql } = yield* freshSchema(
        "pause",
        `create table runs (job_id bigint, stage text, worker_id text, at timestamptz default clock_timestamp())`
      )
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
      const q = Context.get(yield* Layer.build(PgQueue.layer().pipe(Layer.provide(dbLayer))), Queue.Queue)
      const runsOf = (stage: string) =>
        Effect.promise(() => sql<Array<{ job_id: string; worker_id: string }>>`select job_id::text, worker_id from runs where stage = ${stage}`)

      const workers = [yield* spawnWorker(schema, "a"), yield* spawnWorker(schema, "b")]
      const dump = () => Effect.sync(() => workers.forEach((w, i) => console.log(`worker ${i}:\n${w.output()}`)))
      // both listening: each holds its LISTEN connection
      yield* waitFor("both workers to LISTEN", Effect.promise(async () => {
        const [row] = await sql<Array<{ n: number }>>`
          select count(distinct application_name)::int as n from pg_stat_activity
          where application_name like 'pgfiber-pause-%' and query ilike 'listen%'`
        return row!.n >= 2
      })).pipe(Effect.tapDefect(dump))
      // warm-up: the workers claim what is enqueued
      yield* q.enqueue(Array.from({ length: 8 }, () => ({ stage: "free" })))
      yield* waitFor("the warm-up jobs", Effect.map(runsOf("free"), (r) => r.length === 8)).pipe(Effect.tapDefect(dump))

      yield* q.stageControls.setPaused("held", true, "test")
      yield* waitFor("both workers to hear the pause", Effect.sync(() =>
        workers.every((w) => w.output().includes("stage held paused")))).pipe(Effect.tapDefect(dump))
      // enqueues succeed while paused; a job of the other stage, enqueued after them, runs; the paused ones wait
      const held = yield* q.enqueue(Array.from({ length: 10 }, () => ({ stage: "held" })))
      yield* q.enqueue([{ stage: "free" }])
      yield* waitFor("the later job of the other stage", Effect.map(runsOf("free"), (r) => r.length === 9)).pipe(Effect.tapDefect(dump))
      expect(yield* runsOf("held")).toEqual([])
      const waiting = yield* q.list({ stage: "held" })
      expect(waiting.map((j) => [j.status, j.lockedBy])).toEqual(held.map(() => ["queued", null]))
      // the claim statement itself refuses a paused stage (the moment before a process hears of it)
      expect(yield* q.claim("held", 10, { workerId: "test", leaseFor: Duration.seconds(10) })).toEqual([])
      expect((yield* q.stats).find((s) => s.stage === "held")).toMatchObject({ ready: 10, paused: true })

      const resumedAt = Date.now()
      yield* q.stageControls.setPaused("held", false, "test")
      const firstRun = yield* waitFor("a held job to run", Effect.map(runsOf("held"), (r) => r.length > 0)).pipe(Effect.tapDefect(dump))
      const latency = Date.now() - resumedAt
      expect(firstRun).toBe(true)
      yield* waitFor("every held job to run", Effect.map(runsOf("held"), (r) => r.length === 10)).pipe(Effect.tapDefect(dump))
      yield* waitFor("both workers to hear the resume", Effect.sync(() =>
        workers.every((w) => w.output().includes("stage held resumed")))).pipe(Effect.tapDefect(dump))
      console.log(`resume → first claim of the paused stage: ${latency} ms (notification only; sweeps at 10 min)`)

      yield* Effect.forEach(workers, (w) => Effect.sync(() => w.child.kill("SIGTERM")), { discard: true })
      const codes = yield* Effect.forEach(workers, (w) => Effect.promise(() => w.exited))
      expect(codes).toEqual([0, 0])
    }), { timeout: 180_000 })
})
