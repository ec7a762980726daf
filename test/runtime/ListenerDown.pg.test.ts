/**
 * Polling while only LISTEN is down: the database answers, but the worker's LISTEN connection is terminated and
 * kept from coming back (its `listenUrl` goes through a TCP relay in this file that refuses connections while
 * "down"). The sweep is set to an hour, so nothing but the Waker's polling at `pollInterval` can find a job
 * enqueued meanwhile: polls must come round while the listener reports `down`, and jobs still run, round after
 * round; when the relay lets it through again the listener reports `listening`, polling stops and NOTIFY wakes
 * the pool again.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Redacted, Schema } from "effect"
import * as Net from "node:net"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Waker from "../../packages/pgfiber/src/runtime/Waker.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { databaseUrl, dropSchema, freshSchemaName, rawSql } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"

/** A TCP relay to the database that can cut every connection through it and refuse new ones. */
const relay = Effect.acquireRelease(
  Effect.async<{
    readonly url: string
    readonly refused: () => number
    /** Refuses new connections while down; `cut` also ends those open now. */
    readonly setDown: (down: boolean, cut?: boolean) => void
    readonly server: Net.Server
  }>((resume) => {
    const target = new URL(databaseUrl())
    const sockets = new Set<Net.Socket>()
    let down = false
    let refused = 0
    const server = Net.createServer((client) => {
      if (down) {
        refused++
        client.destroy()
        return
      }
      const upstream = Net.connect(Number(target.port || 5432), target.hostname)
      for (const [a, b] of [[client, upstream], [upstream, client]] as const) {
        sockets.add(a)
        a.on("error", () => b.destroy())
        a.on("close", () => {
          sockets.delete(a)
          b.destroy()
        })
      }
      client.pipe(upstream)
      upstream.pipe(client)
    })
    server.listen(0, "127.0.0.1", () => {
      const url = new URL(databaseUrl())
      url.hostname = "127.0.0.1"
      url.port = String((server.address() as Net.AddressInfo).port)
      resume(Effect.succeed({
        url: url.toString(),
        refused: () => refused,
        setDown: (d, cut = false) => {
          down = d
          if (cut) sockets.forEach((s) => s.destroy())
        },
        server
      }))
    })
  }),
  ({ server, setDown }) =>
    Effect.async<void>((resume) => {
      setDown(true, true)
      server.close(() => resume(Effect.void))
    })
)

const ran = new Map<string, number>()
const polled = Stage.make({
  name: "polled",
  payload: Schema.Struct({ tag: Schema.String }),
  handler: ({ tag }) => Effect.sync(() => void ran.set(tag, Date.now()))
})

const pollInterval = Duration.seconds(1)

describe("LISTEN down, the database up", () => {
  it.live("the listener reports down and stays down; jobs still run, found by polling; then listening again, and NOTIFY wakes", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("ldown")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const url = Redacted.make(databaseUrl())
      yield* Migrations.migrate().pipe(
        Effect.provide(Layer.scoped(Db.Db, Db.make({ url, schema, poolMax: 2 }))),
        Effect.orDie
      )
      const sql = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
      const proxy = yield* relay
      const scope = yield* Effect.scope
      const context = yield* Layer.buildWithScope(
        Worker.layer([polled], {
          workerId: "w-ldown",
          shutdownGrace: Duration.seconds(5),
          // the safety sweep would find the jobs too: an hour, so only polling can
          sweepInterval: Duration.hours(1),
          pollInterval,
          concurrency: {}
        }).pipe(
          Layer.provideMerge(PgQueue.layer()),
          // the pool connects directly; only LISTEN goes through the relay
          Layer.provideMerge(Layer.scoped(Db.Db, Db.make({ url, listenUrl: Redacted.make(proxy.url), schema, poolMax: 4 })))
        ),
        scope
      ).pipe(Effect.orDie)
      const queue = Context.get(context, Queue.Queue)
      const waker = Context.get(context, Waker.Waker)
      const health = waker.health

      yield* waitFor("the listener", Effect.map(health, (h) => h.listener === "listening"))
      const up = yield* health
      expect(up.listenerDownSince).toBeNull()
      expect(up.listenerReconnects).toBe(1)

      // the listener's backend terminated (the relay passes that on); the relay refuses it a new connection
      proxy.setDown(true)
      const killed = yield* Effect.promise(() =>
        sql<Array<{ pid: number }>>`
          select pg_terminate_backend(pid), pid from pg_stat_activity
          where query ilike 'listen%' and query ilike ${"%" + schema + "%"}`
      )
      expect(killed.length).toBe(1)
      const down = yield* waitFor("the listener to say it is down", Effect.map(health, (h) => h.listener === "down" && h))
      expect(down.listenerDownSince).not.toBeNull()
      expect(down.listenerDownReason).not.toBeNull()
      // it tries to come back and is refused: kept down, not merely slow
      yield* waitFor("a reconnect refused by the relay", Effect.sync(() => proxy.refused() > 0))

      // while down the Waker polls: its sweep comes round every pollInterval (an hour apart otherwise), and jobs
      // enqueued now, whose NOTIFY reaches no one, are found. Each round waits for a poll, then enqueues.
      for (const round of [1, 2, 3]) {
        const seen = (yield* health).lastSweepAt?.getTime() ?? 0
        yield* waitFor(
          `a poll while LISTEN is down (round ${round})`,
          Effect.map(health, (h) => (h.lastSweepAt?.getTime() ?? 0) > seen)
        )
        const enqueuedAt = Date.now()
        yield* queue.enqueue([1, 2].map((n) => ({ stage: "polled", payload: { tag: `down-${round}-${n}` } })))
        yield* waitFor(
          `round ${round}'s jobs to run while LISTEN is down`,
          Effect.sync(() => ran.has(`down-${round}-1`) && ran.has(`down-${round}-2`))
        )
        const h = yield* health
        console.log(`LISTEN down: round ${round}'s jobs ran ${Math.max(ran.get(`down-${round}-1`)!, ran.get(`down-${round}-2`)!) - enqueuedAt} ms after enqueue (pollInterval ${Duration.toMillis(pollInterval)} ms)`)
        // still down, so no reconnect's catch-up found them, and the sweep is an hour away: the poll did
        expect(h.listener).toBe("down")
        expect(h.listenerReconnects).toBe(1)
        expect(h.lastSweepAt!.getTime()).toBeGreaterThanOrEqual(down.listenerDownSince!.getTime())
      }

      // let it through: listening again, the down time cleared, one more reconnect
      proxy.setDown(false)
      const back = yield* waitFor("the listener to be back", Effect.map(health, (h) => h.listener === "listening" && h))
      expect(back.listenerDownSince).toBeNull()
      expect(back.listenerDownReason).toBeNull()
      expect(back.listenerReconnects).toBe(2)
      const afterAt = Date.now()
      yield* queue.enqueue([{ stage: "polled", payload: { tag: "after" } }])
      yield* waitFor("the job after the listener is back", Effect.sync(() => ran.has("after")))
      // polling stopped when LISTEN came back (the sweep is an hour): NOTIFY woke the pool
      const last = (yield* health).lastSweepAt
      expect(last === null || last.getTime() < afterAt).toBe(true)
    }).pipe(Effect.scoped), 120_000)
})
