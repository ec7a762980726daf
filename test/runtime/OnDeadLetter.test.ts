/**
 * A stage's `onDeadLetter`, on real Postgres: every way a job dies fires it once with the right kind and the
 * dead letter's reason, its writes commit with the dead letter, and a hook that fails rolls back its own
 * writes (savepoint) while the dead letter still commits. Jobs run through `tick`, which uses JobRun as a pool does.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Schedule, Schema } from "effect"
import { Permanent } from "../../packages/pgfiber/src/JobError.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Tick from "../../packages/pgfiber/src/runtime/Tick.js"
import { layerDb } from "../support/pg.js"

const Payload = Schema.Struct({ subject: Schema.String })

/** The hook writes what it heard to `heard`; `failAfterWrite` makes it fail after writing. */
const recordingStage = (
  name: string,
  handler: Stage.StageOptions<typeof Payload.Type, typeof Payload.Encoded, Db.Db>["handler"],
  options: { readonly timeout?: Duration.DurationInput; readonly failAfterWrite?: boolean } = {}
) =>
  Stage.make({
    name,
    payload: Payload,
    maxAttempts: 1,
    ...(options.timeout ? { timeout: options.timeout } : {}),
    handler,
    onDeadLetter: (dead) =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        yield* db.run((sql) =>
          sql`insert into heard (job_id, stage, kind, reason) values (${dead.job.id}, ${dead.job.stage}, ${dead.kind}, ${dead.reason})`
        )
        if (options.failAfterWrite) return yield* Effect.fail("the hook broke")
      })
  })

const setup = Effect.flatMap(Db.Db, (db) =>
  db.run((sql) => sql`create table if not exists heard (job_id text, stage text, kind text, reason text)`))

const heard = (stage: string) =>
  Effect.flatMap(Db.Db, (db) =>
    db.run((sql) => sql<Array<{ job_id: string; kind: string; reason: string }>>`select job_id, kind, reason from heard where stage = ${stage}`))

const deadLetterOf = (stage: string) =>
  Effect.flatMap(Queue.Queue, (q) => Effect.map(q.deadLetters.list({ stage }), (list) => list))

const tick = (stage: Stage.Stage<any, any, Db.Db>) => Tick.run({ max: 5, stages: [stage], workerId: "tick" })

const layerPg = PgQueue.layer().pipe(Layer.provideMerge(layerDb()))

describe("onDeadLetter", () => {
  layer(layerPg, { timeout: 60_000, excludeTestServices: true })((it) => {
    it.effect("Permanent: the hook hears kind failure and the reason; its write commits with the dead letter", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_permanent", () => Effect.fail(new Permanent({ message: "no audio stream" })))
        const { id } = yield* Stage.enqueue(stage, { subject: "a" })
        expect((yield* tick(stage)).deadLettered).toBe(1)
        expect(yield* heard(stage.name)).toEqual([{ job_id: id, kind: "failure", reason: "no audio stream" }])
        const [dead] = yield* deadLetterOf(stage.name)
        expect(dead!.reason).toBe("no audio stream")
      }))

    it.effect("a defect on the last attempt: kind defect", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_defect", () => Effect.die(new Error("null pointer")))
        yield* Stage.enqueue(stage, { subject: "b" })
        yield* tick(stage)
        const [entry] = yield* heard(stage.name)
        expect(entry!.kind).toBe("defect")
        expect(entry!.reason).toContain("null pointer")
        expect((yield* deadLetterOf(stage.name)).length).toBe(1)
      }))

    it.effect("a handler timeout on the last attempt: kind timeout", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_timeout", () => Effect.never, { timeout: "200 millis" })
        yield* Stage.enqueue(stage, { subject: "c" })
        yield* tick(stage)
        const [entry] = yield* heard(stage.name)
        expect(entry!.kind).toBe("timeout")
        expect(entry!.reason).toContain("timed out")
      }))

    it.effect("a payload that fails the stage's Schema: kind invalidPayload", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_payload", () => Effect.void)
        const q = yield* Queue.Queue
        yield* q.enqueue([{ stage: stage.name, payload: { subject: 42 }, maxAttempts: 5 }])
        yield* tick(stage)
        const [entry] = yield* heard(stage.name)
        expect(entry!.kind).toBe("invalidPayload")
        expect(entry!.reason).toContain("does not match the odl_payload schema")
      }))

    it.effect("a lease that expired after the last attempt: the reaper requeues it, the stage's claim dead-letters it (kind exhausted)", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_expired", () => Effect.void)
        const q = yield* Queue.Queue
        const { id } = yield* Stage.enqueue(stage, { subject: "d" })
        // a worker claims it and dies: its 100 ms lease is never heartbeated
        yield* q.claim(stage.name, 1, { workerId: "killed-worker", leaseFor: Duration.millis(100) })
        yield* q.reapExpired.pipe(
          Effect.repeat({ schedule: Schedule.spaced("50 millis"), until: (r) => r.requeued > 0 }),
          Effect.timeout("30 seconds")
        )
        const requeued = yield* q.get(id)
        expect(requeued).toMatchObject({ status: "queued", attempts: 1, maxAttempts: 1 })
        expect(yield* deadLetterOf(stage.name)).toEqual([])
        const result = yield* tick(stage)
        expect(result.deadLettered).toBe(1)
        expect(result.completed).toBe(0)
        const [entry] = yield* heard(stage.name)
        expect(entry!.kind).toBe("exhausted")
        expect(entry!.reason).toBe("lease expired: the worker killed-worker stopped heartbeating (attempts exhausted)")
        const [dead] = yield* deadLetterOf(stage.name)
        expect(dead!.attempts).toBe(1)
        expect(dead!.errorHistory.map((e) => e.tag)).toEqual(["LeaseExpired"])
      }))

    it.effect("a hook that fails: its writes roll back to the savepoint, the dead letter still commits", () =>
      Effect.gen(function*() {
        yield* setup
        const stage = recordingStage("odl_broken_hook", () => Effect.fail(new Permanent({ message: "gone" })), { failAfterWrite: true })
        const { id } = yield* Stage.enqueue(stage, { subject: "e" })
        expect((yield* tick(stage)).deadLettered).toBe(1)
        expect(yield* heard(stage.name)).toEqual([])
        const [dead] = yield* deadLetterOf(stage.name)
        expect(dead!.jobId).toBe(id)
        expect((yield* Effect.flatMap(Queue.Queue, (q) => q.get(id)))?.status).toBe("dead")
      }))
  })
})
