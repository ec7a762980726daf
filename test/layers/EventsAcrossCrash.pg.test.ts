/**
 * A follower of `GET /events` across PostgreSQL crashes: jobs are enqueued one by one over HTTP (each with a
 * dedupe key, retried until answered), an SSE client follows the org's events and reconnects with its
 * Last-Event-ID whenever its stream ends, and the postmaster is killed with SIGKILL mid-stream, round after round
 * (the embedded server is supervised: it comes back by itself, after crash recovery). At the end the client has
 * had every event the log holds for its org, each once, and nothing the log does not hold.
 *
 * Each kill lands where a crash can take back what the follower was shown: a claim commits without waiting for
 * its WAL (synchronous_commit off), so each round ends on a long job's claim, and the server is killed once the
 * follower has that job's `started` event and before anything else is written. `wal_writer_delay` at its
 * maximum keeps the WAL writer from writing that claim out in between, so the kill lands there every round, not
 * by chance. This file runs its own embedded server: the machine's shared one is never killed.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Logger, LogLevel, Redacted, Schema } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import postgres from "postgres"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import { baseUrl, layerService, newKey } from "../http/support.js"
import { waitFor } from "../support/waitFor.js"

interface Received {
  readonly id: string
  readonly kind: string
  readonly jobId: string
  readonly attempt: number
}

/** A job that takes a while, as a call to an outside service does: its claim is the last thing written before a kill. */
const long = Stage.make({
  name: "crash_long",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number }),
  concurrency: 2,
  handler: () => Effect.sleep("2 seconds")
})

/**
 * An SSE client as a browser's EventSource is one: it follows `path`, and whenever its stream ends (a read
 * failure's `event: error`, a dropped connection, a refused request while the database is away) it connects again
 * with the last id it had as `Last-Event-ID`.
 */
const follow = (base: string, key: string, path: string) => {
  const received: Array<Received> = []
  const abort = new AbortController()
  let connections = 0
  const once = async () => {
    const headers: Record<string, string> = { authorization: `Bearer ${key}`, accept: "text/event-stream" }
    const last = received[received.length - 1]
    if (last !== undefined) headers["last-event-id"] = last.id
    const response = await fetch(`${base}${path}`, { headers, signal: abort.signal })
    if (response.status !== 200) return void (await response.body?.cancel())
    connections++
    const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader()
    let buffer = ""
    for (;;) {
      const { done, value } = await reader.read()
      if (done) return
      buffer += value
      let end: number
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        const fields = Object.fromEntries(block.split("\n").filter((l) => !l.startsWith(":") && l.includes(": "))
          .map((l) => [l.slice(0, l.indexOf(": ")), l.slice(l.indexOf(": ") + 2)]))
        if (fields.id === undefined) continue
        const data = JSON.parse(fields.data!)
        received.push({ id: fields.id, kind: data.kind, jobId: data.jobId, attempt: data.attempt })
      }
    }
  }
  const running = (async () => {
    while (!abort.signal.aborted) {
      await once().catch(() => undefined)
      // EventSource's reconnection delay
      if (!abort.signal.aborted) await new Promise((resolve) => setTimeout(resolve, 100))
    }
  })()
  return { received, connections: () => connections, stop: async () => (abort.abort(), await running) }
}

/** POST /jobs until the service answers 201 (a retry of one that committed is deduped by its key): the job's id. */
const enqueue = async (base: string, key: string, stage: string, n: number, failures: { count: number }): Promise<string> => {
  for (;;) {
    const reply = await fetch(`${base}/jobs`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ stage, payload: { n }, dedupeKey: `crash-${n}` })
    }).then(async (r) => ({ status: r.status, json: (await r.json().catch(() => undefined)) as { readonly id: string } | undefined })).catch(() => ({ status: 0, json: undefined }))
    if (reply.status === 201 && reply.json !== undefined) return reply.json.id
    failures.count++
  }
}

describe("a follower across PostgreSQL crashes", () => {
  it.scopedLive("kill -9 of the postmaster under one-by-one enqueues, 5 rounds: the SSE follower misses no event and gets none twice", () =>
    Effect.gen(function*() {
      const rounds = 5
      const dataDir = Path.join(Os.tmpdir(), `pgfiber-crash-${process.pid}-${Date.now().toString(36)}`)
      yield* Effect.addFinalizer(() => Effect.sync(() => Fs.rmSync(dataDir, { recursive: true, force: true })))
      const server = yield* EmbeddedPg.start({ dataDir, port: 0, supervise: true, postgresFlags: ["-c", "wal_writer_delay=10000"] })
      const schema = "crash"
      const db = yield* Db.make({ url: server.url, schema, poolMax: 6, applicationName: "crash-service" })
      yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
      const keys = yield* Effect.provideService(ApiKeys.make, Db.Db, db)
      const key = yield* Effect.provideService(newKey({ orgId: "org-a" }), ApiKeys.ApiKeys, keys)
      const context = yield* Layer.build(layerService(Layer.succeed(Db.Db, db), { workerStages: [long] }))
      const base = yield* Effect.provide(baseUrl, context)
      const check = postgres(Redacted.value(server.url), { max: 1, onnotice: () => undefined, connection: { search_path: schema } })
      yield* Effect.addFinalizer(() => Effect.promise(() => check.end({ timeout: 1 })))

      const follower = follow(base, key, "/events?from=beginning")
      yield* Effect.addFinalizer(() => Effect.promise(follower.stop))

      // the producer: one job at a time, each under its own dedupe key; it stops at a gate while a round's kill is set up
      const failures = { count: 0 }
      let enqueued = 0
      let gate: { readonly open: Promise<void>; readonly release: () => void } | undefined
      let stop = false
      let parked = false
      const producing = (async () => {
        for (let n = 0; !stop; n++) {
          await enqueue(base, key, "echo", n, failures)
          enqueued++
          if (gate === undefined) continue
          parked = true
          await gate.open
          parked = false
        }
      })()
      const holdProducer = Effect.gen(function*() {
        let release = () => {}
        const open = new Promise<void>((resolve) => (release = resolve))
        gate = { open, release }
        // the request in flight, if any, is answered first
        yield* waitFor("the producer to stop at the gate", Effect.sync(() => parked))
        return () => {
          gate = undefined
          release()
        }
      })

      const postmasterPid = () => EmbeddedPg.readPostmasterPid(dataDir)?.pid
      const idle = Effect.promise(async () => (await check`select count(*)::int as n from jobs`)[0]!.n === 0)
      for (let round = 1; round <= rounds; round++) {
        const before = enqueued
        yield* waitFor(`round ${round}: 100 more jobs enqueued`, Effect.sync(() => enqueued >= before + 100))
        const resume = yield* holdProducer
        yield* waitFor(`round ${round}: the jobs enqueued so far to finish`, idle)
        // the round's long job: the follower sees it start, then the server dies before anything else is written
        const longJob = yield* Effect.promise(() => enqueue(base, key, long.name, 1_000_000 + round, failures))
        yield* waitFor(`round ${round}: the long job's start on the stream`, Effect.sync(() =>
          follower.received.some((e) => e.jobId === longJob && e.kind === "started")))
        const pid = postmasterPid()!
        process.kill(pid, "SIGKILL")
        resume()
        yield* waitFor(`round ${round}: the server restarted after its crash`, Effect.sync(() => {
          const now = EmbeddedPg.readPostmasterPid(dataDir)
          return now !== undefined && now.pid !== pid && now.status === "ready"
        }))
      }
      const afterLast = enqueued
      yield* waitFor("100 more jobs enqueued after the last crash", Effect.sync(() => enqueued >= afterLast + 100))
      stop = true
      yield* Effect.promise(() => producing)

      // every job finished, and the follower has the log's last event for the org: it has read past everything
      yield* waitFor("every job to finish", idle)
      const log = yield* Effect.promise(() => check<Array<{ id: string; kind: string; job_id: string; attempt: number }>>`
        select (e.id * 1024 + u.n - 1)::text as id, e.kind, u.job_id::text, e.attempts[u.n] as attempt
        from job_events e cross join lateral unnest(e.job_ids) with ordinality as u(job_id, n)
        where e.org_id = 'org-a'
        order by e.tx, e.id, u.n`)
      const lastId = log[log.length - 1]!.id
      // a missed event never comes: after a minute without the log's last one, the comparison below says what is missing
      yield* waitFor("the follower to have the log's last event", Effect.sync(() => follower.received.some((e) => e.id === lastId)), Duration.minutes(1)).pipe(
        Effect.catchAllDefect(() => Effect.void)
      )
      yield* Effect.promise(follower.stop)

      const same = (e: { readonly id: string; readonly kind: string }) => `${e.id} ${e.kind}`
      const times = new Map<string, number>()
      for (const e of follower.received) times.set(same(e), (times.get(same(e)) ?? 0) + 1)
      const inLog = new Set(log.map(same))
      const missing = log.filter((e) => !times.has(same(e)))
      const repeated = [...times].filter(([, n]) => n > 1).map(([e]) => e)
      const notInLog = follower.received.filter((e) => !inLog.has(same(e)))
      console.log(
        `${rounds} crashes: ${enqueued} jobs enqueued (${failures.count} attempts refused or failed), ${log.length} events in the log, ` +
          `${follower.received.length} received over ${follower.connections()} connections; ${missing.length} missing, ` +
          `${repeated.length} repeated, ${notInLog.length} received that the log does not hold`
      )
      expect({ missing: missing.slice(0, 10), repeated: repeated.slice(0, 10), notInLog: notInLog.slice(0, 10) })
        .toEqual({ missing: [], repeated: [], notInLog: [] })
    }).pipe(Logger.withMinimumLogLevel(LogLevel.Warning)), { timeout: 600_000 })
})
