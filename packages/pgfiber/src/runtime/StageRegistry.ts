/**
 * The stage registry as the runtime and the operator surfaces use it (the table is `Queue.Registry`):
 * - `entry`: what a worker records of a stage it runs, with the payload's JSON Schema derived from its Schema;
 * - `operable`: the stages an operator (or a tenant) can act on, the ones compiled into this build and the ones
 *   any worker registered, each once, with whether a live process runs it;
 * - `checkPayload`: a payload for a stage this build does not compile, checked against its registered JSON
 *   Schema, the refusal naming the field.
 * The CLI, the HTTP API and the dashboard all call these, so they agree on which stages exist.
 */
import { Duration, Effect, JSONSchema } from "effect"
import * as Queue from "../queue/Queue.js"
import * as Stage from "./Stage.js"

/** What a worker records of a stage it runs (`concurrency`: this process's, after configuration). */
export const entry = (stage: Stage.Any, concurrency: number): Queue.Registry.StageEntry => ({
  name: stage.name,
  visibility: stage.visibility,
  concurrency,
  limits: stage.shares,
  retainMs: stage.retain === undefined ? null : Math.max(0, Duration.toMillis(stage.retain)),
  maxAttempts: stage.maxAttempts,
  priority: typeof stage.priority === "number" ? stage.priority : Queue.namedPriorities[stage.priority],
  payloadSchema: payloadJsonSchema(stage)
})

/**
 * The JSON Schema of what a job's payload is stored as (the Schema's encoded side), or null when the Schema
 * has no JSON Schema form (a declaration without one): operators' payloads for it are then any JSON object.
 */
export const payloadJsonSchema = (stage: Stage.Any): unknown => {
  try {
    return JSONSchema.make(stage.payload)
  } catch {
    return null
  }
}

/** A stage an operator surface can act on. */
export interface Operable {
  readonly name: string
  readonly visibility: Stage.Visibility
  /** Compiled into this build: its Schema decodes payloads. */
  readonly compiled: Stage.Any | undefined
  /** As workers registered it; undefined for a compiled stage no worker has run yet. */
  readonly registered: Queue.Registry.RegisteredStage | undefined
  /** A process that runs it was seen lately (null: the registry does not know it). */
  readonly live: boolean | null
}

/**
 * Every stage compiled in or registered, by name; a tenant (`caller: "tenant"`) gets the public ones only. A
 * compiled stage's visibility is its code's; a registered one's, its latest process's.
 */
export const operable = (compiled: ReadonlyArray<Stage.Any>, caller: "tenant" | "operator" = "operator") =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue
    const registered = yield* queue.registry.list
    const byName = new Map<string, Operable>()
    for (const r of registered) {
      byName.set(r.name, { name: r.name, visibility: r.visibility, compiled: undefined, registered: r, live: Queue.Registry.isLive(r) })
    }
    for (const s of compiled) {
      const r = byName.get(s.name)?.registered
      byName.set(s.name, { name: s.name, visibility: s.visibility, compiled: s, registered: r, live: r === undefined ? null : Queue.Registry.isLive(r) })
    }
    return [...byName.values()]
      .filter((s) => caller === "operator" || s.visibility === "public")
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
  })

/**
 * The internal stages (compiled here, or registered by any worker) a tenant's bulk action leaves alone; the
 * compiled ones alone when the registry cannot be read.
 */
export const internalNames = (compiled: ReadonlyArray<Stage.Any>) =>
  operable(compiled, "operator").pipe(
    Effect.map((all) => all.filter((s) => s.visibility !== "public").map((s) => s.name)),
    Effect.orElseSucceed(() => compiled.filter((s) => s.visibility !== "public").map((s) => s.name))
  )

/** Each operable stage's limits in its code: a compiled stage's own, else as its worker registered them. */
export const limitStages = (compiled: ReadonlyArray<Stage.Any>) =>
  Effect.map(operable(compiled), (all) =>
    all.map((s) => ({ name: s.name, shares: s.compiled?.shares ?? s.registered!.limits })))

/** `unknown stage "x"; known: a, b` for a refusal. */
export const unknownMessage = (name: string, known: ReadonlyArray<Operable>) =>
  `unknown stage ${JSON.stringify(name)}; known: ${known.map((s) => s.name).join(", ") || "(none)"}`

type Validate = ((data: unknown) => boolean) & {
  errors?: Array<{ instancePath: string; keyword: string; message?: string; params: Record<string, unknown> }> | null
}

// compiled validators by schema text; ajv is loaded on the first payload checked this way, not with the package.
// Only the operator surfaces (the service's HTTP API, dashboard and CLI) submit jobs to stages they know from the
// registry alone, so ajv is a dependency of the service and an optional one of the core library: a program on the
// core that calls `Submit.prepareAny` installs it itself, and is told so.
const ajvPackage = "ajv"
const validators = new Map<string, Validate>()
let ajv: Promise<{ compile: (schema: object) => Validate }> | undefined
const loadAjv = () =>
  (ajv ??= import("ajv").then((m) => {
    // ajv is CommonJS: under Node's ESM its class is module.exports.default, a level its types do not show
    const outer: unknown = m.default
    const Ajv = (typeof outer === "function" && "default" in outer ? outer.default : undefined) ?? m.default
    // formats ("uuid") are not checked: the Schema's own pattern beside them is
    return new (Ajv as new (o: object) => { compile: (schema: object) => Validate })({ strict: false, allErrors: false, validateFormats: false })
  }))

/** The failing field as a path from the payload: `payload.customer`, `payload.items[2].sku`. */
const fieldPath = (instancePath: string, params: Record<string, unknown>) => {
  const parts = instancePath.split("/").slice(1).map((p) => p.replaceAll("~1", "/").replaceAll("~0", "~"))
  if (typeof params.missingProperty === "string") parts.push(params.missingProperty)
  if (typeof params.additionalProperty === "string") parts.push(params.additionalProperty)
  return parts.reduce((path, p) => (/^\d+$/.test(p) ? `${path}[${p}]` : `${path}.${p}`), "payload")
}

/**
 * Checks a payload against a registered stage's JSON Schema; the refusal names the field. A stage registered
 * without one takes any JSON object.
 */
export const checkPayload = (stage: Queue.Registry.RegisteredStage, payload: unknown) =>
  Effect.gen(function*() {
    const schema = stage.payloadSchema
    if (schema === null || typeof schema !== "object") {
      if (payload !== null && typeof payload === "object" && !Array.isArray(payload)) return
      return yield* new Queue.InvalidJob({ field: "payload", message: `payload must be a JSON object` })
    }
    const text = JSON.stringify(schema)
    let validate = validators.get(text)
    if (validate === undefined) {
      const compiler = yield* Effect.tryPromise(loadAjv).pipe(
        Effect.orDieWith((cause) =>
          new Error(`checking a payload against a registered JSON Schema needs the ${ajvPackage} package: npm install ${ajvPackage}`, { cause })
        )
      )
      const compiled = yield* Effect.try(() => compiler.compile(schema as object)).pipe(Effect.option)
      if (compiled._tag === "None") {
        yield* Effect.logWarning(`the registered JSON Schema of ${stage.name} does not compile; its payloads are taken unchecked`)
        return
      }
      validate = compiled.value
      if (validators.size > 500) validators.clear()
      validators.set(text, validate)
    }
    if (validate(payload)) return
    const e = validate.errors?.[0]
    const field = e ? fieldPath(e.instancePath, e.params) : "payload"
    const problem = e?.keyword === "required" ? "is required" : e?.keyword === "additionalProperties" ? "is not allowed" : e?.message ?? "is invalid"
    return yield* new Queue.InvalidJob({ field, message: `payload does not match the ${stage.name} schema: ${field} ${problem}` })
  })
