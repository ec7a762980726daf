/**
 * Schedules across processes, on real Postgres: three worker processes each declare the same every-second
 * schedule and run the Scheduler; for more than 20 s, with one of them SIGKILLed and later every one of them
 * stopped and restarted (the schedule backfills what the outage missed), each tick makes exactly one job:
 * no gap, no double. Every job the trigger below saw is counted, not only those that ran.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { waitFor } from "../support/waitFor.js"
import { fixture, freshSchema as freshSchemaWith, spawnWorkerProcess } from "../support/workerProcess.js"

/** A migrated schema with the tables below, dropped at the end of the test. */
const freshSchema = freshSchemaWith("sched", `
    create table tick_runs (job_id bigint, worker_id text, dedupe_key text, at timestamptz default clock_timestamp());
    -- every job written, whoever wrote it: a double would show here even if it never ran
    create table job_log (job_id bigint, stage text, dedupe_key text, at timestamptz default clock_timestamp());
    create function log_job() returns trigger language plpgsql as $$
    begin
      insert into job_log (job_id, stage, dedupe_key) values (new.id, new.stage, new.dedupe_key);
      return null;
    end $$;
    create trigger log_job after insert on jobs for each row execute function log_job();
  `)

const spawnWorker = (schema: string, workerId: string) =>
  spawnWorkerProcess(fixture("scheduleWorker.ts"), { PGFIBER_SCHEMA: schema, WORKER_ID: workerId, LOG_LEVEL: "warn" })

/** The tick a job's key names: `schedule:<org>:<name>:<ISO instant>`. */
const tickOf = (key: string) => new Date(/:(\d{4}-\d\d-\d\dT[\d:.]+Z)$/.exec(key)![1]!).getTime()

describe("schedules across worker processes", () => {
  it.live("three workers, a schedule every second for 20 s, a SIGKILL and a full restart: exactly one job per tick", () =>
    Effect.gen(function*() {
      const { schema, sql } = yield* freshSchema
      const logged = Effect.promise(() => sql<Array<{ job_id: string; dedupe_key: string }>>`
        select job_id, dedupe_key from job_log where stage = 'tick' order by job_id`)
      const workers = [yield* spawnWorker(schema, "a"), yield* spawnWorker(schema, "b"), yield* spawnWorker(schema, "c")]
      const dump = () => Effect.sync(() => workers.forEach((w, i) => console.log(`worker ${i}:\n${w.output()}`)))
      const first = yield* waitFor("the first tick's job", Effect.map(logged, (rows) => rows[0])).pipe(Effect.tapDefect(dump))
      const startTick = tickOf(first.dedupe_key)
      const ticksSoFar = Effect.map(logged, (rows) => rows.length)

      // phase 1: three workers for about 6 ticks; then one is SIGKILLed
      yield* waitFor("6 ticks", Effect.map(ticksSoFar, (n) => n >= 6))
      workers[1]!.child.kill("SIGKILL")
      yield* Effect.promise(() => workers[1]!.exited)
      // phase 2: two workers carry on
      const afterKill = yield* ticksSoFar
      yield* waitFor("6 more ticks after the SIGKILL", Effect.map(ticksSoFar, (n) => n >= afterKill + 6))
      // phase 3: every worker stops; ticks are missed for a few seconds; all three start again and backfill
      workers[0]!.child.kill("SIGTERM")
      workers[2]!.child.kill("SIGTERM")
      const codes = yield* Effect.promise(() => Promise.all([workers[0]!.exited, workers[2]!.exited]))
      expect(codes).toEqual([0, 0])
      const stoppedAt = yield* ticksSoFar
      yield* Effect.sleep("4 seconds") // the outage the restart must make up for
      expect(yield* ticksSoFar).toBe(stoppedAt)
      workers.push(yield* spawnWorker(schema, "a2"), yield* spawnWorker(schema, "b2"), yield* spawnWorker(schema, "c2"))
      const restarted = workers.slice(3)
      // phase 4: until the schedule has covered more than 20 s since its first tick
      yield* waitFor("20 s of ticks", Effect.map(logged, (rows) => rows.some((r) => tickOf(r.dedupe_key) >= startTick + 21_000)))
        .pipe(Effect.tapDefect(dump))
      // each job written so far runs (one the SIGKILLed worker held is run by another once its lease expires)
      const written = yield* logged
      yield* waitFor("every tick's job to run", Effect.promise(async () => {
        const ran = await sql<Array<{ job_id: string }>>`select distinct job_id::text from tick_runs`
        const ids = new Set(ran.map((r) => r.job_id))
        return written.every((r) => ids.has(String(r.job_id))) || undefined
      })).pipe(Effect.tapDefect(dump))
      yield* Effect.forEach(restarted, (w) => Effect.sync(() => w.child.kill("SIGTERM")), { discard: true })
      yield* Effect.forEach(restarted, (w) => Effect.promise(() => w.exited), { discard: true })

      const rows = yield* logged
      const ticks = rows.map((r) => tickOf(r.dedupe_key))
      const last = Math.max(...ticks)
      const expected = Array.from({ length: (last - startTick) / 1000 + 1 }, (_, i) => startTick + i * 1000)
      console.log(`${rows.length} jobs for ${expected.length} ticks (${new Date(startTick).toISOString()} … ${new Date(last).toISOString()})`)
      // no double: one job per tick; no gap: every second from the first tick to the last has its job
      expect(new Set(ticks).size).toBe(ticks.length)
      expect([...ticks].sort((x, y) => x - y)).toEqual(expected)
      expect(expected.length).toBeGreaterThanOrEqual(21)
    }).pipe(Effect.scoped), 180_000)
})
