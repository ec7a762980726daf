/**
 * The jobs group: submit, read, list and cancel jobs; list, read, retry and resolve dead letters; the dev
 * tick. Every database call runs inside `Db.withOrg` for the key's org, so row-level security (not a WHERE
 * clause here) is what keeps orgs apart: another org's job is not found.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Config, Duration, Effect, Option, Predicate } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Bulk from "pgfiber/internal/queue/Bulk.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Reads from "pgfiber/internal/queue/Reads.js"
import type * as Stage from "pgfiber/internal/runtime/Stage.js"
import * as Worker from "pgfiber/internal/runtime/Worker.js"
import * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import * as Submit from "pgfiber/internal/runtime/Submit.js"
import * as Tick from "pgfiber/internal/runtime/Tick.js"
import { Api, BadRequest, Conflict, CurrentOrg, NotFound, Unavailable } from "./Api.js"

/** SQLSTATEs of a transaction PostgreSQL failed for another's sake (a deadlock, a serialization failure): retryable. */
const conflictCodes: ReadonlySet<string> = new Set(["40P01", "40001"])

/**
 * A database failure as the client sees it, from the Queue (QueueError) or from Db itself (a transaction's own
 * BEGIN or COMMIT): 503 when it could not be reached or the write conflicted, else a logged 500.
 */
export const dbFailure = (e: Db.DbError | Queue.QueueError) =>
  e.unavailable
    ? Effect.fail(new Unavailable({ message: "the database is unavailable; try again" }))
    : e.code !== undefined && conflictCodes.has(e.code)
    // e.g. an enqueue with dependencies that deadlocked with a settle of its parents (docs/flows.md): nothing was
    // written, and the same request again succeeds
    ? Effect.zipRight(Effect.logWarning("a write conflicted with another and was rolled back", e.message),
      Effect.fail(new Unavailable({ message: "the request conflicted with concurrent work and was rolled back; try again" })))
    : Effect.zipRight(Effect.logError("database error", e.message), Effect.die(e))

const isId = Queue.isJobId
const isDbError = (e: unknown): e is Db.DbError => Predicate.isTagged(e, "DbError")

export const jobView = (job: Queue.Job) => ({
  id: job.id,
  stage: job.stage,
  orgId: job.orgId,
  subjectId: job.subjectId,
  payload: job.payload,
  priority: job.priority,
  status: job.status,
  attempts: job.attempts,
  maxAttempts: job.maxAttempts,
  polls: job.polls,
  availableAt: job.availableAt,
  lockedUntil: job.lockedUntil,
  dedupeKey: job.dedupeKey,
  errors: job.errors,
  lastError: job.lastError,
  deadLetterId: null as string | null,
  createdAt: job.createdAt,
  updatedAt: job.updatedAt,
  startedAt: job.startedAt,
  finishedAt: job.finishedAt,
  lastRunMs: job.lastRunMs,
  ...(job.output === null || job.output === undefined ? {} : { output: job.output }),
  progress: job.progress,
  progressMessage: job.progressMessage,
  timeoutMs: job.timeoutMs,
  waitingOn: job.waitingOn,
  batchId: job.batchId
})

const deadJobView = (dl: Queue.DeadLetter) => ({
  id: dl.jobId,
  stage: dl.stage,
  orgId: dl.orgId,
  subjectId: dl.subjectId,
  payload: dl.payload,
  priority: dl.priority,
  status: "dead" as const,
  attempts: dl.attempts,
  maxAttempts: dl.maxAttempts,
  polls: 0,
  availableAt: null,
  lockedUntil: null,
  dedupeKey: dl.dedupeKey,
  errors: dl.errorHistory,
  lastError: dl.reason,
  deadLetterId: dl.id,
  createdAt: dl.jobCreatedAt,
  updatedAt: dl.deadAt,
  startedAt: null,
  finishedAt: dl.deadAt,
  lastRunMs: null,
  progress: null,
  progressMessage: null,
  timeoutMs: null
})

export const deadLetterView = (dl: Queue.DeadLetter) => ({
  id: dl.id,
  jobId: dl.jobId,
  stage: dl.stage,
  orgId: dl.orgId,
  subjectId: dl.subjectId,
  payload: dl.payload,
  priority: dl.priority,
  attempts: dl.attempts,
  maxAttempts: dl.maxAttempts,
  reason: dl.reason,
  errorHistory: dl.errorHistory,
  jobCreatedAt: dl.jobCreatedAt,
  deadAt: dl.deadAt,
  resolutionStatus: dl.resolutionStatus,
  resolutionNotes: dl.resolutionNotes,
  resolvedAt: dl.resolvedAt,
  retriedJobId: dl.retriedJobId
})

/** `PGFIBER_DEV_TICK=1` exposes `POST /api/jobs/tick` (run due jobs on request, for development); otherwise it answers 404. */
export const devTickConfig = Config.boolean("PGFIBER_DEV_TICK").pipe(Config.withDefault(false))

export interface JobsOptions<R> {
  readonly devTick: boolean
  /** Names the dev tick's claims (`locked_by`) when no worker runs in this process. */
  readonly workerId: string
  /** The stages the dev tick may run here (their services provided as R); default: every known stage. */
  readonly tickStages?: ReadonlyArray<Stage.Stage<any, any, R>> | undefined
  /** This process's configuration over the stages' concurrency and limits, which the dev tick claims with as a worker would. */
  readonly tickConfig?: Pick<Worker.WorkerOptions, "concurrency" | "limits"> | undefined
}

export const layer = <R>(options: JobsOptions<R>) =>
  HttpApiBuilder.group(Api, "jobs", (handlers) =>
    Effect.gen(function*() {
      const db = yield* Db.Db
      const queue = yield* Queue.Queue
      const reads = yield* Reads.Reads
      const stages = yield* Submit.KnownStages
      const worker = yield* Effect.serviceOption(Worker.WorkerInfo)
      const tickWorkerId = `${Option.match(worker, { onNone: () => options.workerId, onSome: (w) => w.workerId })}:tick`
      const tickStages = options.tickStages ?? (stages as ReadonlyArray<Stage.Stage<any, any, R>>)
      const context = yield* Effect.context<R>()

      /**
       * Runs the effect as the request's org: a transaction under the tenant role, RLS on every row. The transaction's
       * own failure (BEGIN, COMMIT, the connection) is answered here, as any database failure; the effect's pass on.
       */
      const asOrg = <A, E, R2>(effect: Effect.Effect<A, E, R2>) =>
        Effect.flatMap(CurrentOrg, (principal) =>
          Effect.catchIf(db.withOrg(principal.orgId, effect), isDbError, (e: Db.DbError) => dbFailure(e)))

      const notFound = (what: string) => new NotFound({ message: `${what} not found` })
      const badFilter = (e: Bulk.InvalidFilter) => new BadRequest({ message: e.message, field: e.field })
      /** The internal stages an org's bulk action leaves alone: compiled here, or registered by any worker. */
      const internalStages = StageRegistry.internalNames(stages).pipe(Effect.provideService(Queue.Queue, queue))

      return handlers
        .handle("enqueue", ({ payload: body }) =>
          Effect.gen(function*() {
            const principal = yield* CurrentOrg
            const result = yield* asOrg(
              Submit.submit(stages, {
                stage: body.stage,
                payload: body.payload,
                orgId: principal.orgId,
                subjectId: body.subjectId,
                priority: body.priority,
                delay: body.delayMs === undefined ? undefined : Duration.millis(body.delayMs),
                runAt: body.runAt,
                maxAttempts: body.maxAttempts,
                dedupeKey: body.dedupeKey,
                dedupeMode: body.dedupeMode,
                timeout: body.timeoutMs === undefined ? undefined : Duration.millis(body.timeoutMs),
                dependsOn: body.dependsOn,
                uniqueFor: body.uniqueForMs === undefined ? undefined : Duration.millis(body.uniqueForMs),
                caller: "tenant"
              }).pipe(Effect.provideService(Queue.Queue, queue))
            )
            yield* Effect.logInfo("job submitted").pipe(
              Effect.annotateLogs({ stage: body.stage, jobId: result.id, deduped: result.deduped, org: principal.orgId })
            )
            return result
          }).pipe(
            Effect.catchTags({
              InvalidJob: (e) => Effect.fail(new BadRequest({ message: e.message, field: e.field })),
              QueueError: dbFailure
            })
          ))
        .handle("list", ({ urlParams }) =>
          Effect.gen(function*() {
            const search = yield* Bulk.filterFromText({ payload: urlParams.payload, error: urlParams.error }).pipe(Effect.mapError(badFilter))
            const payload = search.payload as Readonly<Record<string, unknown>> | undefined
            const principal = yield* CurrentOrg
            // a read: on the read replica when one is configured, under the key's org's row-level security
            const jobs = yield* reads.list(Reads.org(principal.orgId), {
              stage: urlParams.stage,
              status: urlParams.status,
              limit: urlParams.limit ?? 100,
              afterId: urlParams.after,
              payload,
              error: search.error
            })
            return { jobs: jobs.map(jobView) }
          }).pipe(Effect.catchTag("QueueError", dbFailure)))
        .handle("bulk", ({ payload: body }) =>
          Effect.gen(function*() {
            const principal = yield* CurrentOrg
            const filter = yield* Bulk.filterFromText(body.filter).pipe(Effect.mapError(badFilter))
            if (!Bulk.narrows(filter)) {
              return yield* new BadRequest({ field: "filter", message: "name at least one condition (stage, status, subject, payload, error, olderThan, newerThan)" })
            }
            const action: Bulk.BulkAction = body.action === "priority"
              ? { kind: "priority", priority: body.priority === undefined ? -1 : typeof body.priority === "number" ? body.priority : Queue.namedPriorities[body.priority] }
              : { kind: body.action }
            yield* Bulk.validateAction(action).pipe(Effect.mapError(badFilter))
            // the key's org, and public stages only: another org's or an internal stage's jobs are neither counted nor changed
            const scoped: Bulk.JobFilter = { ...filter, org: principal.orgId, hiddenStages: yield* internalStages }
            const asTenant = Db.forOrg(principal.orgId)
            if (body.dryRun !== false) {
              const matched = yield* asTenant(queue.bulk.preview(scoped, action))
              return { action: action.kind, dryRun: true, matched }
            }
            const result = yield* asTenant(queue.bulk.apply(scoped, action, { actor: `key:${principal.keyId}` }))
            yield* Effect.logInfo("bulk action").pipe(Effect.annotateLogs({ action: action.kind, org: principal.orgId, ...result }))
            return { action: action.kind, dryRun: false, ...result }
          }).pipe(Effect.catchTag("QueueError", dbFailure)))
        .handle("actions", ({ urlParams }) =>
          asOrg(queue.bulk.actions({ limit: urlParams.limit ?? 100 })).pipe(
            Effect.map((actions) => ({ actions: actions.map(({ orgId: _org, ...a }) => a) })),
            Effect.catchTag("QueueError", dbFailure)
          ))
        .handle("get", ({ path }) =>
          Effect.gen(function*() {
            if (!isId(path.id)) return yield* notFound(`job ${path.id}`)
            const principal = yield* CurrentOrg
            const found = yield* asOrg(Effect.gen(function*() {
              const job = yield* queue.get(path.id)
              if (job !== null && job.status !== "dead") return jobView(job)
              // the dead letter a job became, if any: `GET /jobs/:id` of a dead job says so instead of a bare 404
              const dead = yield* reads.deadLetterOfJob(Reads.org(principal.orgId), path.id)
              // a dead job's history, pointing at the dead letter it became
              if (job !== null) return { ...jobView(job), deadLetterId: dead }
              const dl = dead === null ? null : yield* queue.deadLetters.get(dead)
              return dl === null ? null : deadJobView(dl)
            }))
            if (found === null) {
              return yield* new NotFound({ message: `job ${path.id} not found (finished jobs are kept for their stage's retention, then pruned)` })
            }
            return found
          }).pipe(Effect.catchTag("QueueError", dbFailure)))
        .handle("dependencies", ({ path }) =>
          Effect.gen(function*() {
            // under the org's row-level security: another org's job, or another org's edge, is not found
            const found = isId(path.id) ? yield* asOrg(queue.dependencies(path.id)) : null
            if (found === null) return yield* notFound(`job ${path.id}`)
            const link = (l: Queue.DependencyLink) => ({
              id: l.id,
              stage: l.stage,
              status: l.status,
              onFailure: l.onFailure,
              ...(l.output === null || l.output === undefined ? {} : { output: l.output })
            })
            return { parents: found.parents.map(link), children: found.children.map(link) }
          }).pipe(Effect.catchTag("QueueError", dbFailure)))
        .handle("batch", ({ path }) =>
          // under the org's row-level security: another org's batch is not found
          asOrg(queue.batches.get(path.id)).pipe(
            Effect.flatMap((b) =>
              b === null
                ? Effect.fail(notFound(`batch ${path.id}`))
                : Effect.succeed({
                  id: b.id, total: b.total, completed: b.completed, failed: b.failed, sealed: b.sealed,
                  finishedAt: b.finishedAt, callbacks: b.callbacks
                })
            ),
            Effect.catchTag("QueueError", dbFailure)
          ))
        .handle("cancel", ({ path }) =>
          asOrg(queue.cancel(path.id)).pipe(
            Effect.flatMap((outcome) =>
              outcome === "not-found" ? Effect.fail(notFound(`job ${path.id}`)) : Effect.succeed({ id: path.id, outcome })
            ),
            Effect.catchTag("QueueError", dbFailure)
          ))
        .handle("listDeadLetters", ({ urlParams }) =>
          asOrg(queue.deadLetters.list({
            stage: urlParams.stage,
            unresolvedOnly: !(urlParams.all ?? false),
            limit: urlParams.limit ?? 100,
            afterId: urlParams.after
          })).pipe(
            Effect.map((list) => ({ deadLetters: list.map(deadLetterView) })),
            Effect.catchTag("QueueError", dbFailure)
          ))
        .handle("getDeadLetter", ({ path }) =>
          asOrg(queue.deadLetters.get(path.id)).pipe(
            Effect.flatMap((dl) => (dl === null ? Effect.fail(notFound(`dead letter ${path.id}`)) : Effect.succeed(deadLetterView(dl)))),
            Effect.catchTag("QueueError", dbFailure)
          ))
        .handle("retryDeadLetter", ({ path }) =>
          asOrg(queue.deadLetters.retry(path.id)).pipe(
            Effect.map((jobId) => ({ id: path.id, jobId })),
            Effect.tap((r) => Effect.logInfo("dead letter retried").pipe(Effect.annotateLogs({ deadLetterId: r.id, jobId: r.jobId }))),
            Effect.catchTags({
              JobNotFound: () => Effect.fail(notFound(`dead letter ${path.id}`)),
              InvalidJob: (e) => Effect.fail(new Conflict({ message: e.message })),
              QueueError: dbFailure
            })
          ))
        .handle("resolveDeadLetter", ({ path, payload }) =>
          asOrg(queue.deadLetters.resolve(path.id, payload.notes)).pipe(
            Effect.as({ id: path.id, resolutionStatus: "resolved" as const }),
            Effect.tap(() => Effect.logInfo("dead letter resolved").pipe(Effect.annotateLogs({ deadLetterId: path.id }))),
            Effect.catchTags({
              JobNotFound: () => Effect.fail(notFound(`dead letter ${path.id}`)),
              QueueError: dbFailure
            })
          ))
        .handle("tick", ({ payload }) =>
          Effect.gen(function*() {
            if (!options.devTick) return yield* notFound("POST /api/jobs/tick (set PGFIBER_DEV_TICK=1 to enable it)")
            const principal = yield* CurrentOrg
            // only the key's org's jobs are claimed (RLS on the claim, its transaction's own failure a DbError);
            // handlers run as in a worker
            const result = yield* Tick.run<Stage.Stage<any, any, R>, Db.DbError>({
              max: payload.max ?? 10,
              stages: tickStages,
              workerId: tickWorkerId,
              concurrency: options.tickConfig?.concurrency,
              limits: options.tickConfig?.limits,
              claimScope: (claim) => db.withOrg(principal.orgId, claim),
              // the reaper acts on every org's rows; a tenant's request does not run it
              reap: false
            }).pipe(Effect.provideService(Queue.Queue, queue), Effect.provide(context))
            const { stages: _perStage, ...counts } = result
            return { ok: true as const, ...counts }
          }).pipe(Effect.catchTags({ QueueError: dbFailure, DbError: dbFailure })))
    }))
