/**
 * What a pool asks of the database, on real Postgres, counted by a layer over the queue (never timed):
 * - under a backlog, the shape of a user's handler (a Promise-returning one that yields to the runtime between
 *   jobs, a synchronous one that never does) does not change how many claim statements it costs;
 * - at a steady rate of single jobs, a job costs its claim and its settle, and no look-up of the next due time;
 * - yet jobs written for later still start on time (the NOTIFY 'pgfiber:later', and the timer re-armed after
 *   the claim it woke), with the safety sweep an hour away.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { databaseUrl, type rawSql } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { freshSchema } from "../support/workerProcess.js"

interface Counts {
  claims: number
  claimed: number
  nextWakes: number
  /** Claims by stage. */
  byStage: Map<string, number>
}

/** The Postgres queue with every claim and every look-up of the next due time counted. */
const countingQueue = (counts: Counts) =>
  Layer.effect(
    Queue.Queue,
    Effect.map(Queue.Queue, (queue) =>
      Queue.Queue.of({
        ...queue,
        claimBatch: (stage, limit, options) =>
          queue.claimBatch(stage, limit, options).pipe(
            Effect.tap((result) =>
              Effect.sync(() => {
                counts.claims++
                counts.claimed += result.jobs.length
                counts.byStage.set(stage, (counts.byStage.get(stage) ?? 0) + 1)
              })
            )
          ),
        nextWake: (stages) => Effect.zipLeft(queue.nextWake(stages), Effect.sync(() => void counts.nextWakes++))
      })
    )
  ).pipe(Layer.provide(PgQueue.layer()))

const backlog = 5_000

interface Run {
  readonly counts: Counts
  /** How many handlers have run, by payload tag. */
  readonly ran: Map<string, number>
  readonly enqueue: (jobs: ReadonlyArray<{ tag: string; runAt?: Date }>) => Effect.Effect<void>
  readonly sql: ReturnType<typeof rawSql>
}

/**
 * A worker with one stage (concurrency 10) on a fresh schema, its queue counted; `before` is enqueued before it
 * starts. `idle` names a second stage in the same worker that never gets a job.
 */
const withWorker = (name: string, handler: Effect.Effect<void>, before: ReadonlyArray<{ tag: string }> = [], idle?: string) =>
  Effect.gen(function*() {
    const { schema, sql } = yield* freshSchema("cs", "select 1")
    const ran = new Map<string, number>()
    const stage = Stage.make({
      name,
      payload: Schema.Struct({ tag: Schema.String }),
      concurrency: 10,
      handler: ({ tag }) => Effect.zipRight(handler, Effect.sync(() => void ran.set(tag, (ran.get(tag) ?? 0) + 1)))
    })
    const counts: Counts = { claims: 0, claimed: 0, nextWakes: 0, byStage: new Map() }
    const idleStage = idle === undefined ? [] : [Stage.make({ name: idle, payload: Schema.Unknown, handler: () => Effect.void })]
    const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
    const producer = yield* Layer.build(PgQueue.layer().pipe(Layer.provide(dbLayer)))
    const enqueue = (jobs: ReadonlyArray<{ tag: string; runAt?: Date }>) =>
      Effect.flatMap(Queue.Queue, (q) => q.enqueue(jobs.map(({ tag, runAt }) => ({ stage: name, payload: { tag }, ...(runAt ? { runAt } : {}) })))).pipe(
        Effect.provide(producer),
        Effect.asVoid,
        Effect.orDie
      )
    if (before.length > 0) yield* enqueue(before)
    yield* Layer.build(
      Worker.layer([stage, ...idleStage], {
        workerId: `w-${name}`,
        shutdownGrace: Duration.seconds(5),
        sweepInterval: Duration.hours(1),
        pollInterval: Duration.seconds(1),
        concurrency: {}
      }).pipe(Layer.provide(countingQueue(counts)), Layer.provide(dbLayer))
    )
    return { counts, ran, enqueue, sql } satisfies Run
  })

const settledAll = (run: Run) =>
  waitFor("every outcome settled", Effect.promise(() => run.sql`select count(*)::int as n from jobs`).pipe(Effect.map((r) => r[0]!.n === 0)))

/** A backlog enqueued in bulk before the worker starts, drained. */
const drain = (name: string, handler: Effect.Effect<void>, idle?: string) =>
  Effect.gen(function*() {
    const run = yield* withWorker(name, handler, Array.from({ length: backlog }, (_, n) => ({ tag: String(n) })), idle)
    yield* waitFor(`${backlog} jobs run`, Effect.sync(() => run.ran.size >= backlog))
    yield* settledAll(run)
    return run.counts
  })

describe("claim sizing under a backlog", () => {
  it.live("an async handler (a Promise, as users write them): at most 50 claims for 5,000 jobs", () =>
    Effect.gen(function*() {
      const counts = yield* Effect.scoped(drain("async_noop", Effect.promise(async () => undefined)))
      expect(counts.claimed).toBeGreaterThanOrEqual(backlog)
      expect(counts.claims).toBeLessThanOrEqual(50)
    }), { timeout: 180_000 })

  it.live("a synchronous handler: at most 50 claims for 5,000 jobs", () =>
    Effect.gen(function*() {
      const counts = yield* Effect.scoped(drain("sync_noop", Effect.void))
      expect(counts.claimed).toBeGreaterThanOrEqual(backlog)
      expect(counts.claims).toBeLessThanOrEqual(50)
    }), { timeout: 180_000 })

  it.live("a stage with no jobs beside it is not woken again and again while the other drains", () =>
    Effect.gen(function*() {
      // the timer woke every pool while any stage had due jobs; the idle pool's empty claim re-armed the timer,
      // which found the backlog due and woke it again: a claim and a next-due look-up in a loop for the whole drain
      // (a worker with housekeeping drained a third slower)
      const counts = yield* Effect.scoped(drain("beside_idle", Effect.promise(async () => undefined), "idle_beside"))
      expect(counts.claimed).toBeGreaterThanOrEqual(backlog)
      expect(counts.byStage.get("beside_idle") ?? 0).toBeLessThanOrEqual(50)
      // its catch-up claim at start, and a few a wake-up may cause
      expect(counts.byStage.get("idle_beside") ?? 0).toBeLessThanOrEqual(5)
      expect(counts.nextWakes).toBeLessThanOrEqual(10)
    }), { timeout: 180_000 })
})

describe("a steady rate of single jobs", () => {
  it.live("each job costs one claim; the next due time is not looked up per job", () =>
    Effect.scoped(Effect.gen(function*() {
      const run = yield* withWorker("steady", Effect.promise(async () => undefined))
      yield* waitFor("the worker's first look at the queue", Effect.sync(() => run.counts.claims > 0))
      const startup = { ...run.counts }
      const jobs = 40
      for (let n = 0; n < jobs; n++) {
        yield* run.enqueue([{ tag: String(n) }])
        yield* waitFor(`job ${n} run`, Effect.sync(() => run.ran.has(String(n))))
      }
      yield* settledAll(run)
      const claims = run.counts.claims - startup.claims
      const nextWakes = run.counts.nextWakes - startup.nextWakes
      expect(run.counts.claimed - startup.claimed).toBe(jobs)
      // one claim per NOTIFY (a wake-up racing a claim in flight may find nothing: a few spare)
      expect(claims).toBeLessThanOrEqual(jobs + 5)
      // before: a look-up after every short claim, one per job
      expect(nextWakes).toBeLessThanOrEqual(5)
    })), { timeout: 180_000 })

  it.live("a job written for later beside due ones starts on time, as does the next one after the timer fires", () =>
    Effect.scoped(Effect.gen(function*() {
      const run = yield* withWorker("later", Effect.void)
      yield* waitFor("the worker's first look at the queue", Effect.sync(() => run.counts.claims > 0))
      const start = Date.now()
      // one due job and two for later in one insert: the claim the NOTIFY causes finds the due one (a short claim,
      // not an empty one), so only 'pgfiber:later' tells the timer; the second delayed job is found when the timer
      // re-arms after the claim it woke. The sweep is an hour away.
      yield* run.enqueue([
        { tag: "now" },
        { tag: "in1s", runAt: new Date(start + 1_000) },
        { tag: "in2s", runAt: new Date(start + 2_000) }
      ])
      yield* waitFor("both jobs written for later run", Effect.sync(() => run.ran.has("in1s") && run.ran.has("in2s")))
      expect(run.ran.get("now")).toBe(1)
      // on time, not at the sweep: a generous bound for a loaded machine, far below the sweep's hour
      expect(Date.now() - start).toBeLessThan(60_000)
    })), { timeout: 180_000 })
})
