/**
 * The documents pipeline end to end: real Postgres (a fresh migrated schema per test), the loopback fake
 * transcription server, and a real worker (`Worker.layer` over `PgQueue`) in real time, with short retry
 * delays. The Waker's own sweep is set to an hour, so jobs start from NOTIFY and the next-due timer alone.
 * A test-only trigger logs every processing_status a document passes through, so transitions are exact.
 */
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Context, Duration, Effect, Layer } from "effect"
import type postgres from "postgres"
import * as Db from "../../../packages/pgfiber/src/layers/Db.js"
import * as FakeTranscriptionServer from "../../support/FakeTranscriptionServer.js"
import * as Transcription from "../../../packages/media/src/layers/Transcription.js"
import * as PgQueue from "../../../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Queue from "../../../packages/pgfiber/src/queue/Queue.js"
import * as RetryPolicy from "../../../packages/pgfiber/src/runtime/RetryPolicy.js"
import * as Scheduler from "../../../packages/pgfiber/src/runtime/Scheduler.js"
import * as Stage from "../../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../../packages/pgfiber/src/runtime/Worker.js"
import {
  documentLayers,
  documentStages,
  DocumentsSweep,
  TranscribeDocument
} from "../../../packages/media/src/stages/documents/index.js"
import { layerDb, rawSql } from "../../support/pg.js"
import { deadline, waitFor } from "../../support/waitFor.js"

/** Production stages, except for retry delays short enough to watch five attempts in under a second. */
const transcribe = TranscribeDocument.makeTranscribeDocument({
  policy: RetryPolicy.make({
    Transient: RetryPolicy.exponential({ base: "50 millis", cap: "200 millis", jitter: false })
  })
})
const stages = [transcribe, DocumentsSweep.documentsSweep]

const workerOptions: Worker.WorkerOptions = {
  workerId: "documents-test",
  shutdownGrace: Duration.seconds(2),
  sweepInterval: Duration.hours(1),
  pollInterval: Duration.seconds(1),
  concurrency: {}
}

interface DocumentRow {
  readonly id: string
  readonly processing_status: string
  readonly processing_error: string | null
  readonly processed_at: Date | null
  readonly updated_at: Date
}

/** A migrated schema with the status log, the queue on it, a fake server; `startWorker` runs the stages. */
const setup = (fakeOptions: FakeTranscriptionServer.Options = {}, sweep: Partial<DocumentsSweep.SweepOptions> = {}) =>
  Effect.gen(function*() {
    const scope = yield* Effect.scope
    const base = yield* Layer.buildWithScope(PgQueue.layer().pipe(Layer.provideMerge(layerDb({ poolMax: 6 }))), scope)
    const db = Context.get(base, Db.Db)
    const queue = Context.get(base, Queue.Queue)
    const sql = yield* Effect.acquireRelease(
      Effect.sync(() => rawSql(db.schema)),
      (sql) => Effect.promise(() => sql.end({ timeout: 5 }))
    )
    yield* Effect.promise(() =>
      sql.unsafe(`
        create table ${db.schema}.status_log (
          n bigint generated always as identity, document_id uuid, status text, error text);
        create function ${db.schema}.log_status() returns trigger language plpgsql security definer as $$
        begin
          if tg_op = 'INSERT' or new.processing_status is distinct from old.processing_status then
            insert into ${db.schema}.status_log (document_id, status, error)
            values (new.id, new.processing_status, new.processing_error);
          end if;
          return null;
        end $$;
        create trigger log_status after insert or update on ${db.schema}.documents
          for each row execute function ${db.schema}.log_status();`)
    )
    const fake = yield* FakeTranscriptionServer.make(fakeOptions)
    const transcription = Layer.effect(
      Transcription.Transcription,
      Transcription.make({ url: fake.url, timeout: "5 seconds" })
    ).pipe(Layer.provide(NodeHttpClient.layer))
    const run = <A, E>(effect: Effect.Effect<A, E, Db.Db | Queue.Queue>) => Effect.provide(effect, base)

    // the worker runs the sweep's schedule too, as `pgfiber start` does
    const startWorker = Layer.buildWithScope(
      Scheduler.layer([DocumentsSweep.schedule({ ...DocumentsSweep.defaults, ...sweep })]).pipe(
        Layer.provide(PgSchedules.layer),
        Layer.provideMerge(Worker.layer(stages, workerOptions)),
        Layer.provide(Layer.mergeAll(transcription, DocumentsSweep.layerWith(sweep), Layer.succeedContext(base)))
      ),
      scope
    )

    const insertDocument = (d: {
      readonly mediaFormat?: string
      readonly url?: string | null
      readonly metadata?: Record<string, unknown>
      readonly orgId?: string
    }) =>
      Effect.tryPromise(() =>
        sql<Array<{ id: string }>>`
          insert into documents (org_id, media_format, canonical_url, metadata)
          values (${d.orgId ?? "org-1"}, ${d.mediaFormat ?? "video"}, ${d.url ?? null},
                  ${JSON.stringify(d.metadata ?? {})}::text::jsonb)
          returning id`
      ).pipe(Effect.map(([row]) => row!.id))

    const document = (id: string) =>
      Effect.promise(() => sql<Array<DocumentRow>>`select * from documents where id = ${id}`).pipe(Effect.map(([row]) => row!))

    const transitions = (id: string) =>
      Effect.promise(() => sql<Array<{ status: string }>>`select status from status_log where document_id = ${id} order by n`).pipe(
        Effect.map((rows) => rows.map((r) => r.status))
      )

    const liveJobs = (id: string) =>
      Effect.promise(() => sql`select * from jobs where dedupe_key = ${TranscribeDocument.dedupeKeyFor(id)}`)

    const requestedUrls = Effect.map(fake.requests, (requests) => requests.map((r) => JSON.parse(r.body).url as string))

    const statusBecomes = (id: string, status: string) =>
      waitFor(`document ${id} to be ${status}`, Effect.map(document(id), (d) => d.processing_status === status && d))

    // a job's completion commits just after its document's (and is group-committed), so it is waited for
    const jobLeaves = (id: string) =>
      waitFor(`the job of ${id} to leave the queue`, Effect.map(liveJobs(id), (jobs) => jobs.length === 0))

    return {
      db, queue, sql, fake, run, startWorker, insertDocument, document, transitions, liveJobs, jobLeaves, requestedUrls, statusBecomes
    }
  })

const deadLetters = (sql: postgres.Sql) =>
  Effect.promise(() => sql<Array<Record<string, any>>>`select * from dead_letters order by id`)

describe("documents trigger", () => {
  it.scopedLive("enqueues transcribe_document for pending video/audio inserts, in the inserting transaction", () =>
    Effect.gen(function*() {
      const { insertDocument, liveJobs, run, sql } = yield* setup()

      // 2. the job exists inside the inserting transaction, before commit; a rollback takes both away
      let seenInside: ReadonlyArray<Record<string, unknown>> = []
      let rolledBackId = ""
      const rollback = yield* Effect.promise(() =>
        sql.begin(async (tx) => {
          const [row] = await tx<Array<{ id: string }>>`
            insert into documents (org_id, media_format, canonical_url) values ('org-1', 'video', 'https://m/x.mp4') returning id`
          rolledBackId = row!.id
          seenInside = await tx`select * from jobs where subject_id = ${row!.id}`
          throw new Error("roll back")
        }).then(() => "committed", (e: Error) => e.message)
      )
      expect(rollback).toBe("roll back")
      expect(seenInside).toHaveLength(1)
      expect(yield* Effect.promise(() => sql`select * from documents where id = ${rolledBackId}`)).toHaveLength(0)
      expect(yield* liveJobs(rolledBackId)).toHaveLength(0)

      // one statement, several rows: video and audio get a job, pdf and an imported 'completed' do not
      const rows = yield* Effect.promise(() =>
        sql<Array<{ id: string; media_format: string; processing_status: string }>>`
          insert into documents (org_id, media_format, canonical_url, processing_status) values
            ('org-1', 'video', 'https://m/a.mp4', 'pending'), ('org-2', 'audio', 'https://m/b.ogg', 'pending'),
            ('org-1', 'pdf', 'https://m/c.pdf', 'pending'), ('org-1', 'video', 'https://m/d.mp4', 'completed')
          returning id, media_format, processing_status`
      )
      const jobs = yield* Effect.promise(() => sql<Array<Record<string, any>>>`select * from jobs order by id`)
      expect(jobs.map((j) => j.subject_id)).toEqual([rows[0]!.id, rows[1]!.id])
      const [video, audio] = rows
      expect(jobs[1]).toMatchObject({
        stage: "transcribe_document",
        status: "queued",
        org_id: "org-2",
        subject_id: audio!.id,
        payload: { documentId: audio!.id },
        max_attempts: TranscribeDocument.maxAttempts,
        dedupe_key: `transcribe_document:${audio!.id}`
      })

      // the TypeScript producer (the sweep) writes the same job: it dedupes onto the trigger's
      const again = yield* run(Queue.enqueueOne(TranscribeDocument.jobFor({ id: video!.id, orgId: "org-1" })))
      expect(again).toEqual({ id: String(jobs[0]!.id), deduped: true })

      // a mixed-case format is refused rather than silently never transcribed
      const mixedCase = yield* Effect.either(insertDocument({ mediaFormat: "Video", url: "https://m/e.mp4" }))
      expect(mixedCase._tag).toBe("Left")
    }))

  it.scopedLive("a tenant session's insert enqueues its job; tenants see only their own documents (RLS)", () =>
    Effect.gen(function*() {
      const { db, insertDocument, liveJobs, sql } = yield* setup()
      const [mine] = yield* db.withOrg(
        "org-a",
        db.run((sql) => sql<Array<{ id: string }>>`
          insert into documents (org_id, media_format, canonical_url) values ('org-a', 'audio', 'https://m/a.ogg') returning id`)
      ).pipe(Effect.orDie)
      expect((yield* liveJobs(mine!.id))[0]).toMatchObject({ org_id: "org-a", stage: "transcribe_document" })
      const theirs = yield* insertDocument({ orgId: "org-b", url: "https://m/b.mp4" })
      yield* Effect.promise(() =>
        sql`insert into document_transcriptions (document_id, org_id, segments) values (${theirs}, 'org-b', '[]')`
      )
      const seen = yield* db.withOrg(
        "org-a",
        db.run((sql) => sql`select id from documents union all select document_id from document_transcriptions`)
      ).pipe(Effect.orDie)
      expect(seen.map((r) => r.id)).toEqual([mine!.id])
      const forged = yield* Effect.either(
        db.withOrg("org-a", db.run((sql) => sql`insert into documents (org_id, media_format) values ('org-b', 'video')`))
      )
      expect(forged._tag === "Left" && forged.left.message).toContain("row-level security")
      // a transcription always carries its document's org
      const mismatched = yield* Effect.promise(() =>
        sql`insert into document_transcriptions (document_id, org_id, segments) values (${mine!.id}, 'org-b', '[]')`
          .then(() => "inserted", (e: Error) => e.message)
      )
      expect(mismatched).toContain("foreign key")
    }))
})

describe("transcribe_document", () => {
  it.scopedLive("seed 003's end-to-end checklist", () =>
    Effect.gen(function*() {
      const t = yield* setup({ fallback: { delay: "300 millis" } })
      yield* t.startWorker
      const url = "https://media.example.com/uploads/lecture-01.mp4"

      // 1. insert a video document with a media url; 2. its job exists in the same transaction
      const [id, jobsBeforeCommit] = yield* Effect.promise(() =>
        t.sql.begin(async (tx) => {
          const [row] = await tx<Array<{ id: string }>>`
            insert into documents (org_id, media_format, canonical_url, lang) values ('org-1', 'video', ${url}, 'en')
            returning id`
          const jobs = await tx`select stage, status from jobs where subject_id = ${row!.id}`
          return [row!.id, jobs] as const
        })
      )
      expect(jobsBeforeCommit).toEqual([{ stage: "transcribe_document", status: "queued" }])

      // the commit's NOTIFY wakes the worker, which takes the job
      yield* t.statusBecomes(id, "processing")
      expect((yield* t.liveJobs(id)).map((j) => j.status)).toEqual(["running"])

      // 3. pending → processing → completed
      const done = yield* t.statusBecomes(id, "completed")
      expect(yield* t.transitions(id)).toEqual(["pending", "processing", "completed"])
      expect(done.processed_at).toBeInstanceOf(Date)
      expect(done.processing_error).toBeNull()

      // 4. the transcription, segments stored as a real JSON array
      const [transcription] = yield* Effect.promise(() =>
        t.sql`select *, jsonb_typeof(segments) as segments_type from document_transcriptions where document_id = ${id}`
      )
      const expected = FakeTranscriptionServer.fakeTranscript(url)
      expect(transcription).toMatchObject({
        segments_type: "array",
        segments: expected.segments,
        language: "en",
        source: "ai",
        confidence_score: expected.confidence,
        metadata: expected.metadata
      })

      // 5. the job leaves the live queue, and nothing runs again
      yield* t.jobLeaves(id)
      yield* Effect.sleep("500 millis")
      expect(yield* t.requestedUrls).toEqual([url])
      expect(yield* t.transitions(id)).toEqual(["pending", "processing", "completed"])
      expect(yield* deadLetters(t.sql)).toEqual([])

      // an audio document whose url is only in metadata.media_url
      const audioUrl = "https://media.example.com/uploads/call-7.ogg"
      const audio = yield* t.insertDocument({ mediaFormat: "audio", metadata: { media_url: audioUrl, title: "call" } })
      yield* t.statusBecomes(audio, "completed")
      expect(yield* t.requestedUrls).toEqual([url, audioUrl])
    }))

  it.scopedLive("a duplicate job for a completed document does nothing", () =>
    Effect.gen(function*() {
      const t = yield* setup()
      yield* t.startWorker
      const url = "https://media.example.com/a.mp4"
      const id = yield* t.insertDocument({ url })
      const before = yield* t.statusBecomes(id, "completed")
      yield* t.jobLeaves(id)
      const [stored] = yield* Effect.promise(() => t.sql`select updated_at from document_transcriptions where document_id = ${id}`)

      // a redelivery without the dedupe key, and one through the usual key
      yield* t.run(Stage.enqueue(transcribe, { documentId: id }))
      yield* t.run(Queue.enqueueOne(TranscribeDocument.jobFor({ id, orgId: "org-1" })))
      yield* waitFor("the duplicates to finish", Effect.map(Effect.promise(() => t.sql`select id from jobs`), (rows) => rows.length === 0))

      const after = yield* t.document(id)
      expect(after.processed_at).toEqual(before.processed_at)
      expect(after.updated_at).toEqual(before.updated_at)
      const [storedAfter] = yield* Effect.promise(() => t.sql`select updated_at from document_transcriptions where document_id = ${id}`)
      expect(storedAfter!.updated_at).toEqual(stored!.updated_at)
      expect(yield* t.requestedUrls).toEqual([url])
      expect(yield* t.transitions(id)).toEqual(["pending", "processing", "completed"])
      expect(yield* deadLetters(t.sql)).toEqual([])
    }))

  it.scopedLive("a missing url, or a Permanent answer, errors the document and dead-letters the job at once", () =>
    Effect.gen(function*() {
      const t = yield* setup({ script: [{ status: 422, body: { detail: "not an audio or video file" } }] })
      yield* t.startWorker
      const noUrl = yield* t.insertDocument({ url: null, metadata: { media_url: "  " } })
      const errored = yield* t.statusBecomes(noUrl, "error")
      expect(errored.processing_error).toContain("no media url")
      // the failed run puts it back to pending; the job's death (onDeadLetter) moves it to error
      expect(yield* t.transitions(noUrl)).toEqual(["pending", "processing", "pending", "error"])

      const refused = yield* t.insertDocument({ url: "https://media.example.com/slides.pdf" })
      const refusedDoc = yield* t.statusBecomes(refused, "error")
      expect(refusedDoc.processing_error).toContain("not an audio or video file")

      const dead = yield* waitFor("two dead letters", Effect.map(deadLetters(t.sql), (rows) => rows.length === 2 && rows))
      expect(dead.map((d) => [d.subject_id, d.attempts, d.stage])).toEqual([
        [noUrl, 1, "transcribe_document"],
        [refused, 1, "transcribe_document"]
      ])
      expect(dead[0]!.reason).toContain("no media url")
      expect(dead[1]!.reason).toContain("422")
      expect(yield* t.requestedUrls).toEqual(["https://media.example.com/slides.pdf"])
      expect(yield* Effect.promise(() => t.sql`select id from jobs`)).toHaveLength(0)
    }))

  it.scopedLive("a 5xx then success: back to pending with the reason, retried, completed", () =>
    Effect.gen(function*() {
      const t = yield* setup({ script: [{ status: 503 }] })
      yield* t.startWorker
      const url = "https://media.example.com/b.mp4"
      const id = yield* t.insertDocument({ url })
      const done = yield* t.statusBecomes(id, "completed")
      expect(yield* t.transitions(id)).toEqual(["pending", "processing", "pending", "processing", "completed"])
      const [retryRow] = yield* Effect.promise(() =>
        t.sql`select error from status_log where document_id = ${id} and status = 'pending' order by n offset 1`
      )
      expect(retryRow!.error).toContain("503")
      expect(done.processing_error).toBeNull()
      expect(yield* t.requestedUrls).toEqual([url, url])
      yield* t.jobLeaves(id)
      expect(yield* deadLetters(t.sql)).toEqual([])
    }))

  it.scopedLive("a service that always fails: error after max attempts, the job dead-lettered with its history", () =>
    Effect.gen(function*() {
      const t = yield* setup({ fallback: { status: 500 } })
      yield* t.startWorker
      const url = "https://media.example.com/c.mp4"
      const id = yield* t.insertDocument({ url })
      const errored = yield* t.statusBecomes(id, "error")
      expect(errored.processing_error).toContain("500")
      const attempts = TranscribeDocument.maxAttempts
      expect(yield* t.transitions(id)).toEqual([
        "pending",
        ...Array.from({ length: attempts }, () => ["processing", "pending"]).flat(),
        "error"
      ])
      const [dead] = yield* waitFor("the dead letter", Effect.map(deadLetters(t.sql), (rows) => rows.length === 1 && rows))
      expect(dead).toMatchObject({ subject_id: id, attempts, max_attempts: attempts })
      expect(dead!.error_history.map((e: { attempt: number; tag: string }) => [e.attempt, e.tag])).toEqual(
        Array.from({ length: attempts }, (_, i) => [i + 1, "Transient"])
      )
      expect(yield* t.requestedUrls).toEqual(Array.from({ length: attempts }, () => url))
      expect(yield* t.liveJobs(id)).toHaveLength(0)
    }))

  it.scopedLive("a worker that died mid-job: the reaper requeues the job and its next run takes the document over", () =>
    Effect.gen(function*() {
      const t = yield* setup()
      const url = "https://media.example.com/d.mp4"
      const id = yield* t.insertDocument({ url })
      const other = yield* t.insertDocument({ url: "https://media.example.com/other.mp4" })
      // a worker claims the job, runs the guard, and dies: its lease runs out in 300 ms
      const [job] = yield* t.run(Effect.flatMap(Queue.Queue, (q) =>
        q.claim("transcribe_document", 1, { workerId: "dead-worker", leaseFor: Duration.millis(300) })
      ))
      expect(job!.subjectId).toBe(id)
      yield* t.run(Effect.flatMap(Db.Db, (db) => db.run((sql) => sql`
        update documents set processing_status = 'processing', processing_job_id = ${job!.id} where id = ${id}`)))
      // `other` is in processing under some other job: its own job must leave it alone
      yield* Effect.promise(() => t.sql`
        update documents set processing_status = 'processing', processing_job_id = 424242 where id = ${other}`)

      yield* t.startWorker
      const done = yield* t.statusBecomes(id, "completed")
      expect(done.processing_error).toBeNull()
      yield* waitFor("the jobs to finish", Effect.map(Effect.promise(() => t.sql`select id from jobs`), (rows) => rows.length === 0))
      expect(yield* t.requestedUrls).toEqual([url])
      expect((yield* t.document(other)).processing_status).toBe("processing")
      expect(yield* deadLetters(t.sql)).toEqual([])
    }))
})

describe("documents_sweep", () => {
  it.scopedLive("re-enqueues an orphaned pending document exactly once, errors one stuck in processing, and runs on its schedule", () =>
    Effect.gen(function*() {
      const t = yield* setup({}, { interval: Duration.seconds(1), stuckAfter: Duration.minutes(10) })
      const urlOf = (name: string) => `https://media.example.com/${name}.mp4`
      const orphan = yield* t.insertDocument({ url: urlOf("orphan") })
      const fresh = yield* t.insertDocument({ url: urlOf("fresh") })
      const pdf = yield* t.insertDocument({ mediaFormat: "pdf", url: "https://media.example.com/doc.pdf" })
      const stuck = yield* t.insertDocument({ url: urlOf("stuck") })
      const running = yield* t.insertDocument({ url: urlOf("running") })
      // the orphans lost their jobs; `running` is in processing under its live job
      yield* Effect.promise(() => t.sql`delete from jobs where subject_id in (${orphan}, ${fresh}, ${stuck})`)
      const [runningJob] = yield* t.liveJobs(running)
      yield* Effect.promise(() => t.sql`
        update documents set updated_at = now() - interval '1 hour' where id in (${orphan}, ${pdf}, ${stuck}, ${running})`)
      yield* Effect.promise(() => t.sql`
        update documents set processing_status = 'processing', processing_job_id = 999999,
               updated_at = now() - interval '1 hour' where id = ${stuck}`)
      yield* Effect.promise(() => t.sql`
        update documents set processing_status = 'processing', processing_job_id = ${runningJob!.id},
               updated_at = now() - interval '1 hour' where id = ${running}`)

      // three sweeps at once: one job for the orphan, one error for the stuck document
      const sweep = t.run(DocumentsSweep.sweepOnce({ stuckAfter: Duration.minutes(10), batchSize: 2 }))
      const results = yield* Effect.all([sweep, sweep, sweep], { concurrency: "unbounded" })
      expect(results.reduce((n, r) => n + r.enqueued, 0)).toBe(1)
      expect(results.reduce((n, r) => n + r.errored, 0)).toBe(1)
      expect(yield* t.liveJobs(orphan)).toHaveLength(1)
      expect(yield* t.liveJobs(fresh)).toHaveLength(0)
      expect(yield* Effect.promise(() => t.sql`select id from jobs where subject_id = ${pdf}`)).toHaveLength(0)
      const stuckDoc = yield* t.document(stuck)
      expect(stuckDoc.processing_status).toBe("error")
      expect(stuckDoc.processing_error).toContain("999999 is gone")
      expect((yield* t.document(running)).processing_status).toBe("processing")

      // the schedule: one sweep job per second, never two live at once
      yield* t.startWorker
      yield* t.statusBecomes(orphan, "completed")
      yield* t.statusBecomes(running, "completed")
      const sweepJobIds = new Set<string>()
      // looked at every 10 ms, to see each short-lived sweep job
      yield* waitFor("three sweep jobs, one at a time", Effect.map(
        Effect.promise(() => t.sql<Array<{ id: string }>>`select id from jobs where stage = 'documents_sweep'`),
        (live) => {
          expect(live.length).toBeLessThanOrEqual(1)
          live.forEach((j) => sweepJobIds.add(String(j.id)))
          return sweepJobIds.size >= 3
        }
      ), deadline, Duration.millis(10))
      expect(sweepJobIds.size).toBeGreaterThanOrEqual(3)
      const [schedule] = yield* Effect.promise(() => t.sql<Array<{ name: string; interval_ms: string; source: string }>>`
        select name, interval_ms::text, source from schedules where stage = 'documents_sweep'`)
      expect(schedule).toEqual({ name: "documents-sweep", interval_ms: "1000", source: "code" })
      // many sweeps later: the orphan was transcribed once; the fresh one waits for its threshold
      expect((yield* t.requestedUrls).sort()).toEqual([urlOf("orphan"), urlOf("running")])
      expect((yield* t.document(fresh)).processing_status).toBe("pending")
      expect((yield* t.document(pdf)).processing_status).toBe("pending")
      expect(yield* deadLetters(t.sql)).toEqual([])
    }))

  it.scopedLive("with a zero threshold the sweep picks up a pending document whose job was lost", () =>
    Effect.gen(function*() {
      const t = yield* setup({}, { interval: Duration.seconds(1), stuckAfter: Duration.zero })
      const id = yield* t.insertDocument({ url: "https://media.example.com/lost.mp4" })
      yield* Effect.promise(() => t.sql`delete from jobs where subject_id = ${id}`)
      yield* t.startWorker
      yield* t.statusBecomes(id, "completed")
      expect(yield* t.requestedUrls).toEqual(["https://media.example.com/lost.mp4"])
    }))
})

describe("configuration and helpers", () => {
  const withEnv = (env: Record<string, string>) => Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env))))

  it.effect("the sweep reads DOCUMENTS_SWEEP_INTERVAL_MS and DOCUMENTS_SWEEP_STUCK_AFTER_MS, 3 h and 10 min by default", () =>
    Effect.gen(function*() {
      const defaults = yield* DocumentsSweep.config.pipe(withEnv({}))
      expect([Duration.toMillis(defaults.interval), Duration.toMillis(defaults.stuckAfter)]).toEqual([3 * 3_600_000, 600_000])
      const set = yield* DocumentsSweep.config.pipe(
        withEnv({ DOCUMENTS_SWEEP_INTERVAL_MS: "60000", DOCUMENTS_SWEEP_STUCK_AFTER_MS: "0" })
      )
      expect([Duration.toMillis(set.interval), Duration.toMillis(set.stuckAfter)]).toEqual([60_000, 0])
      const bad = yield* Effect.flip(DocumentsSweep.config.pipe(withEnv({ DOCUMENTS_SWEEP_INTERVAL_MS: "0" })))
      expect(String(bad)).toContain("DOCUMENTS_SWEEP_INTERVAL_MS")
    }))

  it.scoped("documentLayers reads the transcription client's and the sweep's variables", () =>
    Effect.gen(function*() {
      const context = yield* Layer.build(documentLayers).pipe(
        withEnv({ TRANSCRIBE_URL: "http://127.0.0.1:1/transcribe", DOCUMENTS_SWEEP_STUCK_AFTER_MS: "1000" })
      )
      const settings = Context.get(context, DocumentsSweep.Settings)
      expect([Duration.toMillis(settings.interval), Duration.toMillis(settings.stuckAfter)]).toEqual([3 * 3_600_000, 1_000])
      expect(Context.getOption(context, Transcription.Transcription)._tag).toBe("Some")
      const missingUrl = yield* Effect.flip(Layer.build(documentLayers).pipe(withEnv({})))
      expect(String(missingUrl)).toContain("TRANSCRIBE_URL")
    }))

  it("the media url is canonical_url, else metadata.media_url; blank is missing", () => {
    const of = TranscribeDocument.mediaUrlOf
    expect(of({ canonical_url: " https://a/x.mp4 ", metadata: { media_url: "https://b/y.mp4" } })).toBe("https://a/x.mp4")
    expect(of({ canonical_url: "", metadata: { media_url: "https://b/y.mp4" } })).toBe("https://b/y.mp4")
    expect(of({ canonical_url: null, metadata: { media_url: " " } })).toBeUndefined()
    expect(of({ canonical_url: null, metadata: { media_url: 42 } })).toBeUndefined()
    expect(of({ canonical_url: null, metadata: null })).toBeUndefined()
  })

  it("the exported stages are the production ones", () => {
    expect(documentStages.map((s) => [s.name, s.maxAttempts])).toEqual([
      ["transcribe_document", TranscribeDocument.maxAttempts],
      ["documents_sweep", 5]
    ])
    expect(documentStages[0].policy).toBe(TranscribeDocument.policy)
  })
})
