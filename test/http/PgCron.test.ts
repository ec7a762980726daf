/**
 * deploy/pg_cron.sql's job bodies, run as pg_cron would run them (pg_cron itself is not in the embedded
 * server): the reaper requeues an expired lease (and notifies), even one with no attempt left (its stage's claim
 * dead-letters it), leaves a
 * live lease alone; the retention job deletes only old handled dead letters; the history job prunes finished
 * jobs past their retention.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import { layerDb } from "../support/pg.js"
import { query } from "./support.js"

const script = Fs.readFileSync(Path.resolve(import.meta.dirname, "../../deploy/pg_cron.sql"), "utf8")

/** The SQL between `$tag$ … $tag$` of a cron.schedule call, for the given schema. */
const jobBody = (tag: string, schema: string) => {
  const start = script.indexOf(`$${tag}$`) + tag.length + 2
  const body = script.slice(start, script.indexOf(`$${tag}$`, start))
  return body
    .replaceAll("pgfiber.reaper.pgfiber", `pgfiber.reaper.${schema}`)
    .replaceAll("'pgfiber_jobs'", `'${schema}_jobs'`)
    .replaceAll("pgfiber.", `${schema}.`)
}

describe("deploy/pg_cron.sql", () => {
  layer(layerDb(), { excludeTestServices: true })((it) => {
    it.effect("the reaper job requeues expired leases, exhausted ones too; retention purges old handled letters", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* query(schema, `
          insert into jobs (stage, status, attempts, max_attempts, locked_by, locked_until) values
            ('cron', 'running', 0, 5, 'w1', now() - interval '1 minute'),
            ('cron', 'running', 4, 5, 'w2', now() - interval '1 minute'),
            ('cron', 'running', 0, 5, 'w3', now() + interval '1 minute')`)
        yield* query(schema, jobBody("reap", schema))
        const jobs = yield* query<{ locked_by: string | null; status: string; attempts: number; last_error: string | null }>(
          schema,
          "select locked_by, status, attempts, last_error from jobs where stage = 'cron' order by id"
        )
        expect(jobs.map((j) => [j.status, j.attempts])).toEqual([["queued", 1], ["queued", 5], ["running", 0]])
        expect(jobs[0]!.last_error).toContain("lease expired: the worker w1")
        const logged = yield* query<{ kind: string; attempt: number }>(schema, "select kind, unnest(attempts) as attempt from job_events where stage = 'cron' and kind = 'retried' order by id")
        expect(logged.map((e) => [e.kind, e.attempt])).toEqual([["retried", 1], ["retried", 5]])
        expect(jobs[1]!.last_error).toContain("lease expired: the worker w2")
        expect(yield* query(schema, "select 1 from dead_letters where stage = 'cron'")).toEqual([])

        yield* query(schema, `
          insert into dead_letters (job_id, stage, payload, priority, attempts, max_attempts, reason, job_created_at, dead_at, resolution_status)
          values (1, 'cron', '{}', 50, 1, 1, 'old, handled', now(), now() - interval '40 days', 'resolved'),
                 (2, 'cron', '{}', 50, 1, 1, 'old, open', now(), now() - interval '40 days', null)`)
        yield* query(schema, jobBody("purge", schema))
        const left = yield* query<{ reason: string }>(schema, "select reason from dead_letters where stage = 'cron' order by id")
        expect(left.map((d) => d.reason)).toEqual(["old, open"])
      }))

    it.effect("the history retention job creates the partitions ahead, deletes finished jobs past their keep_until, in batches, and no others", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        // the newest partition gone (as if housekeeping had not run for a day): the job makes it again
        const [newest] = yield* query<{ name: string }>(schema, "select name from jobs_archive_partitions order by ends_at desc limit 1")
        yield* query(schema, `drop table ${newest!.name}`)
        yield* query(schema, `delete from jobs_archive_partitions where name = '${newest!.name}'`)
        yield* query(schema, `
          insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, keep_until)
          select 900000 + g, 'cron_hist', '{}', 50, 'completed', 0, 5, now(), now() - interval '1 minute'
          from generate_series(1, 12000) g`)
        yield* query(schema, `
          insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, keep_until)
          values (800001, 'cron_hist', '{}', 50, 'completed', 0, 5, now(), now() + interval '1 hour')`)
        // retentions shorter than the archive's daily partitions: deleted row by row (longer ones go with their partition)
        yield* query(schema, jobBody("prune", schema))
        const left = yield* query<{ id: string }>(schema, "select id::text from jobs_archive where stage = 'cron_hist'")
        expect(left.map((r) => r.id)).toEqual(["800001"])
        const [ahead] = yield* query<{ name: string; covers: boolean }>(schema, `
          select name, ends_at > now() + interval '2 days' as covers from jobs_archive_partitions order by ends_at desc limit 1`)
        expect(ahead).toEqual({ name: newest!.name, covers: true })
      }))

    it.effect("the events retention job deletes events older than a day from the front of the log, and no others", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        yield* query(schema, `
          insert into job_events (stage, job_ids, attempts, kind, at) values
            ('cron_events', '{1}', '{0}', 'enqueued', now() - interval '2 days'),
            ('cron_events', '{1}', '{1}', 'started', now() - interval '25 hours'),
            ('cron_events', '{1}', '{1}', 'completed', now() - interval '1 hour')`)
        yield* query(schema, jobBody("events", schema))
        const left = yield* query<{ kind: string }>(schema, "select kind from job_events where stage = 'cron_events' order by id")
        expect(left.map((e) => e.kind)).toEqual(["completed"])
      }))
  })
})
