/**
 * `pgfiber events` as a child process: the kept events of every org (or one), as lines or NDJSON; `--follow`
 * prints the events of jobs another process moves while it runs, and exits 0 on SIGINT; a bad kind or id is a
 * usage error (exit 2). And `pgfiber webhooks add|list|remove`.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Duration, Effect, Layer } from "effect"
import { spawn } from "node:child_process"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl, layerDb } from "../support/pg.js"
import { waitFor } from "../support/waitFor.js"
import { pgfiber } from "./support.js"
import { completeAll } from "../support/settle.js"

const repoRoot = Path.resolve(import.meta.dirname, "../..")

/** Runs through one job's life in this process: enqueued, started, completed. */
const runOne = (stage: string, orgId: string) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const [r] = yield* queue.enqueue([{ stage, orgId }])
    const [job] = yield* queue.claim(stage, 1, { workerId: "cli-test", leaseFor: Duration.seconds(30) })
    yield* completeAll(queue, [{ id: job!.id, lease: job!.lease }])
    return r!.id
  })

describe("pgfiber events", () => {
  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true, timeout: 180_000 })((it) => {
    it.effect("prints the kept events, every org's or one's, as lines or NDJSON; bad input exits 2", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const a = yield* runOne("cli_events", "acme")
        const b = yield* runOne("cli_events", "beta")
        const all = yield* pgfiber(schema, ["events", "--json", "--stage", "cli_events"])
        expect(all.code).toBe(0)
        const lines = all.stdout.trim().split("\n").map((l) => JSON.parse(l))
        expect(lines.map((e) => [e.jobId, e.kind])).toEqual([
          [a, "enqueued"], [a, "started"], [a, "completed"], [b, "enqueued"], [b, "started"], [b, "completed"]
        ])
        const acme = yield* pgfiber(schema, ["events", "--org", "acme", "--kind", "completed"])
        expect(acme.code).toBe(0)
        const acmeLines = acme.stdout.trim().split("\n")
        expect(acmeLines.length).toBe(1)
        expect(acmeLines[0]).toMatch(new RegExp(`^\\d+  \\S+  completed\\s+cli_events  job ${a}  attempt 1  acme  \\{.*"outputBytes":0`))
        // resuming after the first event: the other five
        const rest = yield* pgfiber(schema, ["events", "--json", "--stage", "cli_events", "--after", lines[0].id])
        expect(rest.stdout.trim().split("\n").map((l) => JSON.parse(l).id)).toEqual(lines.slice(1).map((e) => e.id))
        for (const args of [["events", "--kind", "exploded"], ["events", "--after", "yesterday"], ["events", "--job", "x"]]) {
          const bad = yield* pgfiber(schema, args)
          expect([args, bad.code]).toEqual([args, 2])
        }
      }))

    it.effect("--follow prints the events of jobs moved after it started, and exits 0 on SIGINT", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const child = spawn(process.execPath, [Path.join(repoRoot, "dist", "cli.js"), "events", "--follow", "--json", "--stage", "cli_follow"], {
          cwd: repoRoot,
          env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", DATABASE_URL: databaseUrl(), PGFIBER_SCHEMA: schema, LOG_FORMAT: "json" },
          stdio: ["ignore", "pipe", "pipe"]
        })
        yield* Effect.addFinalizer(() => Effect.sync(() => child.exitCode === null && child.kill("SIGKILL")))
        let stdout = ""
        let stderr = ""
        child.stdout.on("data", (d) => (stdout += d))
        child.stderr.on("data", (d) => (stderr += d))
        const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
        // it is following once it says so on stderr (its cursor taken: every event after it is printed)
        yield* waitFor("the follower to follow", Effect.sync(() => stderr.includes("following the event log")))
          .pipe(Effect.tapDefect(() => Effect.sync(() => console.log(stderr))))
        const ids = [yield* runOne("cli_follow", "acme"), yield* runOne("cli_follow", "beta")]
        yield* waitFor("both jobs' events on stdout", Effect.sync(() =>
          ids.every((id) => stdout.includes(`"jobId":"${id}","stage":"cli_follow","orgId"`) && stdout.split("\n").some((l) => l.includes(`"jobId":"${id}"`) && l.includes(`"kind":"completed"`)))
        )).pipe(Effect.tapDefect(() => Effect.sync(() => console.log(stdout, stderr))))
        const events = stdout.trim().split("\n").map((l) => JSON.parse(l))
        for (const id of ids) expect(events.filter((e) => e.jobId === id).map((e) => e.kind)).toEqual(["enqueued", "started", "completed"])
        child.kill("SIGINT")
        expect(yield* Effect.promise(() => exited)).toBe(0)
      }).pipe(Effect.scoped))

    it.effect("webhooks add prints the secret once, refuses a private target unless allowed; list hides secrets; remove", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const refused = yield* pgfiber(schema, ["webhooks", "add", "http://127.0.0.1:9/hook", "--org", "acme"])
        expect(refused.code).toBe(2)
        expect(refused.stderr).toContain("loopback, private or link-local")
        const added = yield* pgfiber(schema, ["webhooks", "add", "http://127.0.0.1:9/hook", "--org", "acme", "--kind", "completed,dead", "--json"],
          { PGFIBER_WEBHOOK_ALLOW_PRIVATE: "true" })
        expect(added.code).toBe(0)
        const hook = JSON.parse(added.stdout)
        expect(hook).toMatchObject({ orgId: "acme", url: "http://127.0.0.1:9/hook", kinds: ["completed", "dead"], stages: null })
        expect(hook.secret).toMatch(/^whsec_/)
        const listed = yield* pgfiber(schema, ["webhooks", "list", "--org", "acme"])
        expect(listed.code).toBe(0)
        expect(listed.stdout).toContain("http://127.0.0.1:9/hook")
        expect(listed.stdout).not.toContain(hook.secret)
        expect((yield* pgfiber(schema, ["webhooks", "remove", hook.id])).code).toBe(0)
        expect((yield* pgfiber(schema, ["webhooks", "remove", hook.id])).code).toBe(3)
      }))
  })
})
