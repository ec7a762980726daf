/**
 * The real binary as a child process against a fresh schema: enqueue then `tick --max 1` runs exactly one
 * job, the stats table, exit codes for bad input, for a database not migrated yet and for a bad configuration value. (CliDlq.test.ts has the
 * dead-letter workflow and keys; each spawn costs a
 * fraction of a second of module loading, so the two files share the work.)
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { dropSchema, freshSchemaName, layerDb } from "../support/pg.js"
import { logLines, pgfiber, query } from "./support.js"

describe("pgfiber CLI", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("enqueue, then tick --max 1 processes exactly one job; stats prints the table", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [first, second] = yield* Effect.all([
          pgfiber(schema, ["enqueue", "pgfiber.echo", `{"message":"one"}`]),
          pgfiber(schema, ["enqueue", "pgfiber.echo", `{"message":"two"}`, "--org", "acme"])
        ], { concurrency: 2 })
        expect(first.code).toBe(0)
        expect(second.code).toBe(0)
        // stdout is the id and nothing else (logs go to stderr)
        expect(first.stdout).toMatch(/^\d+\n$/)
        expect(second.stdout).toMatch(/^\d+\n$/)

        const tick = yield* pgfiber(schema, ["tick", "--max", "1"])
        expect(tick.code).toBe(0)
        expect(tick.stdout).toBe("claimed 1: completed 1, retried 0, rescheduled 0, dead-lettered 0, released 0, fenced 0\n")
        const left = yield* query<{ id: string }>(schema, "select id::text from jobs where stage = 'pgfiber.echo'")
        expect(left.length).toBe(1)
        // the job's log line carries stage, job id and attempt
        const echoLine = logLines(tick).find((l) => typeof l.message === "string" && l.message.startsWith("echo: "))
        expect(echoLine.annotations).toMatchObject({ stage: "pgfiber.echo", attempt: 1 })
        expect([first.stdout.trim(), second.stdout.trim()]).toContain(echoLine.annotations.jobId)
        expect(left[0]!.id).not.toBe(echoLine.annotations.jobId)

        const stats = yield* pgfiber(schema, ["stats"])
        expect(stats.code).toBe(0)
        const lines = stats.stdout.trim().split("\n")
        expect(lines[0]).toMatch(/^STAGE\s+READY\s+SCHEDULED\s+RUNNING\s+CANCELLING\s+DEAD\s+OLDEST READY\s+PAUSED\s+NOTE$/)
        expect(lines.find((l) => l.startsWith("pgfiber.echo"))).toMatch(/^pgfiber\.echo\s+1\s+0\s+0\s+0\s+0\s+\S+$/)
        // every known stage has a row, busy or not, and a total closes the table
        expect(lines.some((l) => l.startsWith("extract_audio "))).toBe(true)
        expect(lines.at(-1)).toMatch(/^total\s+1\s+0\s+0\s+0\s+0\s+\S+$/)
      }))

    it.effect("bad input exits 2, a missing id 3, each with the reason on stderr; nothing is written", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        // (an unknown stage is refused by the same Submit.prepare; the HTTP tests show that one)
        const [schemaFail, badJson, missing, badArgs] = yield* Effect.all([
          pgfiber(schema, ["enqueue", "pgfiber.echo", `{"sleepMs":"soon"}`]),
          pgfiber(schema, ["enqueue", "pgfiber.echo", "{oops"]),
          pgfiber(schema, ["jobs", "show", "999999999"]),
          pgfiber(schema, ["tick", "--max", "lots"])
        ], { concurrency: 2 })
        expect(schemaFail.code).toBe(2)
        expect(schemaFail.stderr).toContain("payload does not match the pgfiber.echo schema")
        expect(badJson.code).toBe(2)
        expect(badJson.stderr).toContain("not valid JSON")
        expect(missing.code).toBe(3)
        expect(missing.stderr).toContain("job 999999999 not found")
        expect(badArgs.code).toBe(2)
        expect((yield* query(schema, "select 1 from jobs where payload ? 'sleepMs'")).length).toBe(0)
      }))

    it.effect("stages pause/resume/purge; jobs show and jobs history read a finished job", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const ids = yield* Effect.forEach([1, 2, 3], (n) => pgfiber(schema, ["enqueue", "pgfiber.echo", `{"message":"m${n}"}`]))
        expect((yield* pgfiber(schema, ["stages", "pause", "pgfiber.echo"])).stdout).toBe("paused\n")
        // a paused stage claims nothing, even from tick
        expect((yield* pgfiber(schema, ["tick", "--max", "1"])).stdout).toMatch(/^claimed 0/)
        const stats = yield* pgfiber(schema, ["stats"])
        expect(stats.stdout.split("\n").find((l) => l.startsWith("pgfiber.echo"))).toMatch(/\spaused$/)
        expect((yield* pgfiber(schema, ["stages", "list"])).stdout).toMatch(/pgfiber\.echo\s+paused\s+.*\s+cli/)
        expect((yield* pgfiber(schema, ["stages", "resume", "pgfiber.echo"])).stdout).toBe("resumed\n")
        const tick = yield* pgfiber(schema, ["tick", "--max", "1"])
        expect(tick.stdout).toMatch(/^claimed 1: completed 1/)
        const finished = yield* query<{ id: string }>(schema,
          "select id::text from jobs_archive where stage = 'pgfiber.echo' order by finished_at desc limit 1")
        const shown = yield* pgfiber(schema, ["jobs", "show", finished[0]!.id])
        expect(shown.code).toBe(0)
        const job = JSON.parse(shown.stdout)
        expect(job).toMatchObject({ id: finished[0]!.id, status: "completed", stage: "pgfiber.echo" })
        expect(job.finishedAt).not.toBeNull()
        expect(job.startedAt).not.toBeNull()
        const history = (yield* pgfiber(schema, ["jobs", "history", "--stage", "pgfiber.echo"])).stdout.split("\n")
        expect(history[0]).toMatch(/^\s*ID\s+STAGE\s+STATUS\s+ATTEMPTS\s+FINISHED\s+LAST RUN\s+ORG\s+LAST ERROR$/)
        expect(history).toContainEqual(
          expect.stringMatching(new RegExp(`^\\s*${finished[0]!.id}\\s+pgfiber\\.echo\\s+completed\\s+\\d+\\s+\\d{4}-\\d\\d-\\d\\dT\\S+Z\\s+\\d+ ms$`))
        )
        // purge needs --yes; then the queued ones go
        const refused = yield* pgfiber(schema, ["stages", "purge", "pgfiber.echo"])
        expect(refused.code).toBe(2)
        expect(refused.stderr).toContain("--yes")
        const queued = yield* query(schema, "select 1 from jobs where stage = 'pgfiber.echo' and status = 'queued'")
        expect(queued.length).toBeGreaterThanOrEqual(2)
        const purged = yield* pgfiber(schema, ["stages", "purge", "pgfiber.echo", "--yes"])
        expect(purged.stdout).toBe(`${queued.length}\n`)
        expect(yield* query(schema, "select 1 from jobs where stage = 'pgfiber.echo'")).toEqual([])
        expect(ids.every((r) => r.code === 0)).toBe(true)
      }))

    it.effect("on a database without pgfiber's tables (or some of its migrations), commands say to run `pgfiber migrate` and exit 2", () =>
      Effect.gen(function*() {
        const fresh = freshSchemaName("unmigrated")
        const behind = freshSchemaName("behind")
        yield* Effect.addFinalizer(() => Effect.zipRight(dropSchema(fresh), dropSchema(behind)))
        const runs = yield* Effect.all([
          pgfiber(fresh, ["stats"]),
          pgfiber(fresh, ["jobs", "show", "1"]),
          pgfiber(fresh, ["enqueue", "pgfiber.echo", `{"message":"x"}`]),
          pgfiber(fresh, ["keys", "create", "--org", "acme"]),
          pgfiber(fresh, ["schedules", "list"]),
          pgfiber(fresh, ["tick", "--max", "1"])
        ], { concurrency: 2 })
        for (const run of runs) {
          // the one line of the failure (`tick` logs which pipelines it skips before it reaches the database)
          const said = run.stderr.split("\n").filter((l) => l.startsWith("pgfiber:"))
          expect({ code: run.code, stdout: run.stdout, said }).toEqual({
            code: 2,
            stdout: "",
            said: [`pgfiber: the database has no pgfiber tables (schema "${fresh}"): run \`pgfiber migrate\` first`]
          })
          expect(run.stderr).not.toContain("does not exist")
        }
        // nothing was created by asking
        expect(yield* query(fresh, `select 1 from pg_namespace where nspname = '${fresh}'`)).toEqual([])

        // a schema some migrations behind this build
        yield* query(behind, `create schema ${behind}`)
        yield* query(behind, `create table ${behind}.migrations (id integer primary key, name text not null)`)
        yield* query(behind, `insert into ${behind}.migrations values (1, 'queue')`)
        const stats = yield* pgfiber(behind, ["stats"])
        expect(stats.code).toBe(2)
        expect(stats.stderr).toMatch(new RegExp(`^pgfiber: the database schema "${behind}" lacks \\d+ migration\\(s\\) of this build \\(0002_api_keys, …\\): run \`pgfiber migrate\` first\n$`))

        // once migrated, the same command works
        const migrated = yield* pgfiber(fresh, ["migrate"])
        expect(migrated.code).toBe(0)
        expect((yield* pgfiber(fresh, ["stats"])).code).toBe(0)
      }).pipe(Effect.scoped))

    it.effect("a bad configuration value exits 78 naming the variable", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [level, body] = yield* Effect.all([
          pgfiber(schema, ["stats"], { LOG_LEVEL: "loud" }),
          pgfiber(schema, ["start"], { HTTP_MAX_BODY_BYTES: "12" })
        ], { concurrency: 2 })
        expect(level.code).toBe(78)
        expect(level.stderr).toContain("LOG_LEVEL")
        expect(body.code).toBe(78)
        expect(body.stderr).toContain("HTTP_MAX_BODY_BYTES")
      }))
  
    it.effect("jobs show prints the parents a job waits on and its children; jobs list --status waiting lists it", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const [parent] = yield* query<{ id: string }>(schema, "insert into jobs (stage, payload) values ('pgfiber.flows_parent', '{}') returning id::text")
        // the SQL a producer can write: the edge, the count, and the mark on the parent its settle reads
        const [child] = yield* query<{ id: string }>(schema, `
          with child as (
            insert into jobs (stage, payload, status, waiting_on) values ('pgfiber.flows_child', '{}', 'waiting', 1) returning id
          ), edge as (
            insert into job_dependencies (job_id, depends_on) select id, ${parent!.id} from child
          ), marked as (
            update jobs set has_dependents = true where id = ${parent!.id}
          )
          select id::text from child`)
        const shown = yield* pgfiber(schema, ["jobs", "show", child!.id])
        expect(shown.code).toBe(0)
        const job = JSON.parse(shown.stdout)
        expect(job).toMatchObject({ id: child!.id, status: "waiting", waitingOn: 1 })
        expect(job.dependencies).toEqual({
          parents: [{ id: parent!.id, stage: "pgfiber.flows_parent", status: "queued", onFailure: "cancel", output: null }],
          children: []
        })
        const fromParent = JSON.parse((yield* pgfiber(schema, ["jobs", "show", parent!.id])).stdout)
        expect(fromParent.dependencies.children.map((c: { id: string }) => c.id)).toEqual([child!.id])
        const waiting = (yield* pgfiber(schema, ["jobs", "list", "--status", "waiting"])).stdout.split("\n")
        expect(waiting[0]).toMatch(/^\s*ID\s+STAGE\s+STATUS\s+ATTEMPTS\s+DUE IN\s+PROGRESS\s+ORG\s+LAST ERROR$/)
        expect(waiting).toContainEqual(expect.stringMatching(new RegExp(`^\\s*${child!.id}\\s+pgfiber\\.flows_child\\s+waiting\\s+0/\\d+$`)))
      }))
  })
})
