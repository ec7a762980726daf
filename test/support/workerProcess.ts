/**
 * For the tests that run worker processes: spawn a fixture (test/fixtures/*.ts) as a real process, with its
 * output collected and a SIGKILL at the end of the test's scope if it is still alive; and a fresh, migrated
 * schema for them to share, dropped at the end.
 */
import { Effect, Layer, Redacted } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import { databaseUrl, dropSchema, freshSchemaName, rawSql } from "./pg.js"

export interface WorkerProcess {
  readonly child: ChildProcess
  /** Its exit code (null when a signal ended it). */
  readonly exited: Promise<number | null>
  /** Its stdout and stderr so far. */
  readonly output: () => string
}

/** The path of a fixture: `fixture("recordingWorker.ts")`. */
export const fixture = (file: string) => Path.resolve(import.meta.dirname, "../fixtures", file)

/**
 * Spawns `fixturePath` under tsx with DATABASE_URL set and `env` over the test's own environment; SIGKILLed at
 * the end of the scope if still alive.
 */
export const spawnWorkerProcess = (fixturePath: string, env: Record<string, string>) =>
  Effect.acquireRelease(
    Effect.sync((): WorkerProcess => {
      const child = spawn(process.execPath, ["--import", "tsx", fixturePath], {
        env: { ...process.env, DATABASE_URL: databaseUrl(), ...env },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let output = ""
      child.stdout!.on("data", (d) => (output += d))
      child.stderr!.on("data", (d) => (output += d))
      const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
      return { child, exited, output: () => output }
    }),
    ({ child }) => Effect.sync(() => child.exitCode === null && child.signalCode === null && child.kill("SIGKILL"))
  )

/**
 * A migrated schema named after `prefix`, with `setup` (DDL: the tables a fixture records into) run in it, and a
 * plain client on it; both dropped at the end of the scope.
 */
export const freshSchema = (prefix: string, setup: string) =>
  Effect.gen(function*() {
    const schema = freshSchemaName(prefix)
    yield* Effect.addFinalizer(() => dropSchema(schema))
    yield* Migrations.migrate().pipe(
      Effect.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 }))),
      Effect.orDie
    )
    const sql = rawSql(schema)
    yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
    yield* Effect.promise(() => sql.unsafe(setup))
    return { schema, sql }
  })
