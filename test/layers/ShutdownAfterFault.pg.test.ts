/**
 * A shutdown finishes after a database fault. Two real worker processes (test/fixtures/recordingWorker.ts) run
 * under steady single-job enqueues on a PostgreSQL of this file's own, which then suffers the fault: every backend
 * of the workers terminated, round after round (the chaos harness's "backend kills"), or a restart of the server.
 * Once completions resume, SIGTERM: the first worker, with no handler running, exits 0 within a few seconds; the
 * second, holding a handler that would run for minutes, exits 0 within its grace and releases that job. Nothing is
 * lost: every acknowledged job completed, none is left running, the long one is queued again with no attempt spent.
 * A third test sends SIGTERM while the server is down: the process exits soon after its grace all the same.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Redacted, Schedule } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import postgres from "postgres"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as EmbeddedPg from "../../packages/pgfiber/src/layers/EmbeddedPg.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import { waitFor } from "../support/waitFor.js"
import { fixture, spawnWorkerProcess, type WorkerProcess } from "../support/workerProcess.js"

/**
 * With no handler running, what SIGTERM to exit may take: at most about a second (`Db.closeWithin`, when statements
 * given up on are still out), 2 s asked for, 4 s for a loaded machine. Waiting out porsager's own 5 s `end` timeout
 * for what the fault left behind would take 5 s per pool.
 */
const idleExitWithin = Duration.seconds(4)
/** The busy worker's grace: it exits once the grace is over and the interrupted job released (plus the same margin). */
const grace = Duration.seconds(6)

type Fault = "backend kills" | "restart"

const sigterm = (worker: WorkerProcess) =>
  Effect.gen(function*() {
    const sentAt = Date.now()
    worker.child.kill("SIGTERM")
    // measured, not cut short: a worker that never exits is SIGKILLed by the scope after this
    const code = yield* Effect.promise(() => worker.exited).pipe(Effect.timeout(Duration.minutes(1)), Effect.option)
    return { code: code._tag === "Some" ? code.value : "still running after 60 s", ms: Date.now() - sentAt }
  })

/**
 * A PostgreSQL of the test's own with a migrated schema and an `executions` table; the producer's queue, a plain
 * client that rides out the restart, and `spawn` for a recording worker on it with the test's grace.
 */
const cluster = (schema: string) =>
  Effect.gen(function*() {
    const dataDir = Path.join(Os.tmpdir(), `pgfiber-${schema}-${process.pid}-${Date.now().toString(36)}`)
    yield* Effect.addFinalizer(() => Effect.sync(() => Fs.rmSync(dataDir, { recursive: true, force: true })))
    const server = yield* EmbeddedPg.start({ dataDir, port: 0 })
    const url = Redacted.value(server.url)
    const db = yield* Db.make({ url: server.url, schema, poolMax: 2, applicationName: `${schema}-producer` })
    yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
    yield* db.run((sql) => sql`create table executions (job_id bigint, worker_id text, attempt int, at timestamptz default clock_timestamp())`)
    const queue = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))
    const sql = postgres(url, { max: 2, onnotice: () => undefined, connection: { search_path: schema } })
    yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
    const count = (query: () => PromiseLike<ReadonlyArray<{ n: number }>>) =>
      Effect.tryPromise(query).pipe(Effect.map((r) => r[0]!.n), Effect.retry({ times: 100, schedule: Schedule.spaced("200 millis") }), Effect.orDie)
    const spawn = (workerId: string) =>
      spawnWorkerProcess(fixture("recordingWorker.ts"), {
        DATABASE_URL: url,
        PGFIBER_SCHEMA: schema,
        WORKER_ID: workerId,
        SHUTDOWN_GRACE_MS: String(Duration.toMillis(grace)),
        LOG_LEVEL: "info"
      })
    return { server, queue, sql, count, spawn }
  })

const scenario = (fault: Fault) =>
  Effect.gen(function*() {
    const { server, queue, sql, count, spawn } = yield* cluster("sdf")
    // the workers' connections are `pgfiber-test-<WORKER_ID>` (test/fixtures/runWorker.ts)
    const app = `sdf${process.pid}`
    const workers = yield* Effect.forEach(["idle", "busy"], (name) => spawn(`${app}-${name}`))
    const [idle, busy] = workers as [WorkerProcess, WorkerProcess]
    const outputs = () => `idle worker:\n${idle.output().slice(-8000)}\nbusy worker:\n${busy.output().slice(-8000)}`

    const acknowledged: Array<string> = []
    let stop = false
    const producer = yield* Effect.fork(Effect.gen(function*() {
      while (!stop) {
        const result = yield* Effect.exit(queue.enqueue([{ stage: "record", payload: { sleepMs: 0 }, maxAttempts: 1000 }]))
        if (Exit.isSuccess(result)) acknowledged.push(...result.value.map((r) => String(r.id)))
        yield* Effect.sleep("5 millis")
      }
    }))
    const executions = count(() => sql`select count(*)::int as n from executions`)
    const byBoth = count(() => sql`select count(distinct worker_id)::int as n from executions`)
    yield* waitFor("both workers to run jobs", Effect.map(byBoth, (n) => n === 2))

    if (fault === "backend kills") {
      // round after round, every backend of both workers (their pools and LISTEN connections)
      let terminated = 0
      for (let round = 0; round < 12; round++) {
        const rows = yield* Effect.promise(() =>
          sql<Array<{ ok: boolean }>>`select pg_terminate_backend(pid) as ok from pg_stat_activity where application_name like ${`pgfiber-test-${app}-%`}`
        )
        terminated += rows.filter((r) => r.ok).length
        yield* Effect.sleep("500 millis")
      }
      expect(terminated, "the kills reached the workers' backends").toBeGreaterThan(0)
    } else {
      yield* server.stop
      yield* Effect.sleep("2 seconds") // the outage
      yield* server.start
    }
    // recovery: completions resume in both workers
    const from = yield* executions
    yield* waitFor("completions to resume after the fault", Effect.map(executions, (n) => n >= from + 200), Duration.minutes(3))
    stop = true
    yield* producer.await
    yield* waitFor("the queue to drain", Effect.map(count(() => sql`select count(*)::int as n from jobs`), (n) => n === 0), Duration.minutes(3))

    // no handler running: SIGTERM ends the process at once
    const idleExit = yield* sigterm(idle)

    // a handler that would run for ten minutes: SIGTERM interrupts it at the end of the grace and releases its job
    const [long] = yield* queue.enqueue([{ stage: "record", payload: { sleepMs: 600_000 }, maxAttempts: 5 }]).pipe(Effect.orDie)
    yield* waitFor("the long job to start", Effect.map(count(() => sql`select count(*)::int as n from executions where job_id = ${long!.id}`), (n) => n === 1))
    const busyExit = yield* sigterm(busy)

    const shutdownLines = (w: WorkerProcess) => w.output().split("\n").filter((l) => /grace period|closing |not written|claim still/.test(l))
    console.log([...shutdownLines(idle), ...shutdownLines(busy)].join("\n"))
    console.log(`shutdown after ${fault}: idle worker exited ${idleExit.code} after ${idleExit.ms} ms; busy worker (grace ${Duration.format(grace)}) exited ${busyExit.code} after ${busyExit.ms} ms`)
    expect(idleExit.code, outputs()).toBe(0)
    expect(idleExit.ms, outputs()).toBeLessThan(Duration.toMillis(idleExitWithin))
    expect(busyExit.code, outputs()).toBe(0)
    expect(busyExit.ms, outputs()).toBeLessThan(Duration.toMillis(Duration.sum(grace, idleExitWithin)))
    // what the grace cut short is named in the log
    expect(busy.output()).toMatch(new RegExp(`grace period over: interrupting 1 job\\(s\\) and releasing them: ${long!.id} \\(running`))

    // nothing lost: every acknowledged job completed exactly once, the long one is back in the queue unspent
    const completed = yield* count(() => sql`select count(*)::int as n from jobs_archive where id = any(${acknowledged}::bigint[]) and status = 'completed'`)
    expect(completed).toBe(acknowledged.length)
    // unspent by the shutdown: the attempts it had when its last run started (a run before it may have failed on a
    // connection the fault left broken, porsager 3.4.9, and spent one; that is the handler's failure, not shutdown's)
    const [run] = yield* Effect.promise(() => sql<Array<{ attempt: number }>>`select max(attempt)::int as attempt from executions where job_id = ${long!.id}`)
    const [left] = yield* Effect.promise(() => sql<Array<{ status: string; attempts: number }>>`select status, attempts from jobs where id = ${long!.id}`)
    expect(left).toEqual({ status: "queued", attempts: run!.attempt - 1 })
    expect(yield* count(() => sql`select count(*)::int as n from jobs where status = 'running'`)).toBe(0)
  }).pipe(Effect.scoped)

/**
 * SIGTERM while the server is down, with a handler running: the pool stops retrying its claim, interrupts the
 * handler at the end of the grace, gives up on writing the release (the database cannot take it) and says so, and the
 * process exits 0 soon after the grace. Once the server is back, a fresh worker finds every job: the released one's
 * lease expires and it runs again.
 */
const duringOutage = Effect.gen(function*() {
  const { server, queue, sql, count, spawn } = yield* cluster("sdo")
  const worker = yield* spawn("sdo-first")
  const quick = yield* queue.enqueue(Array.from({ length: 50 }, () => ({ stage: "record", payload: { sleepMs: 0 }, maxAttempts: 100 }))).pipe(Effect.orDie)
  // ten minutes on its first attempt only, so the run after the outage finishes at once
  const [long] = yield* queue.enqueue([{ stage: "record", payload: { sleepMs: 600_000, sleepOnAttempts: [1] }, maxAttempts: 100 }]).pipe(Effect.orDie)
  yield* waitFor("the long job to start", Effect.map(count(() => sql`select count(*)::int as n from executions where job_id = ${long!.id}`), (n) => n === 1))

  yield* server.stop
  yield* waitFor("the worker to see the database gone", Effect.sync(() => /LISTEN down/.test(worker.output())))
  const exit = yield* sigterm(worker)
  const lines = worker.output().split("\n").filter((l) => /grace period|closing |not written|claim still/.test(l))
  console.log(`${lines.join("\n")}\nshutdown while PostgreSQL is down: exited ${exit.code} after ${exit.ms} ms (grace ${Duration.format(grace)})`)
  expect(exit.code, worker.output().slice(-8000)).toBe(0)
  // the grace, the last try at writing the release, the connections' close, and a margin for a loaded machine
  expect(exit.ms, worker.output().slice(-8000)).toBeLessThan(Duration.toMillis(Duration.sum(grace, Duration.seconds(8))))
  expect(worker.output()).toMatch(/grace period over: interrupting 1 job\(s\) and releasing them/)
  expect(worker.output()).toMatch(/outcome\(s\) not written/)

  // nothing lost: once the server is back, a fresh worker runs every job to completion
  yield* server.start
  yield* spawn("sdo-second")
  const all = [...quick.map((r) => String(r.id)), String(long!.id)]
  yield* waitFor(
    "every job to complete after the outage",
    Effect.map(count(() => sql`select count(*)::int as n from jobs_archive where id = any(${all}::bigint[]) and status = 'completed'`), (n) => n === all.length),
    Duration.minutes(3)
  )
  expect(yield* count(() => sql`select count(*)::int as n from jobs`)).toBe(0)
}).pipe(Effect.scoped)

describe("shutdown after a database fault", () => {
  it.live("after every backend of the workers is killed, round after round: SIGTERM exits 0 at once when idle, within the grace when busy; nothing lost", () =>
    scenario("backend kills"), 600_000)

  it.live("after a PostgreSQL restart: SIGTERM exits 0 at once when idle, within the grace when busy; nothing lost", () =>
    scenario("restart"), 600_000)

  it.live("while PostgreSQL is down, a handler running: SIGTERM exits 0 soon after the grace and says what it could not write; nothing lost", () =>
    duringOutage, 600_000)
})
