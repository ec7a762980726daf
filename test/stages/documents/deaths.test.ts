/**
 * Every way a transcribe_document job can die ends with its document in `error` and the reason (the stage's
 * onDeadLetter, in the dead-letter transaction). The Permanent answer and the attempts exhausted by 5xx are in
 * TranscribeDocument.test.ts; here: a defect on every attempt, a handler timeout on every attempt, a payload
 * that fails the Schema, and a worker process SIGKILLed during the job's last attempt.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer } from "effect"
import * as Db from "../../../packages/pgfiber/src/layers/Db.js"
import * as Transcription from "../../../packages/media/src/layers/Transcription.js"
import * as PgQueue from "../../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Worker from "../../../packages/pgfiber/src/runtime/Worker.js"
import { TranscribeDocument } from "../../../packages/media/src/stages/documents/index.js"
import * as FakeTranscriptionServer from "../../support/FakeTranscriptionServer.js"
import { layerDb } from "../../support/pg.js"
import { spawnPipelineWorker } from "../../support/pipelineWorker.js"
import { waitFor } from "../../support/waitFor.js"

const fast = RetryPolicy.make({ Transient: RetryPolicy.exponential({ base: "30 millis", cap: "100 millis", jitter: false }) })

const workerOptions: Worker.WorkerOptions = {
  workerId: "documents-deaths",
  shutdownGrace: Duration.seconds(2),
  sweepInterval: Duration.hours(1),
  pollInterval: Duration.seconds(1),
  concurrency: {}
}

const setup = (fake: FakeTranscriptionServer.Options = {}) =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const base = yield* Layer.buildWithScope(PgQueue.layer().pipe(Layer.provideMerge(layerDb({ poolMax: 6 }))), scope)
    const server = yield* FakeTranscriptionServer.make(fake)
    const clientLayer = Layer.effect(Transcription.Transcription, Transcription.make({ url: server.url, timeout: "5 seconds" })).pipe(
      Layer.provide(NodeHttpClient.layer)
    )
    const run = <A, E>(effect: Effect.Effect<A, E, Db.Db | Queue.Queue>) => Effect.provide(effect, base)
    const startWorker = (
      options: TranscribeDocument.TranscribeDocumentOptions,
      transcription: Layer.Layer<Transcription.Transcription> = clientLayer
    ) =>
      Layer.buildWithScope(
        Worker.layer([TranscribeDocument.makeTranscribeDocument({ policy: fast, ...options })], workerOptions).pipe(
          Layer.provide(Layer.mergeAll(transcription, Layer.succeedContext(base)))
        ),
        scope
      )
    const insertDocument = (mediaFormat = "video") =>
      run(Effect.flatMap(Db.Db, (db) =>
        db.run((sql) =>
          sql<Array<{ id: string }>>`
            insert into documents (org_id, media_format, canonical_url)
            values ('org-1', ${mediaFormat}, 'https://media.example.com/call.mp4') returning id`
        ))).pipe(Effect.orDie, Effect.map(([row]) => row!.id))
    const document = (id: string) =>
      run(Effect.flatMap(Db.Db, (db) =>
        db.run((sql) => sql<Array<{ processing_status: string; processing_error: string | null }>>`
          select processing_status, processing_error from documents where id = ${id}`)
      )).pipe(Effect.orDie, Effect.map(([row]) => row!))
    const erroredWith = (id: string) =>
      Effect.gen(function*() {
        const [doc, mine] = yield* waitFor(`document ${id} to reach error with a dead letter`, Effect.gen(function*() {
          const doc = yield* document(id)
          const dead = yield* run(Effect.flatMap(Queue.Queue, (q) => q.deadLetters.list({ stage: TranscribeDocument.stageName })))
          const mine = dead.filter((d) => d.subjectId === id)
          return doc.processing_status === "error" && mine.length > 0 && ([doc, mine] as const)
        }))
        expect(mine).toHaveLength(1)
        expect(doc.processing_error).toBe(`transcribe_document: ${mine[0]!.reason}`)
        return { doc, dead: mine[0]! }
      })
    return { base, server, run, startWorker, insertDocument, document, erroredWith, db: Context.get(base, Db.Db) }
  })

describe("every death of a transcribe_document job errors the document with the reason", () => {
  it.scopedLive("a defect on every attempt (a transcription client with a bug)", () =>
    Effect.gen(function*() {
      const t = yield* setup()
      const buggy = Layer.succeed(Transcription.Transcription, Transcription.Transcription.of({
        transcribe: () => Effect.die(new TypeError("cannot read properties of undefined (reading 'segments')"))
      }))
      yield* t.startWorker({}, buggy)
      const { dead, doc } = yield* t.erroredWith(yield* t.insertDocument())
      expect(dead.attempts).toBe(TranscribeDocument.maxAttempts)
      expect(dead.errorHistory.every((e) => e.tag === "Defect")).toBe(true)
      expect(doc.processing_error).toContain("reading 'segments'")
    }), 180_000)

  it.scopedLive("a handler timeout on every attempt (the service never answers)", () =>
    Effect.gen(function*() {
      const t = yield* setup({ fallback: { hang: true } })
      yield* t.startWorker({ timeout: "300 millis" })
      const { dead, doc } = yield* t.erroredWith(yield* t.insertDocument())
      expect(dead.attempts).toBe(TranscribeDocument.maxAttempts)
      expect(doc.processing_error).toBe("transcribe_document: handler timed out after 300ms")
    }), 180_000)

  it.scopedLive("a payload that fails the Schema", () =>
    Effect.gen(function*() {
      const t = yield* setup()
      // a document the trigger does not enqueue for, and a hand-written job for it with a bad payload
      const id = yield* t.insertDocument("pdf")
      yield* t.run(Effect.flatMap(Queue.Queue, (q) =>
        q.enqueue([{ stage: TranscribeDocument.stageName, orgId: "org-1", subjectId: id, payload: { documentId: "not-a-uuid" } }])
      ))
      yield* t.startWorker({})
      const { doc } = yield* t.erroredWith(id)
      expect(doc.processing_error).toContain("payload does not match the transcribe_document schema")
    }), 180_000)

  it.scopedLive("a worker process SIGKILLed during the last attempt: reaped, then dead-lettered by the stage's claim", () =>
    Effect.gen(function*() {
      const t = yield* setup({ script: [{ hang: true }] })
      const id = yield* t.insertDocument()
      const victim = yield* spawnPipelineWorker({
        PIPELINE: "documents",
        PGFIBER_SCHEMA: t.db.schema,
        WORKER_ID: "victim",
        LEASE_MS: "10000", // generous: a loaded machine (load 15 on two cores) must not expire it before the kill
        TRANSCRIBE_URL: t.server.url.toString()
      })
      yield* t.server.awaitRequests(1).pipe(
        Effect.timeoutFail({ duration: "60 seconds", onTimeout: () => new Error(`the victim never started: ${victim.output()}`) }),
        Effect.orDie
      )
      expect((yield* t.document(id)).processing_status).toBe("processing")
      // make this run the job's last
      yield* t.run(Effect.flatMap(Db.Db, (db) =>
        db.run((sql) => sql`update jobs set max_attempts = attempts + 1 where subject_id = ${id} and status = 'running'`)
      ))
      victim.child.kill("SIGKILL")
      yield* Effect.promise(() => victim.exited)
      yield* t.startWorker({})
      const { dead, doc } = yield* t.erroredWith(id)
      expect(dead.errorHistory.at(-1)!.tag).toBe("LeaseExpired")
      expect(doc.processing_error).toBe(
        "transcribe_document: lease expired: the worker victim stopped heartbeating (attempts exhausted)"
      )
      expect(yield* t.server.requests).toHaveLength(1)
    }), 180_000)
})
