/**
 * `pgfiber schedules …` as the real binary against a fresh schema: add, list, disable/enable, run-now,
 * remove, the exit codes for bad input (2) and an unknown name (3), and `tick` firing a due schedule before
 * it claims (where only ticks run, schedules still make their jobs).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { pgfiber, query } from "./support.js"

describe("pgfiber schedules", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 300_000 })((it) => {
    it.effect("add, list, disable, enable, run-now, remove; bad input exits 2, an unknown name 3", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [added, badCron, badStage] = yield* Effect.all([
          pgfiber(schema, ["schedules", "add", "nightly", "--stage", "pgfiber.echo", "--cron", "30 2 * * *", "--tz", "Europe/Berlin",
            "--payload", `{"message":"night"}`, "--org", "acme"]),
          pgfiber(schema, ["schedules", "add", "bad", "--stage", "pgfiber.echo", "--cron", "* *"]),
          pgfiber(schema, ["schedules", "add", "bad", "--stage", "nope", "--every", "1 minute"])
        ], { concurrency: 2 })
        expect(added.code).toBe(0)
        expect(added.stdout).toMatch(/^nightly: 30 2 \* \* \* \(Europe\/Berlin\), next tick \d{4}-\d\d-\d\dT(00|01):30:00\.000Z\n$/)
        expect([badCron.code, badStage.code]).toEqual([2, 2])
        expect(badCron.stderr).toContain("is not a cron expression")
        expect(badStage.stderr).toContain(`unknown stage "nope"`)

        const list = yield* pgfiber(schema, ["schedules", "list"])
        const lines = list.stdout.trim().split("\n")
        expect(lines[0]).toMatch(/^NAME\s+ORG\s+STAGE\s+WHEN\s+ENABLED\s+CATCH-UP\s+NEXT TICK\s+LAST TICK\s+SOURCE$/)
        expect(lines.slice(1)).toEqual([expect.stringMatching(/^nightly\s+acme\s+pgfiber\.echo\s+30 2 \* \* \* \(Europe\/Berlin\)\s+yes\s+skip\s+\S+\s+runtime$/)])

        const [disabled, missing] = yield* Effect.all([
          pgfiber(schema, ["schedules", "disable", "nightly", "--org", "acme"]),
          pgfiber(schema, ["schedules", "disable", "nightly"]) // no org: a different (system) schedule, not there
        ], { concurrency: 2 })
        expect([disabled.code, disabled.stdout]).toEqual([0, "disabled\n"])
        expect(missing.code).toBe(3)
        const [row] = yield* query<{ enabled: boolean }>(schema, "select enabled from schedules where name = 'nightly'")
        expect(row!.enabled).toBe(false)

        const ran = yield* pgfiber(schema, ["schedules", "run-now", "nightly", "--org", "acme"])
        expect(ran.code).toBe(0)
        const [job] = yield* query<{ id: string; org_id: string; payload: unknown }>(schema,
          "select id::text, org_id, payload from jobs where stage = 'pgfiber.echo'")
        expect(job).toEqual({ id: ran.stdout.trim(), org_id: "acme", payload: { message: "night" } })

        const [removed, removedAgain] = [
          yield* pgfiber(schema, ["schedules", "remove", "nightly", "--org", "acme"]),
          yield* pgfiber(schema, ["schedules", "remove", "nightly", "--org", "acme"])
        ]
        expect([removed.code, removedAgain.code]).toEqual([0, 3])
      }), 300_000)

    it.effect("tick fires a due schedule, exactly once, before it claims", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* query(schema, "delete from jobs")
        const added = yield* pgfiber(schema, ["schedules", "add", "often", "--stage", "pgfiber.echo", "--every", "1 second",
          "--payload", `{"message":"tick"}`])
        expect(added.code).toBe(0)
        // make the first tick due now, whatever the machine's speed (a compiled CLI starts well within the second);
        // set by SQL, the cursor has microseconds, which the firing's compare-and-set must still match
        yield* query(schema, "update schedules set next_tick_at = now() - interval '1 second' where name = 'often'")
        const [a, b] = yield* Effect.all([pgfiber(schema, ["tick", "--max", "5"]), pgfiber(schema, ["tick", "--max", "5"])], { concurrency: 2 })
        expect([a.code, b.code]).toEqual([0, 0])
        const [s] = yield* query<{ last_tick_at: Date | null; next_tick_at: Date }>(schema,
          "select last_tick_at, next_tick_at from schedules where name = 'often'")
        expect(s!.last_tick_at).not.toBeNull()
        // skip: each firing made one job for the latest tick; two ticks of the same second never make two jobs
        const claimed = [a, b].map((t) => Number(/^claimed (\d+)/.exec(t.stdout)![1]))
        expect(claimed.reduce((x, y) => x + y, 0)).toBeGreaterThanOrEqual(1)
        expect(claimed.reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(2)
      }), 300_000)
  })
})
