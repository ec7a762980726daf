/**
 * `pgfiber/client` on PostgreSQL: a producer written with promises enqueues (by name, or typed and encoded by a
 * stage's Schema), reads, cancels, waits for a result and follows events, on the core's own queue. What stands in
 * for a worker here is the core's Queue itself (claim and settle, as the runtime does), in the test's process.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Duration, Effect, Layer, ManagedRuntime, Redacted, Schema } from "effect"
import { connect, type Client, type LoggedEvent } from "pgfiber/client"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Outcome from "../../packages/pgfiber/src/queue/Outcome.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import { databaseUrl, dropSchema, freshSchemaName } from "../support/pg.js"
import { waitForPromise } from "../support/waitFor.js"

const schema = freshSchemaName("client")

/** The worker's side: the core's queue on the same schema, claiming and settling by hand. */
const worker = ManagedRuntime.make(
  PgQueue.layer().pipe(Layer.provideMerge(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 }))))
)
const claimAndSettle = (stage: string, outcome: (lease: Queue.Lease) => Outcome.Outcome) =>
  worker.runPromise(Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const claimed = yield* queue.claim(stage, 10, { workerId: "test-worker", leaseFor: Duration.seconds(30) })
    yield* queue.settle(claimed.map((job) => outcome(job)))
    return claimed.map((job) => job.id)
  }))

/** A stage whose payload Schema transforms (a Date travels as an ISO string): the client must encode through it. */
const report = Stage.make({
  name: "report",
  payload: Schema.Struct({ account: Schema.String, since: Schema.Date }),
  maxAttempts: 3,
  handler: () => Effect.void
})

let client: Client

beforeAll(async () => {
  // the first client migrates the fresh schema
  client = await connect({ url: databaseUrl(), schema })
})

afterAll(async () => {
  await client.close()
  await worker.dispose()
  await Effect.runPromise(dropSchema(schema))
})

describe("pgfiber/client", () => {
  it("enqueues by name and reads the job back; a dedupe key answers the live job", async () => {
    const first = await client.enqueue("mail", { to: "a@example.com" }, { priority: "fast", dedupeKey: "a" })
    const again = await client.enqueue("mail", { to: "a@example.com" }, { dedupeKey: "a" })
    expect(first.deduped).toBe(false)
    expect(again).toEqual({ id: first.id, deduped: true })
    const job = await client.get(first.id)
    expect(job).toMatchObject({ id: first.id, stage: "mail", status: "queued", priority: 10, payload: { to: "a@example.com" } })
    expect(await client.get("999999999")).toBeNull()
  })

  it("enqueues typed by a stage's Schema: the payload is encoded by it, the stage's defaults apply, a bad one is refused", async () => {
    const { id } = await client.enqueue(report, { account: "acme", since: new Date("2026-01-02T03:04:05.000Z") })
    expect(await client.get(id)).toMatchObject({ stage: "report", maxAttempts: 3, payload: { account: "acme", since: "2026-01-02T03:04:05.000Z" } })
    // a payload the Schema refuses (here from an untyped caller) rejects with the core's InvalidJob; nothing is written
    const refused = await client.enqueue(report, { account: 42 } as never).then(() => undefined, (e: unknown) => e)
    expect(refused).toMatchObject({ _tag: "InvalidJob", field: "payload" })
    expect(refused).toBeInstanceOf(Error)
    const bad = await client.enqueue("Not A Stage").then(() => undefined, (e: unknown) => e)
    expect(bad).toMatchObject({ _tag: "InvalidJob", field: "stage" })
  })

  it("waits for a result: resolves with the finished job and its output once a worker completes it", async () => {
    const { id } = await client.enqueue("resize", { width: 100 })
    const waiting = client.wait(id, { timeout: "2 minutes" })
    await waitForPromise("the job claimed and completed", async () =>
      (await claimAndSettle("resize", (lease) => Outcome.complete(lease, [], { url: "s3://thumb/1" }))).includes(id))
    const done = await waiting
    expect(done).toMatchObject({ id, status: "completed", output: { url: "s3://thumb/1" } })
    expect(done.finishedAt).toBeInstanceOf(Date)
    // a job already finished answers at once
    expect(await client.wait(id)).toMatchObject({ id, status: "completed" })
  })

  it("wait resolves for a dead-lettered job too, and rejects with WaitTimeout or JobNotFound", async () => {
    const { id } = await client.enqueue("flaky")
    await claimAndSettle("flaky", (lease) => Outcome.deadLetter(lease, { tag: "Permanent", message: "no such account" }))
    expect(await client.wait(id)).toMatchObject({ id, status: "dead" })
    const { id: never } = await client.enqueue("nobody_runs_this")
    expect(await client.wait(never, { timeout: 300 }).catch((e: unknown) => e)).toMatchObject({ _tag: "WaitTimeout", jobId: never })
    expect(await client.wait("999999999").catch((e: unknown) => e)).toMatchObject({ _tag: "JobNotFound" })
  })

  it("cancels a queued job: it is gone from the queue, kept as cancelled, and a wait on it resolves", async () => {
    const { id } = await client.enqueue("mail", { to: "c@example.com" })
    expect(await client.cancel(id)).toBe("cancelled")
    expect(await client.wait(id)).toMatchObject({ id, status: "cancelled" })
    expect(await client.cancel(id)).toBe("not-found")
    expect(await claimAndSettle("mail", (lease) => Outcome.complete(lease))).not.toContain(id)
  })

  it("follows events: a loop sees what a worker did, in order, resumes after an event id, and ends when it breaks", async () => {
    const { id } = await client.enqueue("thumbs", { n: 1 })
    const seen: Array<LoggedEvent> = []
    const following = (async () => {
      for await (const event of client.events({ stages: ["thumbs"] }, { from: "beginning" })) {
        seen.push(event)
        if (event.kind === "completed") break
      }
    })()
    await waitForPromise("the job claimed and completed", async () =>
      (await claimAndSettle("thumbs", (lease) => Outcome.complete(lease))).includes(id))
    await following
    // the job's life as the log has it, in order
    expect(seen.map((e) => [e.jobId, e.kind])).toEqual([[id, "enqueued"], [id, "started"], [id, "completed"]])
    // resuming after the last event seen: the next job's events only
    const { id: next } = await client.enqueue("thumbs", { n: 2 })
    const resumed: Array<LoggedEvent> = []
    for await (const event of client.events({ stages: ["thumbs"] }, { from: { after: seen.at(-1)!.id } })) {
      resumed.push(event)
      break
    }
    expect(resumed.map((e) => [e.jobId, e.kind])).toEqual([[next, "enqueued"]])
  })

  it("a tenant's client works under its org's row-level security: its jobs get the org, other orgs' are not there", async () => {
    const acme = await connect({ url: databaseUrl(), schema, orgId: "acme" })
    try {
      const { id } = await acme.enqueue("mail", { to: "t@acme.example" })
      expect(await acme.get(id)).toMatchObject({ orgId: "acme" })
      const { id: other } = await client.enqueue("mail", { to: "x@globex.example" }, { orgId: "globex" })
      expect(await acme.get(other)).toBeNull()
      expect(await acme.cancel(other)).toBe("not-found")
      expect(await client.get(other)).toMatchObject({ orgId: "globex", status: "queued" })
    } finally {
      await acme.close()
    }
  })

  it("close ends open event loops and rejects waits still pending, and later calls, with ClientClosed", async () => {
    const second = await connect({ url: databaseUrl(), schema, migrate: false })
    const { id } = await second.enqueue("nobody_runs_this")
    const waiting = second.wait(id).catch((e: unknown) => e)
    let ended = false
    const following = (async () => {
      for await (const _ of second.events({ jobId: id })) void _
      ended = true
    })()
    await second.close()
    expect(await waiting).toMatchObject({ _tag: "ClientClosed" })
    await following
    expect(ended).toBe(true)
    expect(await second.get(id).catch((e: unknown) => e)).toMatchObject({ _tag: "ClientClosed" })
  })

  it("with migrate: false, an unmigrated schema is refused on connect with NotMigrated", async () => {
    const empty = freshSchemaName("client_empty")
    try {
      expect(await connect({ url: databaseUrl(), schema: empty, migrate: false }).catch((e: unknown) => e)).toMatchObject({ _tag: "NotMigrated" })
    } finally {
      await Effect.runPromise(dropSchema(empty))
    }
  })
})
