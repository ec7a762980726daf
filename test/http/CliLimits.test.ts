/**
 * `pgfiber limits …` as the real binary against a fresh schema: the calls pipeline's SpeechKit quotas by
 * default, configuration over the code, a run-time override (what every process's claims read), its reset,
 * and bad input (exit 2); `tick` claiming within the configured limits.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { pgfiber, query } from "./support.js"

describe("pgfiber limits", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 300_000 })((it) => {
    it.effect("list shows code, configuration and overrides; set changes them at run time; reset drops them; bad input exits 2", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const listed = yield* pgfiber(schema, ["limits", "list", "--json"], { PGFIBER_MAX_RUNNING: "extract_audio=3" })
        expect(listed.code).toBe(0)
        const byStage = new Map((JSON.parse(listed.stdout) as Array<any>).map((v) => [v.stage, v]))
        expect(byStage.get("transcribe_start")).toMatchObject({
          source: "code", effective: { fair: true, rate: { limit: 500, perMs: 3_600_000, burst: 20, perOrg: false } }
        })
        expect(byStage.get("transcribe_poll").effective.rate).toMatchObject({ limit: 2_500, perMs: 3_600_000 })
        expect(byStage.get("extract_audio")).toMatchObject({ source: "config", effective: { maxRunning: 3 } })

        const set = yield* pgfiber(schema, ["limits", "set", "transcribe_poll", "--rate", "5/s", "--max-running-per-org", "2", "--fair", "off"])
        expect(set.code).toBe(0)
        const [row] = yield* query<Record<string, unknown>>(schema,
          "select fair, max_running_per_org, rate_limit, rate_per_ms::int as rate_per_ms from stage_limits where stage = 'transcribe_poll'")
        expect(row).toEqual({ fair: false, max_running_per_org: 2, rate_limit: 5, rate_per_ms: 1000 })
        const table = yield* pgfiber(schema, ["limits", "list"])
        expect(table.stdout).toMatch(/transcribe_poll\s+no\s+-\s+2\s+5\/s burst 5\s+override/)

        const [bad, nothing] = yield* Effect.all([
          pgfiber(schema, ["limits", "set", "transcribe_poll", "--rate", "fast"]),
          pgfiber(schema, ["limits", "set", "transcribe_poll"])
        ], { concurrency: 2 })
        expect([bad.code, nothing.code]).toEqual([2, 2])
        expect(bad.stderr).toContain("is not a rate")

        const reset = yield* pgfiber(schema, ["limits", "reset", "transcribe_poll"])
        expect(reset.code).toBe(0)
        expect(yield* query(schema, "select * from stage_limits")).toEqual([])
      }), 300_000)

    it.effect("tick claims within the configured limits, as a worker configured the same way would", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* query(schema, `insert into jobs (stage, payload) select 'pgfiber.echo', jsonb_build_object('message', 'm' || n) from generate_series(1, 5) n`)
        // a bucket of 2 an hour, both at once: however large --max, this tick may start only 2 of the 5
        const env = { PGFIBER_RATE_LIMIT: "pgfiber.echo=2/1h", PGFIBER_RATE_BURST: "pgfiber.echo=2" }
        const first = yield* pgfiber(schema, ["tick", "--max", "10", "--stages", "pgfiber.echo", "--json"], env)
        expect(first.code).toBe(0)
        expect(JSON.parse(first.stdout)).toMatchObject({ claimed: 2, completed: 2 })
        // the bucket is in the database, shared by every process: the next tick finds it empty
        const second = yield* pgfiber(schema, ["tick", "--max", "10", "--stages", "pgfiber.echo", "--json"], env)
        expect(JSON.parse(second.stdout)).toMatchObject({ claimed: 0 })
        const [left] = yield* query<{ n: number }>(schema, "select count(*)::int as n from jobs where stage = 'pgfiber.echo' and status = 'queued'")
        expect(left!.n).toBe(3)
        // without the configuration the stage's own limits (none) apply
        const free = yield* pgfiber(schema, ["tick", "--max", "10", "--stages", "pgfiber.echo", "--json"])
        expect(JSON.parse(free.stdout)).toMatchObject({ claimed: 3, completed: 3 })
      }), 300_000)
  })
})
