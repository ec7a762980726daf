/**
 * The Postgres Queue: jobs live in `<schema>.jobs`; the insert trigger NOTIFYs per stage; one LISTEN
 * connection per process carries wake-ups. Statements are in JobsSql.ts.
 */
import { createHash } from "node:crypto"
import { Data, Duration, Effect, Either, Exit, Layer, Option, ParseResult, Predicate, Schema } from "effect"
import * as Db from "../layers/Db.js"
import { flat } from "../layers/FlatSql.js"
import * as Spans from "../layers/Spans.js"
import * as Bulk from "./Bulk.js"
import * as BulkSql from "./BulkSql.js"
import * as Events from "./Events.js"
import type { BatchOptions, Beat, DependencyLink, InvalidJob, Job, JobStatus, StageStats, ValidJob } from "./Job.js"
import { countEnqueued, defaultMaxPayloadBytes, InvalidJob as InvalidJobError, isJobId, validateCallbacks, jobFromDeadLetter, JobNotFound, parentProblem, policyColumn, policyFromColumn, validateAll } from "./Job.js"
import * as JobsSql from "./JobsSql.js"
import * as Limits from "./Limits.js"
import * as Outcome from "./Outcome.js"
import type { DeadLettered, Settled, SettleOptions } from "./Outcome.js"
import * as Queue from "./Queue.js"
import * as Registry from "./Registry.js"
import * as Rows from "./Rows.js"
import * as SqlClock from "./SqlClock.js"
import { type QueueOptions, resolveRetention, retentionParams, type Wakeups } from "./Queue.js"

/** Spans for queue operations, without `Effect.fn`'s two stack captures per call (~0.06 ms on a wake-up's claim). */
const spanOptions = { captureStackTrace: false } as const

const str = (v: unknown): string | null => (v === null || v === undefined ? null : String(v))
const date = (v: unknown): Date => (v instanceof Date ? v : new Date(String(v)))


/** What a LISTEN and one select sent together answer: the LISTEN's (no rows), then the select's one row. */
const ListenAndSelect = Schema.Tuple(Schema.Unknown, Schema.Tuple(Schema.Record({ key: Schema.String, value: Schema.Unknown })))
const decodeListenAndSelect = (results: unknown) => Option.map(Schema.decodeUnknownOption(ListenAndSelect)(results), ([, [row]]) => row)

/** A stage's wake-lead lock (Waker.ts): a 64-bit advisory lock key from the schema and the stage's name. */
const wakeLockKey = (schema: string, stage: string): string =>
  createHash("sha256").update(`${schema}:wake:${stage}`).digest().readBigInt64BE(0).toString()

/**
 * A row (or a claimed job's array) the job model does not accept: a defect of a statement or a migration, not
 * a value to cast. It leaves the Queue typed, as a QueueError of the operation that read it (`atEdge`).
 */
export class RowMismatch extends Data.TaggedError("RowMismatch")<{ readonly message: string; readonly cause?: unknown }> {}

/** Rows of `what` decoded by `schema` (Rows.ts), or a RowMismatch saying which and why. */
export const decodeRows = <A, I>(what: string, schema: Schema.Schema<A, I>) => {
  const decode = Schema.decodeUnknown(Schema.Array(schema))
  return (rows: unknown): Effect.Effect<ReadonlyArray<A>, RowMismatch> =>
    Effect.mapError(decode(rows), (e) => {
      // where and what, not the whole schema (ParseError's own message spells out every field's type)
      const [first] = ParseResult.ArrayFormatter.formatErrorSync(e)
      const at = first === undefined ? "" : `${first.path.map((p) => `[${JSON.stringify(p)}]`).join("")}: ${first.message}`
      return new RowMismatch({ message: `a row of ${what} did not decode: ${at}`, cause: e })
    })
}

/** A claimed job whose row the job model does not accept: its lease (typed columns, always readable) and why. */
export interface Undecodable {
  readonly id: string
  readonly lease: number
  readonly reason: string
}

/**
 * A claim's jobs from its JSON arrays, each checked by hand (`Rows.decodeClaimed`): the claim's hot path, where
 * the Tuple's Schema decode would cost the worker a quarter to 40 % more CPU per job, the check 1 % (docs/benchmarks.md).
 * The check is per job: a row that does not decode (its error history is free-form jsonb, which a hand edit or a
 * faulty migration can break) is set aside with its lease, so the batch's other jobs still run. Only an array
 * whose id or lease cannot be read fails the claim: that is the statement's shape, wrong for every row.
 */
export const claimedJobs = (
  arrays: ReadonlyArray<unknown>
): Effect.Effect<{ readonly jobs: Array<Job>; readonly undecodable: Array<Undecodable> }, RowMismatch> => {
  const jobs: Array<Job> = []
  const undecodable: Array<Undecodable> = []
  for (const a of arrays) {
    const decoded = Rows.decodeClaimed(a)
    if (Either.isRight(decoded)) {
      jobs.push(Rows.jobFromClaimed(decoded.right))
      continue
    }
    const id: unknown = Array.isArray(a) ? a[0] : undefined
    const lease: unknown = Array.isArray(a) ? a[13] : undefined
    if (typeof id !== "string" || !isJobId(id) || typeof lease !== "number") {
      return Effect.fail(new RowMismatch({ message: `a claim's job did not decode: ${decoded.left}` }))
    }
    undecodable.push({ id, lease, reason: decoded.left })
  }
  return Effect.succeed({ jobs, undecodable })
}

const liveJobs = decodeRows("jobs", Rows.JobFromLiveRow)
const archivedJobs = decodeRows("jobs_archive", Rows.JobFromArchivedRow)
const deadLetterRows = decodeRows("dead_letters", Rows.DeadLetterFromRow)
const batchRows = decodeRows("job_batches", Rows.BatchFromRow)
const overrideRows = decodeRows("stage_limits", Rows.OverrideFromRow)

/** A process reads the limit overrides again after this long while claiming, should it miss a change's NOTIFY. */
export const overridesMaxAgeMs = 10_000

const ms = (d: Duration.Duration) => Math.max(0, Math.round(Duration.toMillis(d)))
const isId = isJobId
const clampLimit = (n: number | undefined, fallback: number) => Math.max(1, Math.min(n ?? fallback, 10_000))

/** A Db failure as the Queue's own error, named by the operation: its message, code and `unavailable` as they were. */
export const queueError = (operation: string, e: Db.DbError): Queue.QueueError =>
  new Queue.QueueError({ operation, message: e.message, code: e.code, unavailable: e.unavailable, cause: e })

/** A row the model does not accept, as the Queue's error: not the database's being away, not an SQLSTATE. */
const mismatchError = (operation: string, e: RowMismatch): Queue.QueueError =>
  new Queue.QueueError({ operation, message: e.message, unavailable: false, cause: e })

const isEdgeFailure = (e: unknown): e is Db.DbError | RowMismatch => Predicate.isTagged(e, "DbError") || Predicate.isTagged(e, "RowMismatch")

/**
 * The Queue's edge: a Db failure of `effect`, or a row it read that does not decode, becomes a QueueError named
 * `operation`; its other failures pass as they are.
 */
export const atEdge = (operation: string) =>
<A, E, R>(effect: Effect.Effect<A, E | Db.DbError | RowMismatch, R>): Effect.Effect<A, Exclude<E, Db.DbError | RowMismatch> | Queue.QueueError, R> =>
  Effect.catchIf(effect, isEdgeFailure, (e) => Effect.fail(e._tag === "DbError" ? queueError(operation, e) : mismatchError(operation, e)))

/** A caller's failure, carried through a Db transaction or savepoint as it is (only the Db's own become QueueError). */
class BodyFailed<E> extends Data.TaggedClass("BodyFailed")<{ readonly error: E }> {}

/**
 * `around` (a transaction, a savepoint) at the edge: its own failures (BEGIN, COMMIT, the connection lost) become a
 * QueueError named `operation`; the body's failures come out as the body failed, even a Db error of the caller's own.
 */
const bodyAtEdge = <A, E, R>(
  operation: string,
  around: <A2, E2, R2>(effect: Effect.Effect<A2, E2, R2>) => Effect.Effect<A2, E2 | Db.DbError, R2>,
  body: Effect.Effect<A, E, R>
): Effect.Effect<A, E | Queue.QueueError, R> =>
  around(Effect.mapError(body, (error) => new BodyFailed({ error }))).pipe(
    Effect.catchAll((e) => Effect.fail(e._tag === "BodyFailed" ? e.error : queueError(operation, e)))
  )

export const make = (options: QueueOptions = {}) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const events = yield* Events.current
    const retention = retentionParams(yield* resolveRetention(options))
    // the time each operation's statements run at (SqlClock.ts): the database's own in production (no parameter,
    // nothing run for it), the caller's Effect Clock in tests; read for each statement, from the caller's fiber
    const withAt = SqlClock.withAt(yield* SqlClock.SqlClock)
    const run = <A>(query: (sql: Db.Sql, at: SqlClock.At) => PromiseLike<A>) => withAt((at) => db.run((sql) => query(sql, at)))
    const runWithSettings = <A>(
      settings: Readonly<Record<string, string>>,
      query: (sql: Db.Sql, at: SqlClock.At) => PromiseLike<A>,
      runOptions?: { readonly atomic?: boolean }
    ) => withAt((at) => db.runWithSettings(settings, (sql) => query(sql, at), runOptions))
    let savepoints = 0
    const validation = {
      maxPayloadBytes: options.maxPayloadBytes ?? defaultMaxPayloadBytes,
      knownStages: options.knownStages ? new Set(options.knownStages) : undefined
    }

    /**
     * Jobs with a uniqueness window (`uniqueFor`), in one transaction: the windows claimed first; a job whose window
     * was taken (earlier, or by a job before it in this batch) returns that window's job, deduplicated; the others
     * are written as any job is, and their windows record them.
     */
    const enqueueValid = (jobs: ReadonlyArray<ValidJob>): Effect.Effect<ReadonlyArray<{ id: string; deduped: boolean }>, InvalidJob | Db.DbError> => {
      const windowed = jobs.flatMap((j, i) => (j.uniqueForMs === null ? [] : [i]))
      if (windowed.length === 0) return enqueueUnwindowed(jobs)
      return db.transaction(Effect.gen(function*() {
        const ws = windowed.map((i) => jobs[i]!)
        const claimed = yield* run((sql, at) =>
          JobsSql.claimWindows(sql, at, { orgs: ws.map((j) => j.orgId), keys: ws.map((j) => j.dedupeKey!), periods: ws.map((j) => j.uniqueForMs!) })
        )
        const windowKey = (k: number) => JSON.stringify([ws[k]!.orgId, ws[k]!.dedupeKey, claimed[k]!.window_start.toISOString()])
        // the first job of each fresh window is written; later ones in the batch follow it
        const firstOf = new Map<string, number>()
        const taken: Array<number> = []
        claimed.forEach((c, k) => {
          const key = windowKey(k)
          if (c.fresh && !firstOf.has(key)) firstOf.set(key, k)
          else if (!c.fresh) taken.push(k)
        })
        const existing = new Map<number, string | null>()
        if (taken.length > 0) {
          const rows = yield* db.run((sql) =>
            JobsSql.selectWindowJobs(sql, {
              orgs: taken.map((k) => ws[k]!.orgId),
              keys: taken.map((k) => ws[k]!.dedupeKey!),
              starts: taken.map((k) => claimed[k]!.window_start)
            })
          )
          rows.forEach((r) => existing.set(taken[r.ord - 1]!, r.job_id))
        }
        const writes = jobs.filter((_, i) => {
          const k = windowed.indexOf(i)
          return k < 0 || firstOf.get(windowKey(k)) === k
        })
        const written = yield* enqueueUnwindowed(writes)
        const byJob = new Map(writes.map((j, n) => [j, written[n]!]))
        const fresh = [...firstOf.values()]
        if (fresh.length > 0) {
          yield* db.run((sql) =>
            JobsSql.setWindowJobs(sql, {
              orgs: fresh.map((k) => ws[k]!.orgId),
              keys: fresh.map((k) => ws[k]!.dedupeKey!),
              starts: fresh.map((k) => claimed[k]!.window_start),
              jobIds: fresh.map((k) => byJob.get(ws[k]!)!.id)
            })
          )
        }
        return yield* Effect.forEach(jobs, (j, i) => {
          const k = windowed.indexOf(i)
          if (k < 0 || firstOf.get(windowKey(k)) === k) return Effect.succeed(byJob.get(j)!)
          const first = firstOf.get(windowKey(k))
          const id = first !== undefined ? byJob.get(ws[first]!)!.id : existing.get(k)
          // a window row and its job commit together (this transaction), so a taken window always names its job
          return id ? Effect.succeed({ id, deduped: true }) : Effect.dieMessage(`uniqueness window of ${ws[k]!.dedupeKey} names no job`)
        })
      }))
    }

    const enqueueUnwindowed = (jobs: ReadonlyArray<import("./Job.js").ValidJob>) =>
      Effect.gen(function*() {
        if (jobs.length === 0) return []
        // a batch may repeat a dedupe key (per org); ON CONFLICT cannot touch a row twice, so collapse them first:
        // the first one stands for `first`, the last one for `replace` and `debounce` (the newest enqueue wins)
        const byKey = new Map<string, number>()
        const unique: Array<import("./Job.js").ValidJob> = []
        const slot: Array<number> = []
        for (const job of jobs) {
          const key = job.dedupeKey === null ? null : JSON.stringify([job.orgId, job.dedupeKey])
          const seen = key === null ? undefined : byKey.get(key)
          if (seen !== undefined) {
            if (job.dedupeMode !== "first") unique[seen] = job
            slot.push(-1 - seen)
            continue
          }
          if (key !== null) byKey.set(key, unique.length)
          slot.push(unique.length)
          unique.push(job)
        }
        const plain = unique.filter((j) => j.dedupeMode === "first" && j.dependsOn.length === 0 && j.batchId === null)
        const dependent = unique.filter((j) => j.dependsOn.length > 0 || j.batchId !== null)
        const replacing = (["replace", "debounce"] as const).map((mode) => [mode, unique.filter((j) => j.dedupeMode === mode)] as const)
          .filter(([, js]) => js.length > 0)
        const write = Effect.gen(function*() {
          const rows = new Map<import("./Job.js").ValidJob, { id: string; deduped: boolean }>()
          if (plain.length > 0) {
            const inserted = yield* run((sql, at) => JobsSql.insertJobs(flat(sql), at, plain))
            plain.forEach((j, i) => rows.set(j, { id: String(inserted[i]!.id), deduped: inserted[i]!.deduped }))
          }
          if (dependent.length > 0) {
            const written = yield* enqueueDependents(dependent)
            dependent.forEach((j, i) => rows.set(j, written[i]!))
          }
          for (const [mode, js] of replacing) {
            const written = yield* run((sql, at) => JobsSql.insertJobsReplacing(sql, at, db.schema, js, mode))
            const byDedupeKey = new Map(written.map((r) => [JSON.stringify([r.org_id, r.dedupe_key]), r]))
            for (const j of js) {
              const r = byDedupeKey.get(JSON.stringify([j.orgId, j.dedupeKey]))!
              rows.set(j, { id: String(r.id), deduped: r.deduped })
            }
          }
          return rows
        })
        const statements = replacing.length + (plain.length > 0 ? 1 : 0) + (dependent.length > 0 ? 2 : 0)
        const rows = yield* (statements > 1 ? db.transaction(write) : write)
        return slot.map((s) => {
          const row = rows.get(unique[s >= 0 ? s : -1 - s]!)!
          return { id: row.id, deduped: s < 0 ? true : row.deduped }
        })
      })

    // a stage this build does not know may be one a user's worker registered: ask the registry (only then)
    const validationFor = (jobs: ReadonlyArray<import("./Job.js").NewJob>) =>
      Effect.gen(function*() {
        const known = validation.knownStages
        if (known === undefined) return validation
        const others = [...new Set(jobs.map((j) => j?.stage).filter((s): s is string => typeof s === "string" && !known.has(s)))]
        if (others.length === 0) return validation
        const registered = yield* db.run((sql) => Registry.registeredAmong(sql, others))
        if (registered.length === 0) return validation
        return { ...validation, knownStages: new Set([...known, ...registered.map((r) => r.stage)]) }
      })

    /**
     * Jobs with parents, inside the enqueue's transaction: the live parents locked and marked (JobsSql.lockParents),
     * then the finished ones read from the history in a statement of its own (so it sees a settle that held a
     * parent first), then the rows, `waiting` on their live parents, and their edges.
     */
    const enqueueDependents = (jobs: ReadonlyArray<ValidJob>) =>
      Effect.gen(function*() {
        const byBigint = (a: string, b: string) => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0)
        const parentIds = [...new Set(jobs.flatMap((j) => j.dependsOn.map((d) => d.id)))].sort(byBigint)
        const live = new Map(
          parentIds.length === 0 ? [] : (yield* db.run((sql) => JobsSql.lockParents(sql, parentIds))).map((r) => [r.id, r.org_id])
        )
        // batches after parents: every job row is locked before any batch row, as in the settle (settle_finished)
        const batchIds = [...new Set(jobs.flatMap((j) => (j.batchId === null ? [] : [j.batchId])))].sort(byBigint)
        if (batchIds.length > 0) {
          const batches = new Map((yield* db.run((sql) => JobsSql.lockBatches(sql, batchIds))).map((b) => [b.id, b]))
          for (const [i, job] of jobs.entries()) {
            if (job.batchId === null) continue
            const b = batches.get(job.batchId)
            const at = jobs.length > 1 ? `job ${i}: ` : ""
            // another org's batch is not found, in the same words as one that does not exist
            if (b === undefined || b.org_id !== job.orgId) {
              return yield* new InvalidJobError({ field: "batchId", message: `${at}batch ${job.batchId} not found` })
            }
            if (b.sealed) return yield* new InvalidJobError({ field: "batchId", message: `${at}batch ${job.batchId} is sealed` })
          }
        }
        const missing = parentIds.filter((id) => !live.has(id))
        const finished = new Map(
          missing.length === 0 ? [] : (yield* db.run((sql) => JobsSql.selectFinishedParents(sql, missing))).map((r) => [r.id, r])
        )
        const waitingOn = yield* Effect.forEach(jobs, (job, i) =>
          Effect.suspend(() => {
            let waiting = 0
            for (const dep of job.dependsOn) {
              const problem = parentProblem(job, dep, live.has(dep.id) ? { orgId: live.get(dep.id)! } : undefined, finished.get(dep.id), jobs.length > 1 ? i : undefined)
              if (problem !== undefined) return Effect.fail(problem)
              if (live.has(dep.id)) waiting++
            }
            return Effect.succeed(waiting)
          }))
        const inserted = yield* run((sql, at) => JobsSql.insertWaitingJobs(sql, at, jobs, waitingOn))
        const edges = { jobIds: [] as Array<string>, parentIds: [] as Array<string>, orgs: [] as Array<string | null>, onFailure: [] as Array<string> }
        jobs.forEach((job, i) => {
          if (inserted[i]!.deduped) return
          for (const dep of job.dependsOn) {
            edges.jobIds.push(String(inserted[i]!.id))
            edges.parentIds.push(dep.id)
            edges.orgs.push(job.orgId)
            edges.onFailure.push(policyColumn[dep.onFailure])
          }
        })
        if (edges.jobIds.length > 0) yield* db.run((sql) => JobsSql.insertEdges(sql, edges))
        if (batchIds.length > 0) {
          // a job deduplicated onto a live one did not join
          const joined = batchIds.map((id) => jobs.filter((j, i) => j.batchId === id && !inserted[i]!.deduped).length)
          yield* db.run((sql) => JobsSql.addToBatchTotals(sql, batchIds, joined))
        }
        return inserted.map((r) => ({ id: String(r.id), deduped: r.deduped }))
      })

    const enqueue = (jobs: ReadonlyArray<import("./Job.js").NewJob>) =>
      Effect.gen(function*() {
        const valid = validateAll(jobs, yield* validationFor(jobs))
        if (Either.isLeft(valid)) return yield* valid.left
        // the insert commits (outside a transaction) before Enqueued is published: this process's pools may claim
        // the jobs in between, and their Started waits in the bus until the Enqueued is out (Events.holding)
        const results = yield* events.holding(Effect.tap(enqueueValid(valid.right), (results) =>
          Effect.sync(() => events.active() && events.publish(Events.enqueued(valid.right, results)))))
        yield* countEnqueued(valid.right, results)
        return results
      }).pipe(Effect.withSpan("Queue.enqueue", spanOptions))

    // run-time overrides: read again at the first claim after a change (every change NOTIFYs 'pgfiber:limits',
    // migration 0026, and the Waker calls `limits.changed`), and otherwise at most every `overridesMaxAgeMs` while
    // claiming (never while idle), in case a notification was missed; a stale copy serves the claim while the next
    // one is read beside it, so no claim waits for that read (at one wake-up every 20 ms, every 50th paid a round
    // trip: the wake-up's p99). Read every second, they were one statement a second per claiming process.
    let overrides: { readonly at: number; readonly byStage: ReadonlyMap<string, Limits.Override> } | null = null
    let refreshing = false
    const listOverrides = db.run((sql) => JobsSql.selectLimitOverrides(sql)).pipe(
      Effect.flatMap((rows) =>
        Effect.map(overrideRows(rows), (overrides): ReadonlyMap<string, Limits.Override> =>
          new Map(overrides.map((o, i) => [String(rows[i]!.stage), o] as const)))
      )
    )
    // bumped by every change made here or heard of, so a read begun before it cannot bring back what it replaced
    let generation = 0
    const overridesChanged = () => {
      overrides = null
      generation++
    }
    const readOverrides = Effect.suspend(() => {
      const at = Date.now()
      const asOf = generation
      return Effect.map(listOverrides, (byStage) => {
        if (asOf === generation) overrides = { at, byStage }
        return byStage
      })
    })
    const overrideFor = (stage: string) =>
      Effect.suspend(() => {
        const known = overrides
        if (known === null) return Effect.map(readOverrides, (byStage) => byStage.get(stage))
        if (Date.now() - known.at >= overridesMaxAgeMs && !refreshing) {
          refreshing = true
          return Effect.as(
            Effect.forkDaemon(readOverrides.pipe(Effect.ignore, Effect.ensuring(Effect.sync(() => (refreshing = false))))),
            known.byStage.get(stage)
          )
        }
        return Effect.succeed(known.byStage.get(stage))
      })

    // where each stage's next fair claim starts its walk over orgs: after the last org this process visited
    const cursors = new Map<string, string>()
    // stages whose last claim here came back short (the queue ran dry): their next claim is most likely a
    // wake-up's, for a few jobs, so it tries the plain claim (`claimReadyIfAll`: taken when fair shares would
    // claim the same jobs) before the fair claim. So does a stage with no cursor: one whose last fair claim found
    // one org only at its priority, or that has had none yet (a backlog of one org is then claimed plainly, claim after
    // claim; the fair claim's walk only once another org's jobs appear)
    const ranDry = new Set<string>()
    // the plain claims' order (their JSON comes in none)
    const byClaimOrder = (a: Job, b: Job) =>
      a.priority - b.priority || a.availableAt.getTime() - b.availableAt.getTime() || Number(a.id) - Number(b.id)

    /**
     * The claim's decoded jobs, and how many rows it took (`taken`, the undecodable ones too); the ones that did not
     * decode are dead-lettered now, under the lease the claim just took, with the reason. Their error history is emptied first (kept, as text, in the reason): copied as it is,
     * it would break every read of the dead letters and the history as it broke the claim. The stage's
     * onDeadLetter does not run for them: it takes the job, which could not be read. A failure to bury them is
     * logged, not the claim's: the reaper requeues them when the lease expires, and a later claim tries again.
     */
    const runnable = (claimed: { readonly jobs: Array<Job>; readonly undecodable: ReadonlyArray<Undecodable> }) => {
      const bad = claimed.undecodable
      // the rows the claim took: those that decoded and those that did not
      const taken = claimed.jobs.length + bad.length
      if (bad.length === 0) return Effect.succeed({ jobs: claimed.jobs, taken })
      const bury = db.transaction(Effect.gen(function*() {
        const cleared = yield* db.run((sql) => JobsSql.clearErrorHistory(sql, bad.map((b) => b.id), bad.map((b) => b.lease)))
        const history = new Map(cleared.map((r) => [r.id, r.errors]))
        return yield* settle(bad.map((b) => Outcome.deadLetter(b, {
          tag: "UndecodableRow",
          message: `did not decode: ${b.reason}; its error history, set aside: ${(history.get(b.id) ?? "").slice(0, 500)}`
        })))
      }))
      return bury.pipe(
        Effect.tap(() => Effect.logError(`dead-lettered ${bad.length} claimed job(s) whose row did not decode`, bad.map((b) => `${b.id}: ${b.reason}`).join("; "))),
        Effect.catchAll((e) => Effect.logError("could not dead-letter claimed jobs whose row did not decode; the reaper will requeue them", e)),
        Effect.as({ jobs: claimed.jobs, taken })
      )
    }

    const claimBatch = (
      stage: string,
      limit: number,
      claimOptions: Queue.ClaimOptions
    ) =>
      Effect.gen(function*() {
        if (limit <= 0) return { jobs: [], rateLimitedForMs: null, capped: false }
        const shares = Limits.applyOverride(claimOptions.shares ?? Limits.defaultShares, yield* overrideFor(stage))
        const leaseMs = ms(claimOptions.leaseFor)
        if (!shares.fair && !Limits.isLimited(shares)) {
          const rows = yield* runWithSettings(
            JobsSql.claimSettings,
            (sql, at) => JobsSql.claimReady(flat(sql), at, stage, limit, claimOptions.workerId, leaseMs)
          )
          const { jobs, taken } = yield* runnable(yield* claimedJobs(rows[0]?.jobs ?? []))
          return { jobs: jobs.sort(byClaimOrder), taken, rateLimitedForMs: null, capped: false }
        }
        const limited = Limits.isLimited(shares)
        if (!limited && (ranDry.has(stage) || !cursors.has(stage))) {
          // every ready job fits in this claim, or they are one org's: fair shares would take the same, without the walk
          const rows = yield* runWithSettings(
            JobsSql.claimSettings,
            (sql, at) => JobsSql.claimReadyIfAll(flat(sql), at, stage, limit, claimOptions.workerId, leaseMs)
          )
          if (rows[0]?.fits === true) {
            const { jobs, taken } = yield* runnable(yield* claimedJobs(rows[0].jobs ?? []))
            if (taken < limit) ranDry.add(stage)
            else ranDry.delete(stage)
            return { jobs: jobs.sort(byClaimOrder), taken, rateLimitedForMs: null, capped: false }
          }
          ranDry.delete(stage)
        }
        const cursor = cursors.get(stage) ?? null
        // one statement, as the plain claim; a limited stage's claim is a transaction (porsager's own, no reservation):
        // counting and spending are exact only with this stage's claims in line, each seeing the last one's commit
        // (the lock, then the claim's snapshot)
        const [row] = yield* runWithSettings(JobsSql.claimSettings, async (sql, at) => {
          if (limited) await JobsSql.lockStageLimits(sql, db.schema, stage)
          return await JobsSql.claimShares(flat(sql), at, stage, limit, claimOptions.workerId, leaseMs, shares, cursor)
        }, { atomic: limited })
        // in claim order: by priority, then round by round across orgs
        const { jobs, taken } = yield* runnable(yield* claimedJobs(row?.jobs ?? []))
        // the walk stops after `limit` orgs: one found means one there only when it could have found two
        if (!limited && limit > 1 && row?.orgs === 1) cursors.delete(stage)
        else if (row?.cursor != null) cursors.set(stage, row.cursor)
        if (taken < limit) ranDry.add(stage)
        else ranDry.delete(stage)
        return {
          jobs,
          taken,
          rateLimitedForMs: row?.rate_wait_ms == null ? null : Math.max(1, Math.ceil(Number(row.rate_wait_ms))),
          capped: row?.capped === true
        }
      }).pipe(Spans.whenTraced("Queue.claim", spanOptions))

    const claim = (stage: string, limit: number, claimOptions: Queue.ClaimOptions) =>
      Effect.map(claimBatch(stage, limit, claimOptions), (r) => r.jobs)

    const limits = {
      list: listOverrides,
      set: (stage: string, o: Partial<Limits.Override>) =>
        run((sql, at) => JobsSql.upsertLimitOverride(sql, at, stage, { ...Limits.emptyOverride, ...o })).pipe(
          Effect.flatMap((rows) => Effect.map(overrideRows(rows), ([o]) => o!)),
          Effect.tap(() => Effect.sync(overridesChanged))
        ),
      clear: (stage: string) =>
        db.run((sql) => JobsSql.deleteLimitOverride(sql, stage)).pipe(
          Effect.map((rows) => rows.length > 0),
          Effect.tap(() => Effect.sync(overridesChanged))
        ),
      changed: () => overridesChanged()
    }

    const split = (leases: ReadonlyArray<{ id: string; lease: number }>) => ({
      ids: leases.map((l) => l.id),
      tokens: leases.map((l) => l.lease)
    })

    const heartbeat = (leases: ReadonlyArray<Beat>, leaseFor: Duration.Duration) => {
      if (leases.length === 0) return Effect.succeed([])
      const { ids, tokens } = split(leases)
      const progress = {
        reported: leases.map((l) => (l.reported !== undefined ? 1 : 0)),
        values: leases.map((l) => l.reported?.value ?? null),
        messages: leases.map((l) => l.reported?.message ?? null)
      }
      return run((sql, at) => JobsSql.extendLeases(sql, at, ids, tokens, ms(leaseFor), progress)).pipe(
        Effect.map((rows) => rows.map((r) => String(r.id))),
        Effect.withSpan("Queue.heartbeat")
      )
    }

    const settledAs: Record<string, Settled> = {
      complete: "completed",
      remove: "released",
      dead: "deadLettered",
      retry: "retried",
      reschedule: "rescheduled",
      release: "released"
    }
    const kindOf: Record<Outcome.Outcome["_tag"], string> = {
      Complete: "complete",
      Retry: "retry",
      Reschedule: "reschedule",
      DeadLetter: "dead",
      Release: "release"
    }

    // a batch of completions with no follow-ups, the settler's common case: its own, leaner statement
    const completeAll = (outcomes: ReadonlyArray<Outcome.Outcome>, settleOptions: SettleOptions) => {
      const n = outcomes.length
      const ids = new Array<string>(n)
      const leases = new Array<number>(n)
      const outputs = new Array<string | null>(n)
      const runMs = new Array<number | null>(n)
      for (let i = 0; i < n; i++) {
        const o = outcomes[i] as Extract<Outcome.Outcome, { readonly _tag: "Complete" }>
        ids[i] = o.lease.id
        leases[i] = o.lease.lease
        outputs[i] = o.output !== undefined ? JSON.stringify(o.output) : null
        runMs[i] = o.runMs ?? null
      }
      const retainMs = settleOptions.retain === undefined ? null : Math.max(0, Duration.toMillis(settleOptions.retain))
      return run((sql, at) =>
        JobsSql.completeOutcomes(flat(sql), at, db.schema, { ids, leases, outputs, runMs }, retainMs, retention, settleOptions.wakeFreed ?? false)
      ).pipe(
        Effect.map((rows) => {
          if (rows.length === 0) return ids.map((): Settled => "completed")
          const fenced = new Set(rows.map((r) => r.id))
          return ids.map((id): Settled => (fenced.has(id) ? "fenced" : "completed"))
        }),
        Spans.whenTraced("Queue.settle", spanOptions)
      )
    }

    const settle = (outcomes: ReadonlyArray<Outcome.Outcome>, settleOptions: SettleOptions = {}) => {
      if (outcomes.length === 0) return Effect.succeed([] as ReadonlyArray<Settled>)
      // a last progress report to write goes by the general statement, which writes it (rare: a report within the
      // last second of a run)
      if (outcomes.every((o) => o._tag === "Complete" && o.followUps.length === 0 && o.progress === undefined)) {
        return completeAll(outcomes, settleOptions)
      }
      // follow-ups are validated before anything is written; a job whose follow-ups are invalid dies instead
      const followUps: Array<ReadonlyArray<ValidJob>> = []
      const input = {
        ids: [] as Array<string>,
        leases: [] as Array<number>,
        kinds: [] as Array<string>,
        delays: [] as Array<number>,
        tags: [] as Array<string | null>,
        messages: [] as Array<string | null>,
        outputs: [] as Array<string | null>,
        runMs: [] as Array<number | null>,
        retainMs: [] as Array<number | null>,
        progress: [] as Array<number | null>,
        progressMessages: [] as Array<string | null>
      }
      const retainMs = settleOptions.retain === undefined ? null : Math.max(0, Duration.toMillis(settleOptions.retain))
      let anyFollowUps = false
      let mayDie = false
      outcomes.forEach((o, i) => {
        let kind = kindOf[o._tag]
        let tag: string | null = null
        let message: string | null = null
        let delay = 0
        if (o._tag === "Complete" && o.followUps.length > 0) {
          const valid = validateAll(o.followUps, validation)
          if (Either.isLeft(valid)) {
            kind = "dead"
            tag = "InvalidFollowUp"
            message = `follow-up rejected: ${valid.left.message}`
          } else {
            followUps[i] = valid.right
            anyFollowUps = true
          }
        } else if (o._tag === "Retry" || o._tag === "DeadLetter") {
          tag = o.error.tag
          message = o.error.message
        }
        if (o._tag === "Retry" || o._tag === "Reschedule") delay = ms(o.delay)
        if (kind === "dead" || kind === "retry") mayDie = true
        input.ids.push(o.lease.id)
        input.leases.push(o.lease.lease)
        input.kinds.push(kind)
        input.delays.push(delay)
        input.tags.push(tag)
        input.messages.push(message)
        input.outputs.push(o._tag === "Complete" && kind === "complete" && o.output !== undefined ? JSON.stringify(o.output) : null)
        input.runMs.push(o.runMs ?? null)
        input.retainMs.push(retainMs)
        input.progress.push(o.progress?.value ?? null)
        input.progressMessages.push(o.progress?.message ?? null)
      })
      const write = Effect.gen(function*() {
        const rows = yield* run((sql, at) =>
          JobsSql.settleOutcomes(flat(sql), at, db.schema, input, retention, settleOptions.wakeFreed ?? false)
        )
        const byId = new Map(rows.map((r) => [r.id, r]))
        const results = outcomes.map((o): Settled => {
          const row = byId.get(o.lease.id)
          return row ? settledAs[row.action]! : "fenced"
        })
        if (anyFollowUps) {
          const next = results.flatMap((r, i) => (r === "completed" && followUps[i] ? followUps[i]! : []))
          if (next.length > 0) {
            // a follow-up's parents are checked as it is written (one not found cannot be known before): a defect
            const written = yield* Effect.orDieWith(enqueueValid(next), (e) => new Error(`follow-up rejected: ${e.message}`))
            yield* countEnqueued(next, written)
            if (events.active()) events.publish(Events.enqueued(next, written))
          }
        }
        if (settleOptions.onDeadLettered) {
          const dead = results.flatMap((r, index): Array<DeadLettered> =>
            r === "deadLettered"
              ? [{ index, reason: byId.get(outcomes[index]!.lease.id)!.reason ?? "", exhausted: outcomes[index]!._tag === "Retry" }]
              : []
          )
          if (dead.length > 0) yield* settleOptions.onDeadLettered(dead)
        }
        return results as ReadonlyArray<Settled>
      })
      // one statement commits on its own; follow-ups and dead-letter hooks need it in one transaction
      const atomic = anyFollowUps || (mayDie && settleOptions.onDeadLettered !== undefined)
      return (atomic ? db.transaction(write) : write).pipe(Spans.whenTraced("Queue.settle", spanOptions))
    }

    const savepoint = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.flatMap(db.inTransaction, (inside) => {
        if (!inside) return db.transaction(effect)
        const name = `pgfiber_sp_${savepoints++}`
        // RELEASE or ROLLBACK TO from the body's Exit, uninterruptibly; a failure of either (the connection was
        // lost) is the transaction's failure, retried with it
        return Effect.uninterruptibleMask((restore) =>
          db.run((sql) => sql.unsafe(`savepoint ${name}`)).pipe(
            Effect.zipRight(Effect.exit(restore(effect))),
            Effect.flatMap((exit) =>
              Exit.isSuccess(exit)
                ? Effect.as(db.run((sql) => sql.unsafe(`release savepoint ${name}`)), exit.value)
                : Effect.zipRight(db.run((sql) => sql.unsafe(`rollback to savepoint ${name}`)), exit)
            )
          )
        )
      })

    const reapExpired = db.transaction(
      Effect.gen(function*() {
        const [lock] = yield* db.run((sql) => JobsSql.tryReaperLock(sql, db.schema))
        if (!lock?.locked) return { requeued: 0, deadLettered: 0, removedCancelled: 0, ran: false }
        const removed = yield* run((sql, at) => JobsSql.removeExpiredCancelled(sql, at, retention))
        // exhausted ones too: their stage's claim dead-letters them, with the stage's onDeadLetter
        const requeued = yield* run((sql, at) => JobsSql.requeueExpired(sql, at, db.schema))
        return { requeued: requeued.length, deadLettered: 0, removedCancelled: removed.length, ran: true }
      })
    ).pipe(Effect.withSpan("Queue.reapExpired"))

    const nextWake = (stages: ReadonlyArray<string>, options?: { readonly seenBy?: string | undefined }) =>
      run((sql, at) => JobsSql.nextWake(sql, at, stages, options?.seenBy ?? null)).pipe(
        Effect.map(([row]) => ({
          jobDueInMs: row?.job_due_in_ms == null ? null : Math.max(0, row.job_due_in_ms),
          dueNow: row?.due_now ?? [],
          leaseExpiresInMs: row?.lease_expires_in_ms == null ? null : Math.max(0, row.lease_expires_in_ms)
        }))
      )

    const cancel = (id: string) =>
      isId(id)
        ? run((sql, at) => JobsSql.cancelJob(sql, at, id, retention)).pipe(
          Effect.map((rows) => {
            const row = rows[0]
            if (row?.outcome === "cancelled" && row.stage !== null && events.active()) {
              events.publish([{ _tag: "Cancelled", jobId: id, stage: row.stage, orgId: row.org_id, attempt: 0, at: new Date() }])
            }
            return (row?.outcome ?? "not-found") as "cancelled" | "cancelling" | "not-found"
          }),
          Effect.withSpan("Queue.cancel")
        )
        : Effect.succeed("not-found" as const)

    const runNow = (id: string) =>
      isId(id)
        ? run((sql, at) => JobsSql.makeDue(sql, at, db.schema, id)).pipe(
          Effect.map(([row]) => (row?.outcome ?? "not-found") as "due" | "not-delayed" | "not-found"),
          Effect.withSpan("Queue.runNow")
        )
        : Effect.succeed("not-found" as const)

    const get = (id: string) =>
      isId(id)
        ? Effect.gen(function*() {
          const [live] = yield* Effect.flatMap(db.run((sql) => JobsSql.selectJob(sql, id)), liveJobs)
          if (live) return live
          const [finished] = yield* Effect.flatMap(db.run((sql) => JobsSql.selectArchivedJob(sql, id)), archivedJobs)
          return finished ?? null
        })
        : Effect.succeed(null)

    const dependencies = (id: string) =>
      isId(id)
        ? Effect.gen(function*() {
          const job = yield* get(id)
          if (job === null) return null
          const rows = yield* db.run((sql) => JobsSql.selectDependencies(sql, id))
          const link = (r: typeof rows[number]): DependencyLink => ({
            id: r.id,
            stage: r.stage,
            status: (r.status as JobStatus | null) ?? null,
            onFailure: policyFromColumn(r.on_failure),
            output: r.status === "completed" ? r.output ?? null : null
          })
          return {
            parents: rows.filter((r) => r.side === "parent").map(link),
            children: rows.filter((r) => r.side === "child").map(link)
          }
        })
        : Effect.succeed(null)

    const batches = {
      create: (o: BatchOptions) =>
        Effect.gen(function*() {
          const callbacks = validateCallbacks(o, validation)
          if (Either.isLeft(callbacks)) return yield* callbacks.left
          const { onComplete, onFailure } = callbacks.right
          const orgId = o.orgId ?? null
          return yield* db.transaction(Effect.gen(function*() {
            const [row] = yield* db.run((sql) =>
              JobsSql.insertBatchRow(sql, orgId, onComplete && JSON.stringify(onComplete), onFailure && JSON.stringify(onFailure))
            )
            const id = row!.id
            const jobs = (o.jobs ?? []).length === 0 ? [] : yield* enqueue((o.jobs ?? []).map((j) => ({ ...j, orgId, batchId: id })))
            // just created in this transaction: it exists
            if (!(o.open ?? false)) yield* Effect.orDie(seal(id))
            return { id, jobs }
          }))
        }).pipe(Effect.withSpan("Queue.batches.create")),
      add: (id: string, jobs: ReadonlyArray<import("./Job.js").NewJob>) => enqueue(jobs.map((j) => ({ ...j, batchId: id }))),
      seal: (id: string) => seal(id),
      get: (id: string) => getBatch(id)
    }
    const getBatch = (id: string) =>
      isId(id) ? db.run((sql) => JobsSql.selectBatch(sql, id)).pipe(Effect.flatMap(batchRows), Effect.map(([batch]) => batch ?? null)) : Effect.succeed(null)
    const seal = (id: string) =>
      db.transaction(Effect.gen(function*() {
        const [sealed] = isId(id) ? yield* run((sql, at) => JobsSql.sealBatch(sql, at, id)) : []
        if (sealed?.finished) yield* run((sql, at) => JobsSql.enqueueFinishedCallbacks(sql, at, id))
        const batch = yield* getBatch(id)
        if (batch === null) return yield* new JobNotFound({ message: `batch ${id} not found` })
        return batch
      }))

    const history = {
      list: (o: import("./Job.js").HistoryListOptions = {}) =>
        db.run((sql) =>
          JobsSql.listArchivedJobs(sql, o.stage ?? null, o.status ?? null, o.beforeId && isId(o.beforeId) ? o.beforeId : null, clampLimit(o.limit, 100))
        ).pipe(Effect.flatMap(archivedJobs)),
      prune: (o: { readonly batch?: number; readonly maxBatches?: number } = {}) =>
        Effect.gen(function*() {
          const batch = Math.max(1, Math.min(o.batch ?? 5000, 100_000))
          const maxBatches = Math.max(1, o.maxBatches ?? 1000)
          let total = 0
          for (let i = 0; i < maxBatches; i++) {
            const [row] = yield* run((sql, at) => JobsSql.pruneArchive(sql, at, batch))
            const n = row?.n ?? 0
            total += n
            if (n < batch) break
          }
          // edges whose dependent has left the history go with it, and uniqueness windows that have passed (not
          // counted: they are not jobs)
          for (let i = 0; i < maxBatches; i++) {
            const [row] = yield* db.run((sql) => JobsSql.pruneDependencies(sql, batch))
            if ((row?.n ?? 0) < batch) break
          }
          for (let i = 0; i < maxBatches; i++) {
            const [row] = yield* run((sql, at) => JobsSql.pruneWindows(sql, at, batch))
            if ((row?.n ?? 0) < batch) break
          }
          return total
        }).pipe(Effect.withSpan("Queue.history.prune"))
    }

    const stageControls = {
      list: db.run((sql) => JobsSql.selectStageControls(sql)).pipe(
        Effect.map((rows) => rows.map((r) => ({ stage: r.stage, paused: r.paused, changedBy: r.changed_by, changedAt: date(r.changed_at) })))
      ),
      setPaused: (stage: string, paused: boolean, by?: string) =>
        run((sql, at) => JobsSql.setStagePaused(sql, at, stage, paused, by ?? null)).pipe(Effect.asVoid),
      purge: (stage: string, by?: string) =>
        run((sql, at) => JobsSql.purgeQueued(sql, at, stage, by ?? "an operator", retention)).pipe(Effect.map(([row]) => row?.n ?? 0))
    }

    const decodeRegistered = Schema.decodeUnknownSync(Schema.Array(Registry.RegisteredRow))
    const registry = {
      register: (presence: Registry.Presence, entries: ReadonlyArray<Registry.StageEntry>) =>
        entries.length === 0 ? Effect.void : run((sql, at) => Registry.register(sql, at, presence, entries)).pipe(Effect.asVoid),
      unregister: (workerId: string, names: ReadonlyArray<string>) =>
        names.length === 0 ? Effect.void : db.run((sql) => Registry.unregister(sql, workerId, names)).pipe(Effect.asVoid),
      list: run((sql, at) => Registry.list(sql, at)).pipe(Effect.map((rows) => decodeRegistered(rows).map(Registry.fromRow)))
    }

    const list = (o: import("./Job.js").ListOptions = {}) =>
      run((sql, at) => {
        const afterId = o.afterId && isId(o.afterId) ? o.afterId : null
        return o.payload === undefined && o.error === undefined
          ? JobsSql.listJobs(sql, o.stage ?? null, o.status ?? null, afterId, clampLimit(o.limit, 100))
          : BulkSql.searchJobs(sql, at, { stage: o.stage, payload: o.payload, error: o.error }, o.status ?? null, afterId, clampLimit(o.limit, 100))
      }).pipe(Effect.flatMap(liveJobs))

    const bulk = {
      preview: (filter: Bulk.JobFilter, action: Bulk.BulkAction) =>
        run((sql, at) => BulkSql.countApplicable(sql, at, filter, action)).pipe(
          Effect.map(([row]) => row?.n ?? 0),
          Effect.withSpan("Queue.bulk.preview", { attributes: { action: action.kind } })
        ),
      apply: (filter: Bulk.JobFilter, action: Bulk.BulkAction, o: Bulk.BulkOptions) =>
        Effect.gen(function*() {
          const batch = Math.max(1, Math.min(o.batch ?? Bulk.defaultBatch, 10_000))
          const pace = Math.max(0, Math.min(o.pace ?? Bulk.defaultPace, 100))
          const [top] = yield* db.run((sql) => BulkSql.maxJobId(sql))
          const maxId = top?.id ?? "0"
          const [counted] = yield* run((sql, at) => BulkSql.countApplicable(sql, at, filter, action))
          const matched = counted?.n ?? 0
          const org = yield* Db.currentOrgId
          // recorded before the first batch, finished after the last: an action cut short (a client gone, the
          // database lost) stays in the record with what it changed, marked interrupted
          const [recorded] = yield* run((sql, at) =>
            BulkSql.insertAction(sql, at, {
              action: action.kind,
              filter: JSON.stringify(Bulk.filterRecord(filter)),
              priority: action.kind === "priority" ? action.priority : null,
              orgId: org._tag === "Some" ? org.value : filter.org ?? null,
              actor: o.actor,
              matched
            })
          )
          const actionId = recorded!.id
          let affected = 0
          let cancelling = 0
          const batches = Effect.gen(function*() {
            // by id, once; again only when it changed fewer than it counted: the rows a claim or a settle held as it passed
            for (let pass = 0; pass < 2 && (pass === 0 || affected < matched); pass++) {
              let after = "0"
              while (true) {
                const [[row], took] = yield* Effect.timed(runWithSettings(BulkSql.batchPlan, (sql, at) =>
                  action.kind === "cancel"
                    ? BulkSql.cancelBatch(sql, at, filter, after, maxId, batch, retention)
                    : BulkSql.updateBatch(sql, at, db.schema, filter, action, after, maxId, batch)
                )).pipe(Effect.map(([d, rows]) => [rows, d] as const))
                if (row === undefined || row.last === null) break
                affected += row.changed
                cancelling += row.marked
                if (row.removed.length > 0 && events.active()) {
                  const at = new Date()
                  events.publish(row.removed.map(([jobId, stage, orgId]) => ({ _tag: "Cancelled" as const, jobId, stage, orgId, attempt: 0, at })))
                }
                after = row.last
                if (pace > 0) yield* Effect.sleep(Duration.times(took, pace))
              }
            }
          })
          yield* batches.pipe(
            Effect.onExit((exit) =>
              run((sql, at) => BulkSql.finishAction(sql, at, actionId, affected, !Exit.isSuccess(exit))).pipe(
                Effect.catchAll((e) => Effect.logWarning("bulk action: its record could not be finished", e.message))
              )
            )
          )
          return { matched, affected, cancelling, actionId }
        }).pipe(Effect.withSpan("Queue.bulk.apply", { attributes: { action: action.kind } })),
      actions: (o: { readonly limit?: number | undefined } = {}) =>
        db.run((sql) => BulkSql.listActions(sql, clampLimit(o.limit, 100))).pipe(
          Effect.map((rows) =>
            rows.map((r): Bulk.ActionRecord => ({
              id: String(r.id),
              action: r.action as Bulk.ActionKind,
              filter: r.filter,
              priority: r.priority == null ? null : Number(r.priority),
              orgId: str(r.org_id),
              actor: String(r.actor),
              matched: Number(r.matched),
              affected: Number(r.affected),
              interrupted: r.interrupted === true,
              startedAt: date(r.started_at),
              finishedAt: r.finished_at ? date(r.finished_at) : null
            }))
          )
        )
    }

    const stats = run((sql, at) => JobsSql.stageStats(sql, at)).pipe(
      Effect.map((rows): ReadonlyArray<StageStats> =>
        rows.map((r) => ({
          stage: r.stage,
          ready: Number(r.ready),
          scheduled: Number(r.scheduled),
          running: Number(r.running),
          cancelling: Number(r.cancelling),
          deadLetters: Number(r.dead_letters),
          oldestReadyAgeMs: Math.round(Number(r.oldest_ready_ms ?? 0)),
          paused: r.paused === true,
          rateLimited: r.rate_limited === true
        }))
      )
    )

    const getDead = (id: string) =>
      isId(id)
        ? db.run((sql) => JobsSql.selectDeadLetter(sql, id)).pipe(Effect.flatMap(deadLetterRows), Effect.map(([dl]) => dl ?? null))
        : Effect.succeed(null)

    const deadLetters = {
      list: (o: import("./Job.js").DeadLetterListOptions = {}) =>
        db.run((sql) =>
          JobsSql.listDeadLetters(sql, o.stage ?? null, o.unresolvedOnly ?? true, o.afterId && isId(o.afterId) ? o.afterId : null, clampLimit(o.limit, 100))
        ).pipe(Effect.flatMap(deadLetterRows)),
      get: getDead,
      retry: (id: string) =>
        db.transaction(
          Effect.gen(function*() {
            const dl = yield* getDead(id)
            if (dl === null) return yield* new JobNotFound({ message: `dead letter ${id} not found` })
            const [created] = yield* enqueue([yield* jobFromDeadLetter(dl)])
            yield* run((sql, at) => JobsSql.markDeadLetterRetried(sql, at, id, created!.id))
            return created!.id
          })
        ).pipe(Effect.withSpan("Queue.deadLetters.retry")),
      resolve: (id: string, notes?: string) =>
        Effect.gen(function*() {
          const rows = isId(id) ? yield* run((sql, at) => JobsSql.markDeadLetterResolved(sql, at, id, notes ?? null)) : []
          if (rows.length !== 1) return yield* new JobNotFound({ message: `dead letter ${id} not found` })
        }),
      purge: (o: { readonly olderThan?: Duration.Duration; readonly includeUnresolved?: boolean } = {}) =>
        run((sql, at) => JobsSql.purgeDeadLetters(sql, at, o.olderThan ? ms(o.olderThan) : null, o.includeUnresolved ?? false)).pipe(
          Effect.map((rows) => rows.length)
        )
    }

    const listen = (wakeups: Wakeups) =>
      db.listen(JobsSql.channel(db.schema), {
        onNotify: (stage) => wakeups.onWake(stage),
        onListening: () => wakeups.onListening(),
        onDown: (reason) => wakeups.onDown?.(reason)
      }).pipe(Effect.map((connection): Queue.Listening => {
        const channel = JobsSql.channel(db.schema)
        // each statement on the LISTEN connection starts with its LISTEN again (a no-op), so that connection still
        // shows as the schema's LISTEN in pg_stat_activity; the lock keys are numbers made here (no input in the text)
        const onListener = (statement: string) =>
          connection.run((sql) => sql.unsafe(`listen "${channel}"; ${statement}`)).pipe(
            Effect.map((results) => Option.getOrElse(decodeListenAndSelect(results), (): Readonly<Record<string, unknown>> => ({})))
          )
        return {
          // session-level locks on the LISTEN connection: lost with it, so a process that dies gives its leads up
          tryLead: (stages) =>
            stages.length === 0 ? Effect.succeed([]) : onListener(`select ${stages.map((s, i) => `pg_try_advisory_lock(${wakeLockKey(db.schema, s)}) as l${i}`).join(", ")}`).pipe(
              Effect.map((row) => stages.filter((_, i) => row[`l${i}`] === true)),
              atEdge("Queue.listen.tryLead")
            ),
          unlead: (stage) => Effect.asVoid(onListener(`select pg_advisory_unlock(${wakeLockKey(db.schema, stage)}) as u`)).pipe(atEdge("Queue.listen.unlead")),
          notify: (topic) => db.run((sql) => sql`select pg_notify(${channel}, ${topic})`).pipe(Effect.asVoid, atEdge("Queue.listen.notify")),
          followEvents: connection.also(JobsSql.eventsChannel(db.schema), (payload) => wakeups.onWake(payload))
        }
      }))

    // the edge: each operation's Db failures become the Queue's own error, named by the operation
    return Queue.Queue.of({
      enqueue: (jobs) => enqueue(jobs).pipe(atEdge("Queue.enqueue")),
      transaction: (effect) => bodyAtEdge("Queue.transaction", db.transaction, effect),
      claim: (stage, limit, o) => claim(stage, limit, o).pipe(atEdge("Queue.claim")),
      claimBatch: (stage, limit, o) => claimBatch(stage, limit, o).pipe(atEdge("Queue.claimBatch")),
      limits: {
        list: limits.list.pipe(atEdge("Queue.limits.list")),
        set: (stage, o) => limits.set(stage, o).pipe(atEdge("Queue.limits.set")),
        clear: (stage) => limits.clear(stage).pipe(atEdge("Queue.limits.clear")),
        changed: limits.changed
      },
      heartbeat: (leases, leaseFor) => heartbeat(leases, leaseFor).pipe(atEdge("Queue.heartbeat")),
      settle: (outcomes, o) => settle(outcomes, o).pipe(atEdge("Queue.settle")),
      savepoint: (effect) => bodyAtEdge("Queue.savepoint", savepoint, effect),
      reapExpired: reapExpired.pipe(atEdge("Queue.reapExpired")),
      nextWake: (stages, o) => nextWake(stages, o).pipe(atEdge("Queue.nextWake")),
      cancel: (id) => cancel(id).pipe(atEdge("Queue.cancel")),
      runNow: (id) => runNow(id).pipe(atEdge("Queue.runNow")),
      get: (id) => get(id).pipe(atEdge("Queue.get")),
      dependencies: (id) => dependencies(id).pipe(atEdge("Queue.dependencies")),
      batches: {
        create: (o) => batches.create(o).pipe(atEdge("Queue.batches.create")),
        add: (id, jobs) => batches.add(id, jobs).pipe(atEdge("Queue.batches.add")),
        seal: (id) => batches.seal(id).pipe(atEdge("Queue.batches.seal")),
        get: (id) => batches.get(id).pipe(atEdge("Queue.batches.get"))
      },
      list: (o) => list(o).pipe(atEdge("Queue.list")),
      stats: stats.pipe(atEdge("Queue.stats")),
      deadLetters: {
        list: (o) => deadLetters.list(o).pipe(atEdge("Queue.deadLetters.list")),
        get: (id) => deadLetters.get(id).pipe(atEdge("Queue.deadLetters.get")),
        retry: (id) => deadLetters.retry(id).pipe(atEdge("Queue.deadLetters.retry")),
        resolve: (id, notes) => deadLetters.resolve(id, notes).pipe(atEdge("Queue.deadLetters.resolve")),
        purge: (o) => deadLetters.purge(o).pipe(atEdge("Queue.deadLetters.purge"))
      },
      history: {
        list: (o) => history.list(o).pipe(atEdge("Queue.history.list")),
        prune: (o) => history.prune(o).pipe(atEdge("Queue.history.prune"))
      },
      stageControls: {
        list: stageControls.list.pipe(atEdge("Queue.stageControls.list")),
        setPaused: (stage, paused, by) => stageControls.setPaused(stage, paused, by).pipe(atEdge("Queue.stageControls.setPaused")),
        purge: (stage, by) => stageControls.purge(stage, by).pipe(atEdge("Queue.stageControls.purge"))
      },
      bulk: {
        preview: (filter, action) => bulk.preview(filter, action).pipe(atEdge("Queue.bulk.preview")),
        apply: (filter, action, o) => bulk.apply(filter, action, o).pipe(atEdge("Queue.bulk.apply")),
        actions: (o) => bulk.actions(o).pipe(atEdge("Queue.bulk.actions"))
      },
      registry: {
        register: (presence, entries) => registry.register(presence, entries).pipe(atEdge("Queue.registry.register")),
        unregister: (workerId, names) => registry.unregister(workerId, names).pipe(atEdge("Queue.registry.unregister")),
        list: registry.list.pipe(atEdge("Queue.registry.list"))
      },
      listen
    })
  })

export const layer = (options: QueueOptions = {}) => Layer.effect(Queue.Queue, make(options))
