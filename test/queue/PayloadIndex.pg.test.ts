/**
 * The live jobs' payload index does not grow without end: GIN keeps an entry key after the last row that had it,
 * so jobs with payloads of their own leave the index larger than the table once they are gone. The housekeeping
 * stage's `payload-index` task rebuilds it concurrently once it has outgrown the table, leaves one that has not
 * alone, and drops an invalid copy a failed rebuild left behind.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PayloadIndex from "../../packages/pgfiber/src/queue/PayloadIndex.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Housekeeping from "../../packages/pgfiber/src/stages/housekeeping/Housekeeping.js"
import { layerDb } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"

const job: Stage.JobInfo = {
  id: "1", stage: Housekeeping.stageName, attempt: 1, maxAttempts: 3, polls: 0, orgId: null, subjectId: null,
  createdAt: new Date(), claimedAt: new Date(), ...Stage.jobInfoDefaults
}

const indexBytes = Effect.gen(function*() {
  const db = yield* Db.Db
  const [row] = yield* db.run((sql) => sql<Array<{ n: string }>>`select pg_relation_size(to_regclass('jobs_payload'))::text as n`)
  return Number(row!.n)
})

const indexValid = (name: string) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const rows = yield* db.run((sql) => sql<Array<{ valid: boolean }>>`
      select i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname = ${name}
        and c.relnamespace = (select oid from pg_namespace where nspname = current_schema())`)
    return rows.map((r) => r.valid)
  })

describe("the payload index's upkeep", () => {
  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("rebuilt once it has outgrown the table (jobs with payloads of their own, all gone); left alone while it has not", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        // 30,000 jobs, each with a payload value of its own, queued and gone again: the rows go, the keys stay
        yield* db.run((sql) => sql`
          insert into jobs (stage, payload) select 'bloat', jsonb_build_object('n', g, 'order', 'o-' || g) from generate_series(1, 30000) g`)
        yield* db.run((sql) => sql`delete from jobs where stage = 'bloat'`)
        // vacuumed until the rows are really gone (the heap truncated to nothing): another test's open transaction
        // on the same server keeps them visible, and a rebuild then keeps their entries
        yield* waitFor("the deleted jobs vacuumed away", Effect.gen(function*() {
          yield* db.run((sql) => sql`vacuum jobs`)
          const [row] = yield* db.run((sql) => sql<Array<{ n: string }>>`select pg_relation_size(to_regclass('jobs'))::text as n`)
          return Number(row!.n) === 0
        }), Duration.minutes(2), Duration.millis(500))
        // one live job whose payload search must still work after the rebuild
        const [live] = yield* q.enqueue([{ stage: "kept", payload: { customer: 42 } }])
        const bloated = yield* indexBytes
        // smaller than the default floor: nothing to do
        const untouched = yield* PayloadIndex.upkeep()
        expect(untouched.rebuilt).toBe(false)
        expect(untouched.indexBytes).toBe(bloated)
        // with no floor it is larger than the (vacuumed, truncated) table: the housekeeping task rebuilds it
        expect(untouched.tableBytes).toBeLessThan(bloated)
        yield* Housekeeping.housekeeping.handler({ task: "payload-index", minMB: 0 }, job)
        const rebuilt = yield* indexBytes
        expect(rebuilt).toBeLessThan(bloated / 4)
        expect(yield* indexValid("jobs_payload")).toEqual([true])
        const found = yield* q.list({ payload: { customer: 42 } })
        expect(found.map((j) => j.id)).toEqual([live!.id])
        // rebuilt to what the live rows need; with any floor above that, a second run leaves it as it is
        expect(rebuilt).toBeLessThan(1024 * 1024)
        const again = yield* PayloadIndex.upkeep({ minBytes: 1024 * 1024 })
        expect(again.rebuilt).toBe(false)
      }))

    it.effect("an invalid copy left by a failed rebuild is dropped before anything else", () =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        // what an interrupted REINDEX CONCURRENTLY leaves: an index marked invalid under the `_ccnew` name
        yield* db.run((sql) => sql`create index jobs_payload_ccnew on jobs using gin (payload jsonb_path_ops)`)
        yield* db.run((sql) => sql`
          update pg_index set indisvalid = false where indexrelid = to_regclass('jobs_payload_ccnew')`)
        expect(yield* indexValid("jobs_payload_ccnew")).toEqual([false])
        const r = yield* PayloadIndex.upkeep()
        expect(r.droppedLeftovers).toEqual(["jobs_payload_ccnew"])
        expect(yield* indexValid("jobs_payload_ccnew")).toEqual([])
        expect(yield* indexValid("jobs_payload")).toEqual([true])
      }))
  })
})
