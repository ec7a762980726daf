/**
 * A fan-in of 10,000 children under fire: worker processes are SIGKILLed again and again while the children run
 * (each replaced by a new one); their leases expire and the jobs come back. The parent is released once, by the
 * settle of its last child, and runs exactly once; every child completed; nothing is left waiting or lost.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { fixture, freshSchema, spawnWorkerProcess } from "../support/workerProcess.js"

const children = 10_000
const kills = 5

/** A fresh schema with the executions table, and a parent waiting on `children` children enqueued as one flow. */
const fanIn = (prefix: string) =>
  Effect.gen(function*() {
    const { schema, sql } = yield* freshSchema(
      prefix,
      `create table executions (job_id bigint, stage text, worker_id text, at timestamptz default clock_timestamp())`
    )
    const queue = yield* Layer.build(PgQueue.layer().pipe(
      Layer.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 })))
    )).pipe(Effect.orDie)
    const flow = yield* Queue.enqueueFlow({
      job: { stage: "fan_parent", payload: {} },
      children: Array.from({ length: children }, (_, n) => ({ job: { stage: "fan_child", payload: { n } } }))
    }).pipe(Effect.provide(queue))
    return { schema, sql, flow }
  })

describe("fan-in under SIGKILL", () => {
  it.live(`workers SIGKILLed ${kills} times during a fan-in of ${children.toLocaleString("en")}: the parent runs exactly once, nothing is lost`, () =>
    Effect.gen(function*() {
      const { schema, sql, flow } = yield* fanIn("fanin")
      const spawn = (id: string) =>
        spawnWorkerProcess(fixture("fanInWorker.ts"), { PGFIBER_SCHEMA: schema, WORKER_ID: id, LOG_LEVEL: "warn" })
      const workers = [yield* spawn("w0"), yield* spawn("w1")]
      const childRuns = Effect.promise(() => sql<Array<{ n: number }>>`select count(distinct job_id)::int as n from executions where stage = 'fan_child'`)
      // kill one worker each time another tenth of the children has run, while children remain
      for (let k = 0; k < kills; k++) {
        const target = Math.round((children * (k + 1)) / (kills + 2))
        yield* waitFor(`${target} children to have run`, Effect.map(childRuns, ([r]) => r!.n >= target), Duration.minutes(4))
        const victim = workers[k % workers.length]!
        victim.child.kill("SIGKILL")
        yield* Effect.promise(() => victim.exited)
        workers[k % workers.length] = yield* spawn(`w${k + 2}`)
      }
      yield* waitFor("the parent to complete", Effect.promise(async () => {
        const [row] = await sql<Array<{ status: string }>>`select status from jobs_archive where id = ${flow.id}`
        return row?.status === "completed"
      }), Duration.minutes(5))
      const [counts] = yield* Effect.promise(() => sql<Array<{ parent_runs: number; children_completed: number; live: number; dead: number; edges: number }>>`
        select (select count(*)::int from executions where stage = 'fan_parent') as parent_runs,
               (select count(*)::int from jobs_archive where stage = 'fan_child' and status = 'completed') as children_completed,
               (select count(*)::int from jobs) as live,
               (select count(*)::int from dead_letters) as dead,
               (select count(*)::int from job_dependencies where job_id = ${flow.id}) as edges`)
      const [firstParentRun] = yield* Effect.promise(() => sql<Array<{ after_last_child: boolean }>>`
        select (select min(at) from executions where stage = 'fan_parent') >= (select max(at) from executions where stage = 'fan_child') as after_last_child`)
      console.log(`fan-in of ${children} with ${kills} SIGKILLs: ${JSON.stringify(counts)}`)
      expect(counts).toEqual({ parent_runs: 1, children_completed: children, live: 0, dead: 0, edges: children })
      expect(firstParentRun!.after_last_child).toBe(true)
    }).pipe(Effect.scoped), 900_000)
})
