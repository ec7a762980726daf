/**
 * The compiled CLI's bulk actions on live jobs chosen by a filter: without --yes a preview count and no change,
 * with it the action, recorded with its actor. The jobs belong to a stage this build does not know (a user's
 * own, written straight into the table), which the bulk actions reach all the same.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { pgfiber, query } from "./support.js"

const insertJobs = (schema: string, stage: string, n: number, payload: (i: string) => string, extra = "") =>
  query(schema, `
    insert into jobs (stage, org_id, payload${extra === "" ? "" : ", available_at"})
    select '${stage}', case when i % 2 = 0 then 'acme' else 'globex' end, (${payload("i")})::jsonb${extra === "" ? "" : `, ${extra}`}
    from generate_series(1, ${n}) as s(i)`)

describe("pgfiber jobs cancel|retry|run-now|priority by filter", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("without --yes prints how many would change and changes nothing; with --yes does it and records who", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* insertJobs(schema, "probe.work", 40, (i) => `jsonb_build_object('customer', case when ${i} <= 30 then 42 else 7 end, 'n', ${i})`)
        yield* insertJobs(schema, "other.work", 5, () => `'{"customer":42}'`)

        const preview = yield* pgfiber(schema, ["jobs", "cancel", "--stage", "probe.work", "--where", `{"customer":42}`])
        expect(preview.code).toBe(0)
        expect(preview.stdout).toBe("30 jobs would be cancelled; add --yes to do it\n")
        const stillThere = yield* query<{ n: number }>(schema, "select count(*)::int as n from jobs where stage = 'probe.work'")
        expect(stillThere[0]!.n).toBe(40)

        // key=value and an org narrow it further
        const narrowed = yield* pgfiber(schema, ["jobs", "cancel", "--stage", "probe.work", "--where", "customer=42", "--org", "acme", "--json"])
        expect(JSON.parse(narrowed.stdout)).toEqual({ action: "cancel", dryRun: true, matched: 15 })

        const done = yield* pgfiber(schema, ["jobs", "cancel", "--stage", "probe.work", "--where", `{"customer":42}`, "--yes"])
        expect(done.code).toBe(0)
        expect(done.stdout).toBe("30 jobs cancelled\n")
        const left = yield* query<{ stage: string; n: number }>(schema,
          "select stage, count(*)::int as n from jobs group by stage order by stage")
        expect(left).toEqual([{ stage: "other.work", n: 5 }, { stage: "probe.work", n: 10 }])
        // one job by id, as before
        const [one] = yield* query<{ id: string }>(schema, "select id::text from jobs where stage = 'other.work' order by id limit 1")
        const single = yield* pgfiber(schema, ["jobs", "cancel", one!.id])
        expect([single.code, single.stdout]).toEqual([0, "cancelled\n"])
        const recorded = yield* query<{ action: string; actor: string; matched: number; affected: number; filter: unknown }>(schema,
          "select action, actor, matched, affected, filter from job_actions")
        expect(recorded).toEqual([{ action: "cancel", actor: "cli", matched: 30, affected: 30, filter: { stage: "probe.work", payload: { customer: 42 } } }])
        const listed = yield* pgfiber(schema, ["jobs", "actions"])
        expect(listed.stdout.split("\n")[0]).toMatch(/^ID\s+ACTION\s+MATCHED\s+CHANGED\s+BY\s+ORG\s+FINISHED\s+FILTER$/)
        expect(listed.stdout.split("\n")[1]).toMatch(/^\s*\d+\s+cancel\s+30\s+30\s+cli\s+\S+Z\s+\{"stage":"probe\.work"/)
      }))

    it.effect("run-now and priority act on delayed and queued jobs; bad filters exit 2 with the reason", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* insertJobs(schema, "later.work", 12, (i) => `jsonb_build_object('n', ${i})`, "now() + interval '1 day'")
        const preview = yield* pgfiber(schema, ["jobs", "run-now", "--stage", "later.work"])
        expect(preview.stdout).toBe("12 jobs would be made due now; add --yes to do it\n")
        const ran = yield* pgfiber(schema, ["jobs", "run-now", "--stage", "later.work", "--status", "delayed", "--yes"])
        expect(ran.stdout).toBe("12 jobs made due now\n")
        const due = yield* query<{ n: number }>(schema, "select count(*)::int as n from jobs where stage = 'later.work' and available_at <= now()")
        expect(due[0]!.n).toBe(12)

        const prio = yield* pgfiber(schema, ["jobs", "priority", "fast", "--stage", "later.work", "--where", "n=3", "--yes", "--json"])
        expect(JSON.parse(prio.stdout)).toMatchObject({ action: "priority", dryRun: false, matched: 1, affected: 1 })
        const fast = yield* query<{ n: number }>(schema, "select (payload->>'n')::int as n from jobs where stage = 'later.work' and priority = 10")
        expect(fast).toEqual([{ n: 3 }])

        const [noFilter, badWhere, badAge, badStatus, both] = yield* Effect.all([
          pgfiber(schema, ["jobs", "cancel", "--yes"]),
          pgfiber(schema, ["jobs", "cancel", "--stage", "later.work", "--where", "{oops"]),
          pgfiber(schema, ["jobs", "retry", "--stage", "later.work", "--older-than", "yesterday"]),
          pgfiber(schema, ["jobs", "retry", "--status", "finished"]),
          pgfiber(schema, ["jobs", "cancel", "123", "--stage", "later.work"])
        ], { concurrency: 2 })
        expect(noFilter.code).toBe(2)
        expect(noFilter.stderr).toContain("name at least one filter")
        expect(badWhere.code).toBe(2)
        expect(badWhere.stderr).toContain("not valid JSON")
        expect(badAge.code).toBe(2)
        expect(badAge.stderr).toContain("is not an age")
        expect(badStatus.code).toBe(2)
        expect(both.code).toBe(2)
        expect(both.stderr).toContain("not both")
        const count = yield* query<{ n: number }>(schema, "select count(*)::int as n from jobs where stage = 'later.work'")
        expect(count[0]!.n).toBe(12)
      }))
  })
})
