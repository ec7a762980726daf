/**
 * A fleet for the tests: a migrated schema with an `executions` table, a real PgBouncer (transaction mode) in
 * front of the test database logging in as a role of its own, and worker processes (test/fixtures/fleetWorker.ts)
 * whose pools go through it while their LISTEN (and session) connections go to the database directly as another
 * role, so pg_stat_activity tells the two apart by user name.
 */
import { Effect, Layer, Redacted } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import { databaseUrl } from "./pg.js"
import { roleFor, startPgBouncer } from "./pgbouncer.js"
import { waitFor } from "./waitFor.js"
import { fixture, freshSchema, spawnWorkerProcess, type WorkerProcess } from "./workerProcess.js"

export interface FleetOptions {
  readonly prefix: string
  /** PgBouncer's server connections (default_pool_size = max_db_connections). */
  readonly poolSize: number
}

/** The schema, the two roles, PgBouncer, and a queue for producers that goes through PgBouncer too. */
export const fleetDatabase = (options: FleetOptions) =>
  Effect.gen(function*() {
    const { schema, sql } = yield* freshSchema(options.prefix, "create table executions (job_id text not null, worker_id text not null)")
    const pooled = yield* roleFor(schema, "b")
    const direct = yield* roleFor(schema, "l")
    const target = new URL(databaseUrl())
    const bouncer = yield* startPgBouncer(target, pooled.role, pooled.password, { poolSize: options.poolSize, maxClientConn: 500 })
    const viaBouncer = bouncer.url(pooled.role, pooled.password)
    const listenUrl = new URL(target)
    listenUrl.username = direct.role
    listenUrl.password = direct.password
    /** A producer's queue through PgBouncer (its connections are among the pool's server connections). */
    const producer = PgQueue.layer().pipe(
      Layer.provideMerge(Layer.scoped(
        Db.Db,
        Db.make({ url: Redacted.make(viaBouncer), listenUrl: Redacted.make(listenUrl.href), prepare: false, pooler: "transaction", schema, poolMax: 4 })
      ))
    )
    /** Server connections PgBouncer holds now: the backends of its login role. */
    const serverConnections = Effect.promise(() =>
      sql`select count(*)::int as n from pg_stat_activity where usename = ${pooled.role}`
    ).pipe(Effect.map((rows) => rows[0]!.n as number))
    /** The worker processes' direct connections now, and how many of them LISTEN (their last statement LISTEN or the wake-lead lock). */
    const directConnections = Effect.promise(() =>
      sql`select count(*)::int as n, count(*) filter (where query ilike 'listen%' or query like '%pg_try_advisory_lock%')::int as listening
          from pg_stat_activity where usename = ${direct.role}`
    ).pipe(Effect.map((rows) => ({ total: rows[0]!.n as number, listening: rows[0]!.listening as number })))

    const spawnWorkers = (count: number, env: Record<string, string> = {}) =>
      Effect.forEach(Array.from({ length: count }, (_, i) => i), (i) =>
        spawnWorkerProcess(fixture("fleetWorker.ts"), {
          DATABASE_URL: viaBouncer,
          DATABASE_LISTEN_URL: listenUrl.href,
          DB_PREPARE: "false",
          DB_POOLER: "transaction",
          PGFIBER_SCHEMA: schema,
          WORKER_ID: `fleet-${i}`,
          SHUTDOWN_GRACE_MS: "10000",
          LOG_LEVEL: "info",
          ...env
        }))

    /**
     * Waits until every process listens (its LISTEN is up, so it has registered its stage and claimed once). 20
     * processes starting under tsx on 2 cores at load 30 took over 3 minutes: the deadline is for a hang, not speed.
     */
    const awaitListening = (workers: ReadonlyArray<WorkerProcess>) =>
      waitFor(
        `${workers.length} LISTEN connections`,
        Effect.flatMap(directConnections, ({ listening }) =>
          Effect.sync(() => {
            const dead = workers.find((w) => w.child.exitCode !== null)
            if (dead) throw new Error(`a worker process exited at start:\n${dead.output()}`)
            return listening === workers.length
          })),
        "8 minutes",
        "250 millis"
      )

    return { schema, sql, bouncer, producer, serverConnections, directConnections, spawnWorkers, awaitListening, roles: { pooled: pooled.role, direct: direct.role } }
  })

/** The last claim count each fleet worker printed (`{"fleetClaims":N}`). */
export const claimsOf = (worker: WorkerProcess): number => {
  const matches = [...worker.output().matchAll(/\{"fleetClaims":(\d+)\}/g)]
  return matches.length === 0 ? 0 : Number(matches[matches.length - 1]![1])
}

/** Log lines at error level or above, and failed claims, in a worker's output. */
export const errorsOf = (worker: WorkerProcess): ReadonlyArray<string> =>
  worker.output().split("\n").filter((line) => /"logLevel":"(ERROR|FATAL)"|claim failed/.test(line))
