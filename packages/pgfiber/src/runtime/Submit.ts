/**
 * The one way an operator or an API client submits a job: the stage must be one this build knows (the payload
 * must decode with that stage's Schema and is stored as the Schema encodes it) or one a worker registered (the
 * payload must match its registered JSON Schema); the stage's defaults apply.
 * Shared by `POST /jobs` and `pgfiber enqueue`, so both refuse exactly the same input with the same message,
 * except that a tenant (`caller: "tenant"`) sees only `public` stages: an internal one is refused exactly as an
 * unknown one, and the refusal lists public names only. An operator may submit any stage.
 */
import { Context, Duration, Effect, ParseResult, Schema } from "effect"
import * as Queue from "../queue/Queue.js"
import * as Stage from "./Stage.js"
import * as StageRegistry from "./StageRegistry.js"

/** The stages this process can enqueue to (and, for a worker, run). */
export class KnownStages extends Context.Tag("pgfiber/KnownStages")<KnownStages, ReadonlyArray<Stage.Any>>() {}

export interface SubmitRequest {
  readonly stage: string
  readonly payload?: unknown
  readonly orgId?: string | null | undefined
  readonly subjectId?: string | undefined
  readonly priority?: Queue.Priority | undefined
  readonly delay?: Duration.DurationInput | undefined
  readonly runAt?: Date | undefined
  readonly maxAttempts?: number | undefined
  readonly dedupeKey?: string | undefined
  readonly dedupeMode?: Queue.DedupeMode | undefined
  /** This job's timeout, overriding its stage's. */
  readonly timeout?: Duration.DurationInput | undefined
  /** Jobs this one waits for (of the same org: another org's is "not found"). */
  readonly dependsOn?: Queue.NewJob["dependsOn"]
  readonly uniqueFor?: Duration.DurationInput | undefined
  /** `tenant` (the HTTP API) may submit public stages only; `operator` (the CLI, the default) any stage. */
  readonly caller?: "tenant" | "operator" | undefined
}

const invalid = (field: string, message: string) => new Queue.InvalidJob({ field, message })

/** The request's job options that were given (the stage's defaults stand for the rest). */
const optionsOf = (request: SubmitRequest): Stage.EnqueueOptions =>
  Object.fromEntries(
    Object.entries({
      orgId: request.orgId,
      subjectId: request.subjectId,
      priority: request.priority,
      delay: request.delay,
      runAt: request.runAt,
      maxAttempts: request.maxAttempts,
      dedupeKey: request.dedupeKey,
      dedupeMode: request.dedupeMode,
      timeout: request.timeout,
      dependsOn: request.dependsOn,
      uniqueFor: request.uniqueFor
    }).filter(([, v]) => v !== undefined)
  )

/** The NewJob for a request, or the reason it is refused (nothing is written either way). */
export const prepare = (stages: ReadonlyArray<Stage.Any>, request: SubmitRequest): Effect.Effect<Queue.NewJob, Queue.InvalidJob> =>
  Effect.gen(function*() {
    const visible = request.caller === "tenant" ? stages.filter((s) => s.visibility === "public") : stages
    const stage = visible.find((s) => s.name === request.stage)
    if (stage === undefined) {
      const known = visible.map((s) => s.name).sort().join(", ") || "(none)"
      return yield* invalid("stage", `unknown stage ${JSON.stringify(request.stage)}; known: ${known}`)
    }
    const decoded = yield* Schema.decodeUnknown(stage.payload)(request.payload ?? {}).pipe(
      Effect.mapError((e) =>
        invalid("payload", `payload does not match the ${stage.name} schema: ${ParseResult.TreeFormatter.formatErrorSync(e)}`)
      )
    )
    return yield* Stage.job(stage, decoded, optionsOf(request))
  })

/**
 * `prepare` for any stage an operator surface can reach: a compiled one as `prepare` does it; else one in the
 * stage registry (a user's worker runs it), its payload checked against the registered JSON Schema (the
 * refusal names the field) and its registered defaults applied. A tenant reaches public stages only, and an
 * unknown or internal stage is refused alike, listing public names only.
 */
export const prepareAny = (stages: ReadonlyArray<Stage.Any>, request: SubmitRequest) =>
  Effect.gen(function*() {
    const caller = request.caller ?? "operator"
    if (stages.some((s) => s.name === request.stage && (caller === "operator" || s.visibility === "public"))) {
      return yield* prepare(stages, request)
    }
    const known = yield* StageRegistry.operable(stages, caller)
    const registered = known.find((s) => s.name === request.stage)?.registered
    if (registered === undefined) return yield* invalid("stage", StageRegistry.unknownMessage(request.stage, known))
    const payload = request.payload ?? {}
    yield* StageRegistry.checkPayload(registered, payload)
    const job: Queue.NewJob = {
      maxAttempts: registered.maxAttempts,
      priority: registered.priority,
      ...optionsOf(request),
      stage: registered.name,
      payload
    }
    return job
  })

/** Validates and enqueues (joining the caller's transaction, e.g. a `Tenancy` transaction); any compiled or registered stage. */
export const submit = (stages: ReadonlyArray<Stage.Any>, request: SubmitRequest) =>
  Effect.gen(function*() {
    const job = yield* prepareAny(stages, request)
    return yield* Queue.enqueueOne(job)
  }).pipe(Effect.withSpan("Submit.submit", { attributes: { stage: request.stage } }))
