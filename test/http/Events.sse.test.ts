/**
 * `GET /events` on a real server and a real PostgreSQL: a client that disconnects mid-stream and reconnects with
 * Last-Event-ID — once to the same server, once to a new server after the first one stopped — receives every
 * event of its org's jobs exactly once, in order, none missing (the same sequence a fresh client reads from the
 * beginning); another org's events never appear; bad input is a 400 with a JSON body. And with an SSE client
 * and a webhook open and nothing happening, the server sends no statement to the database.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { waitFor, waitForQuiet } from "../support/waitFor.js"
import { call, freshService } from "./support.js"

interface SseEvent {
  readonly id: string
  readonly event: string
  readonly data: { readonly id: string; readonly kind: string; readonly jobId: string; readonly orgId: string | null }
}

/** An SSE client over fetch: the events it has parsed so far, and a way to hang up. */
const openSse = (base: string, key: string, path: string, lastEventId?: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const abort = new AbortController()
      const headers: Record<string, string> = { authorization: `Bearer ${key}`, accept: "text/event-stream" }
      if (lastEventId !== undefined) headers["last-event-id"] = lastEventId
      const response = await fetch(`${base}${path}`, { headers, signal: abort.signal })
      const events: Array<SseEvent> = []
      const reading = (async () => {
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
            if (fields.id !== undefined) events.push({ id: fields.id, event: fields.event!, data: JSON.parse(fields.data!) })
          }
        }
      })().catch(() => undefined)
      return { status: response.status, events, close: () => abort.abort(), reading }
    }),
    (client) => Effect.sync(() => client.close())
  )

describe("GET /events (Server-Sent Events)", () => {
  it.scopedLive("reconnecting with Last-Event-ID, also to a restarted server, gets every event of the org once, in order", () =>
    Effect.gen(function*() {
      const service = yield* freshService("sse")
      const a = yield* service.key({ orgId: "org-a" })
      const b = yield* service.key({ orgId: "org-b" })
      const received: Array<SseEvent> = []
      const submitted: Array<string> = []
      const submit = (base: string, n: number) =>
        Effect.forEach(Array.from({ length: n }, (_, i) => i), (i) =>
          Effect.gen(function*() {
            const mine = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: i } } })
            expect(mine.status).toBe(201)
            submitted.push(mine.json.id)
            expect((yield* call(base, "POST", "/jobs", { key: b, body: { stage: "echo", payload: { n: i } } })).status).toBe(201)
          }), { discard: true })
      const finished = () => submitted.every((id) => received.some((e) => e.data.jobId === id && e.event === "completed"))
      const last = () => received[received.length - 1]!.id

      // the first server: a client follows from the beginning, hangs up mid-stream, comes back with Last-Event-ID
      yield* Effect.scoped(Effect.gen(function*() {
        const base = yield* service.start()
        // bad input: 400 with a JSON body, before any stream
        for (const path of ["/events?kind=exploded", "/events?job=abc"]) {
          const bad = yield* call(base, "GET", path, { key: a })
          expect([bad.status, bad.json?._tag]).toEqual([400, "BadRequest"])
        }
        for (const path of ["/events?from=yesterday", "/events?subject=%00", "/events?stage=" + "s,".repeat(1500)]) {
          const bad = yield* call(base, "GET", path, { key: a })
          expect([path, bad.status, typeof bad.json?._tag, typeof bad.json?.message]).toEqual([path, 400, "string", "string"])
        }
        const bad = yield* call(base, "GET", "/events", { key: a, headers: { "last-event-id": "yesterday" } })
        expect([bad.status, bad.json?._tag]).toEqual([400, "BadRequest"])
        expect((yield* call(base, "GET", "/events")).status).toBe(401)

        const first = yield* Effect.scoped(Effect.gen(function*() {
          const client = yield* openSse(base, a, "/events?from=beginning")
          expect(client.status).toBe(200)
          yield* submit(base, 10)
          yield* waitFor("some events on the first connection", Effect.sync(() => client.events.length >= 5))
          client.close()
          yield* Effect.promise(() => client.reading)
          return [...client.events]
        }))
        received.push(...first)
        yield* submit(base, 5)
        yield* Effect.scoped(Effect.gen(function*() {
          const client = yield* openSse(base, a, "/events", last())
          yield* waitFor("the jobs of the first server to finish, on the second connection", Effect.sync(() => {
            const all = [...received, ...client.events]
            return submitted.every((id) => all.some((e) => e.data.jobId === id && e.event === "completed"))
          }))
          client.close()
          yield* Effect.promise(() => client.reading)
          received.push(...client.events)
        }))
      }))
      expect(finished()).toBe(true)

      // while no server runs: jobs of org A enqueued by another producer (they run once the next server's worker starts)
      const producer = Context.get(yield* Layer.build(PgQueue.layer().pipe(Layer.provide(Layer.succeed(Db.Db, service.db)))), Queue.Queue)
      const offline = yield* producer.enqueue(Array.from({ length: 5 }, (_, n) => ({ stage: "echo", orgId: "org-a", payload: { n } })))
      submitted.push(...offline.map((r) => r.id))
      // a new server (a restart), the same client's Last-Event-ID
      yield* Effect.scoped(Effect.gen(function*() {
        const base = yield* service.start()
        const client = yield* openSse(base, a, "/events", last())
        yield* submit(base, 5)
        yield* waitFor("every job to finish, on the connection to the restarted server", Effect.sync(() => {
          const all = [...received, ...client.events]
          return submitted.every((id) => all.some((e) => e.data.jobId === id && e.event === "completed"))
        }))
        received.push(...client.events)

        // the same sequence a fresh client reads from the beginning: none missing, none twice, the same order
        const fresh = yield* openSse(base, a, "/events?from=beginning")
        yield* waitFor("the fresh client to catch up", Effect.sync(() => fresh.events.length >= received.length))
        expect(fresh.events.map((e) => e.id)).toEqual(received.map((e) => e.id))
      }))

      expect(new Set(received.map((e) => e.id)).size).toBe(received.length)
      // only org A's, and each of its jobs: enqueued, started, completed, in that order
      expect(received.every((e) => e.data.orgId === "org-a")).toBe(true)
      for (const id of submitted) {
        expect(received.filter((e) => e.data.jobId === id).map((e) => e.event)).toEqual(["enqueued", "started", "completed"])
      }
      expect(received.length).toBe(submitted.length * 3)
      expect(received.map((e) => e.event).every((k) => k === received.find((r) => r.event === k)!.data.kind)).toBe(true)
    }), { timeout: 180_000 })

  it.scopedLive("an open SSE client and a webhook on an idle service: at most one statement per 10 s; the next job's events still reach the client", () =>
    Effect.gen(function*() {
      let statements: Array<string> = []
      const service = yield* freshService("sse_idle", { onStatement: (q) => statements.push(q) })
      const a = yield* service.key({ orgId: "org-a" })
      const base = yield* service.start()
      const client = yield* openSse(base, a, "/events?stage=echo")
      expect(client.status).toBe(200)
      // a webhook subscription too (nothing is delivered while nothing happens)
      process.env.PGFIBER_WEBHOOK_ALLOW_PRIVATE = "true"
      yield* Effect.addFinalizer(() => Effect.sync(() => delete process.env.PGFIBER_WEBHOOK_ALLOW_PRIVATE))
      const hook = yield* call(base, "POST", "/webhooks", { key: a, body: { url: "http://127.0.0.1:9/hook" } })
      expect(hook.status).toBe(201)
      // start-up (the worker's catch-up claim and timer, the client's cursor) is over once 2 s pass without a statement
      yield* waitForQuiet("the start-up statements to end", () => statements.length)
      statements = []
      // the measurement's window, not a wait for something to happen
      yield* Effect.sleep("10 seconds")
      console.log(`idle service with an SSE client and a webhook open: ${statements.length} statements in 10 s`, statements)
      expect(statements.length).toBeLessThanOrEqual(1)
      const job = yield* call(base, "POST", "/jobs", { key: a, body: { stage: "echo", payload: { n: 1 } } })
      yield* waitFor("the job's events on the open stream", Effect.sync(() =>
        client.events.filter((e) => e.data.jobId === job.json.id).map((e) => e.event).join() === "enqueued,started,completed"))
    }), { timeout: 180_000 })
})
