/**
 * The real binary against a fresh schema: the dead-letter workflow (a job fails permanently, `dlq retry`
 * brings it back as a fresh job, `dlq purge` clears what was handled), API keys, and `--help`. Each spawn
 * costs module loading, so independent commands run side by side.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { pgfiber, query } from "./support.js"

describe("pgfiber CLI: dead letters and keys", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("dlq retry brings a dead letter back as a fresh job; show, conflict, purge", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        // a producer that is not pgfiber: a plain INSERT (Cli.test.ts covers `enqueue`)
        const [{ id: jobId }] = yield* query<{ id: string }>(
          schema,
          `insert into jobs (stage, payload) values ('pgfiber.echo', '{"fail":"permanent","message":"no audio stream"}') returning id::text`
        ) as Effect.Effect<[{ id: string }]>
        const tick = yield* pgfiber(schema, ["tick", "--max", "1", "--stages", "pgfiber.echo", "--json"])
        expect(JSON.parse(tick.stdout)).toMatchObject({ claimed: 1, deadLettered: 1 })

        const [dead] = yield* query<{ id: string; reason: string }>(schema, `select id::text, reason from dead_letters where job_id = ${jobId}`)
        expect(dead!.reason).toBe("no audio stream")

        const [table, retry] = yield* Effect.all([
          pgfiber(schema, ["dlq", "list", "--all"]),
          pgfiber(schema, ["dlq", "retry", dead!.id])
        ], { concurrency: 2 })
        expect(table.code).toBe(0)
        expect(table.stdout).toMatch(new RegExp(`^\\s*${dead!.id}\\s+${jobId}\\s+pgfiber\\.echo\\s.*no audio stream$`, "m"))
        expect(retry.code).toBe(0)
        const newJobId = retry.stdout.trim()
        expect(newJobId).toMatch(/^\d+$/)
        const [job] = yield* query<{ status: string; attempts: number; payload: unknown }>(
          schema,
          `select status, attempts, payload from jobs where id = ${newJobId}`
        )
        expect(job).toMatchObject({ status: "queued", attempts: 0, payload: { fail: "permanent", message: "no audio stream" } })

        const [show, again] = yield* Effect.all([
          pgfiber(schema, ["dlq", "show", dead!.id]),
          pgfiber(schema, ["dlq", "retry", dead!.id])
        ], { concurrency: 2 })
        expect(JSON.parse(show.stdout)).toMatchObject({ resolutionStatus: "retried", retriedJobId: newJobId, reason: "no audio stream" })
        expect(again.code).toBe(4)
        expect(again.stderr).toContain("already retried")
        // handled (retried) dead letters older than a moment are purged
        const purge = yield* pgfiber(schema, ["dlq", "purge", "--older-than", "1 millis"])
        expect(purge.stdout).toBe("1\n")
        expect((yield* query(schema, "select 1 from dead_letters")).length).toBe(0)
      }))

    it.effect("keys create prints the key once, only its hash is stored; --help works on commands", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [created, help, subHelp] = yield* Effect.all([
          pgfiber(schema, ["keys", "create", "--org", "acme", "--name", "ci"]),
          pgfiber(schema, ["--help"]),
          pgfiber(schema, ["dlq", "retry", "--help"])
        ], { concurrency: 2 })
        expect(created.code).toBe(0)
        expect(created.stdout).toMatch(/^pgf_[0-9a-f]{12}_[A-Za-z0-9_-]{43}\n$/)
        const [row] = yield* query<{ org_id: string; name: string; hash: string }>(
          schema,
          "select org_id, name, encode(key_hash, 'hex') as hash from api_keys"
        )
        expect(row).toMatchObject({ org_id: "acme", name: "ci" })
        expect(created.stdout).not.toContain(row!.hash)
        expect(help.code).toBe(0)
        for (const command of ["start", "worker", "migrate", "enqueue", "jobs list", "dlq retry", "stats", "tick", "keys create", "calls add"]) {
          expect(help.stdout).toContain(command)
        }
        expect(subHelp.code).toBe(0)
        expect(subHelp.stdout).toContain("Enqueue a dead letter's payload again")
      }))
  })
})
