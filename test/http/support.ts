/**
 * Shared pieces for the service tests: a tiny test stage, a real HTTP server on a free loopback port over a
 * fresh schema, a fetch helper that speaks the API the way a client would, and the real CLI as a child process.
 */
import { HttpServer } from "@effect/platform"
import { Context, Duration, Effect, Inspectable, Layer, Redacted, Schema } from "effect"
import { Permanent } from "../../packages/pgfiber/src/JobError.js"
import { spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as Storage from "../../packages/media/src/layers/Storage.js"
import { makeCallStages } from "../../packages/media/src/stages/calls/index.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as PgSchedules from "../../packages/pgfiber/src/queue/PgSchedules.js"
import * as Scheduler from "../../packages/pgfiber/src/runtime/Scheduler.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import * as Server from "../../packages/service/src/http/Server.js"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Submit from "../../packages/pgfiber/src/runtime/Submit.js"
import { databaseUrl, freshSchemaName, layerDb, rawSql } from "../support/pg.js"
import { deadline, waitFor } from "../support/waitFor.js"

/** `echo`: succeeds, or dead-letters when asked (`fail: true`). */
export const echo = Stage.make({
  name: "echo",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number, fail: Schema.optional(Schema.Boolean) }),
  concurrency: 4,
  handler: ({ fail, n }) => (fail ? new Permanent({ message: `echo ${n} asked to fail` }) : Effect.void)
})

/** `manual`: known to the API but run by no worker, so only a tick runs it. */
export const manual = Stage.make({
  name: "manual",
  visibility: "public",
  payload: Schema.Struct({ n: Schema.Number }),
  handler: () => Effect.void
})

export const workerOptions: Worker.WorkerOptions = {
  workerId: "http-test",
  shutdownGrace: Duration.seconds(2),
  sweepInterval: Duration.seconds(30),
  pollInterval: Duration.seconds(1),
  concurrency: {}
}

/** Filesystem storage in a fresh temporary folder, removed with the layer. */
export const layerTempStorage = (prefix: string) =>
  Layer.unwrapScoped(
    Effect.acquireRelease(
      Effect.sync(() => Fs.mkdtempSync(Path.join(Os.tmpdir(), prefix))),
      (dir) => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true }))
    ).pipe(Effect.map((dir) => Storage.layerFs(dir).pipe(Layer.orDie)))
  )

/** Server + worker (echo only) + queue + keys + fs storage over the given Db layer; the call stages are known, not run. */
export const layerService = <E>(
  dbLayer: Layer.Layer<Db.Db, E>,
  /** More stages for the worker to run besides echo (they are known to the API too). */
  options: { readonly workerStages?: ReadonlyArray<Stage.Stage<any, any, Db.Db, any>> } = {}
) => {
  const extra = options.workerStages ?? []
  const stages = [echo, manual, ...makeCallStages(), ...extra]
  const storage = layerTempStorage("pgfiber-http-storage-")
  return Server.layer({
    host: "127.0.0.1",
    port: 0,
    admin: { host: "127.0.0.1", port: 0 },
    maxBodyBytes: 64 * 1024,
    maxUploadBytes: 256 * 1024,
    devTick: true,
    workerId: "http-test"
  }).pipe(
    Layer.provideMerge(storage),
    // the worker runs the Scheduler too, as `pgfiber start` does
    Layer.provideMerge(Scheduler.layer().pipe(Layer.provide(PgSchedules.layer), Layer.provideMerge(Worker.layer([echo, ...extra], workerOptions)))),
    Layer.provideMerge(Layer.succeed(Submit.KnownStages, stages)),
    Layer.provideMerge(ApiKeys.layer),
    Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name) })),
    Layer.provideMerge(dbLayer)
  )
}

/** An API key made as `pgfiber keys create` would, through the service's ApiKeys: its token. */
export const newKey = (create: ApiKeys.CreateOptions) =>
  Effect.flatMap(ApiKeys.ApiKeys, (keys) => keys.create(create)).pipe(Effect.map((k) => Redacted.value(k.token)))

/**
 * The service as the HTTP and dashboard tests run it: a fresh, migrated schema of its own (dropped with the scope)
 * and a Db on it; `key` makes an API key there as `pgfiber keys create` would, and gives its token; `start` brings
 * the service (`layerService`, with `workerStages` if given) up on that Db in the current scope and gives its base
 * URL. A second `start` on the same fixture is a restart on the same data.
 */
export const freshService = (prefix: string, options: { readonly onStatement?: (query: string) => void } = {}) =>
  Effect.gen(function*() {
    const schema = freshSchemaName(prefix)
    const db = Context.get(yield* Layer.build(layerDb({ schema, poolMax: 6, ...options })), Db.Db)
    const keys = yield* Effect.provideService(ApiKeys.make, Db.Db, db)
    const key = (create: ApiKeys.CreateOptions) => Effect.provideService(newKey(create), ApiKeys.ApiKeys, keys)
    const start = (service: Parameters<typeof layerService>[1] = {}) =>
      Effect.flatMap(Layer.build(layerService(Layer.succeed(Db.Db, db), service)), (context) => Effect.provide(baseUrl, context))
    return { schema, db, key, start }
  })

export const baseUrl = Effect.map(HttpServer.HttpServer, (server) => {
  const address = server.address
  if (address._tag !== "TcpAddress") throw new Error("expected a TCP address")
  return `http://127.0.0.1:${address.port}`
})

/** The admin listener (`/readyz`, `/metrics`, `/docs`, `/openapi.json`). */
export const adminUrl = Effect.map(Server.AdminServer, (server) => {
  const address = server.address
  if (address._tag !== "TcpAddress") throw new Error("expected a TCP address")
  return `http://127.0.0.1:${address.port}`
})

export interface Reply {
  readonly status: number
  readonly text: string
  readonly json: any
  readonly headers: Headers
}

export const call = (
  base: string,
  method: string,
  path: string,
  options: { readonly key?: string; readonly body?: unknown; readonly rawBody?: string | Uint8Array | ReadableStream<Uint8Array> | FormData; readonly headers?: Record<string, string> } = {}
) =>
  Effect.promise(async (): Promise<Reply> => {
    const headers: Record<string, string> = { ...options.headers }
    if (options.key !== undefined) headers.authorization = `Bearer ${options.key}`
    let body: string | Uint8Array | ReadableStream<Uint8Array> | FormData | undefined = options.rawBody
    if (options.body !== undefined) {
      body = JSON.stringify(options.body)
      headers["content-type"] = "application/json"
    }
    const init: RequestInit & { duplex?: string } = { method, headers, ...(body !== undefined ? { body } : {}) }
    if (typeof ReadableStream !== "undefined" && body instanceof ReadableStream) init.duplex = "half"
    const response = await fetch(`${base}${path}`, init)
    const text = await response.text()
    let json: unknown = undefined
    try {
      json = JSON.parse(text)
    } catch {
      // not JSON (metrics, docs)
    }
    return { status: response.status, text, json, headers: response.headers }
  })

/**
 * Runs `effect` until its value passes `check`: `waitFor` (real time: these tests talk to a real server), whose
 * message on a timeout shows the last value seen.
 */
export const eventually = <A, E, R>(effect: Effect.Effect<A, E, R>, check: (a: A) => boolean, timeout: Duration.DurationInput = deadline) => {
  let last = "nothing"
  return waitFor(
    "a value that passes the check",
    Effect.map(effect, (value) => {
      last = Inspectable.format(value)
      return check(value) && { value }
    }),
    timeout
  ).pipe(
    Effect.map(({ value }) => value),
    Effect.catchAllDefect((defect) => Effect.dieMessage(`${String(defect)}; last seen: ${last.slice(0, 2000)}`))
  )
}

/** Parses Prometheus text format 0.0.4 strictly enough to catch a malformed exposition. */
export const parsePrometheus = (text: string) => {
  const samples = new Map<string, number>()
  const types = new Map<string, string>()
  const sampleLine = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*)?\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$/
  if (!text.endsWith("\n")) throw new Error("exposition must end with a newline")
  for (const line of text.split("\n").slice(0, -1)) {
    if (line.startsWith("# HELP ")) continue
    if (line.startsWith("# TYPE ")) {
      const [, , name, type] = line.split(" ")
      if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(type!)) throw new Error(`bad TYPE line: ${line}`)
      if (types.has(name!)) throw new Error(`duplicate TYPE for ${name}`)
      types.set(name!, type!)
      continue
    }
    const match = sampleLine.exec(line)
    if (match === null) throw new Error(`not a sample line: ${JSON.stringify(line)}`)
    const value = match[3] === "+Inf" ? Infinity : match[3] === "-Inf" ? -Infinity : Number(match[3])
    if (Number.isNaN(value) && match[3] !== "NaN") throw new Error(`bad value in ${line}`)
    const family = match[1]!.replace(/_(bucket|sum|count)$/, "")
    if (!types.has(match[1]!) && !types.has(family)) throw new Error(`sample before its TYPE: ${line}`)
    samples.set(`${match[1]}${match[2] ?? ""}`, value)
  }
  return { samples, types }
}

// ---------------------------------------------------------------------------------------------
// the real binary

const repoRoot = Path.resolve(import.meta.dirname, "../..")

export interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/**
 * Runs `pgfiber args…` (the compiled CLI, dist/cli.js, what `npx pgfiber` and `npm run pgfiber` run; the test
 * setup rebuilds it) against the test database's `schema`, with JSON logs; resolves when it exits. The echo
 * stage is known without any variable.
 */
export const pgfiber = (schema: string, args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.promise(() =>
    new Promise<Run>((resolve, reject) => {
      const child = spawn(process.execPath, [Path.join(repoRoot, "dist", "cli.js"), ...args], {
        cwd: repoRoot,
        env: {
          PATH: process.env.PATH ?? "",
          HOME: process.env.HOME ?? "",
          DATABASE_URL: databaseUrl(),
          PGFIBER_SCHEMA: schema,
          LOG_FORMAT: "json",
          ...env
        },
        stdio: ["ignore", "pipe", "pipe"]
      })
      let stdout = ""
      let stderr = ""
      child.stdout.on("data", (d) => (stdout += d))
      child.stderr.on("data", (d) => (stderr += d))
      const timer = setTimeout(() => child.kill("SIGKILL"), 120_000)
      child.on("error", reject)
      child.on("close", (code) => {
        clearTimeout(timer)
        resolve({ code, stdout, stderr })
      })
    })
  )

/** JSON log lines out of a run's stderr. */
export const logLines = (run: Run): ReadonlyArray<any> =>
  run.stderr.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l))

/** A query as an operator would run it with psql, on the schema. */
export const query = <T>(schema: string, text: string) =>
  Effect.promise(async () => {
    const sql = rawSql(schema)
    try {
      return (await sql.unsafe(text)) as unknown as Array<T>
    } finally {
      await sql.end()
    }
  })
