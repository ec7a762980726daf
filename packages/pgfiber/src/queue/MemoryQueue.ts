/**
 * The in-memory Queue: the same contract as PgQueue, for unit tests of stages and the runtime. Time comes from
 * Effect's Clock, so `TestClock` drives delays, leases and backoff. Each operation is one synchronous step,
 * which is what makes it atomic here; `transaction` buffers enqueues and applies them (and their wake-ups)
 * only when the transaction's effect succeeds.
 */
import { Clock, Duration, Effect, Either, Exit, FiberRef, Layer, Option } from "effect"
import type { Batch, BatchOptions, Beat, CallbackSpec, DeadLetter, Dependencies, DependencyLink, EnqueueResult, ErrorEntry, Job, Lease, NewJob, OnParentFailure, StageControl, StageStats, ValidJob } from "./Job.js"
import { countEnqueued, defaultMaxPayloadBytes, errorEntry, InvalidJob, jobFromDeadLetter, JobNotFound, parentProblem, validateAll, validateCallbacks } from "./Job.js"
import * as Bulk from "./Bulk.js"
import * as Events from "./Events.js"
import * as Limits from "./Limits.js"
import type * as Registry from "./Registry.js"
import * as Outcome from "./Outcome.js"
import type { Settled } from "./Outcome.js"
import { type ClaimOptions, Queue, type QueueOptions, laterTopic, type Listening, resolveRetention, stageControlsTopic, type Wakeups } from "./Queue.js"

type MutableJob = { -readonly [K in keyof Job]: Job[K] }

interface Pending {
  readonly owner: object
  readonly actions: Array<() => void>
  /** Jobs enqueued in the transaction, not written yet: later enqueues in it may depend on them. */
  readonly rows: Map<string, MutableJob>
}

/** A job that just finished, as what depends on it (dependents, its batch) sees it. */
interface Finished {
  readonly id: string
  readonly fate: "completed" | "dead" | "cancelled"
  readonly reason: string | null
  readonly batchId: string | null
}

/** An edge of the dependency graph: `jobId` waits on `dependsOn`. */
interface Edge {
  readonly jobId: string
  readonly dependsOn: string
  readonly onFailure: OnParentFailure
}

const currentTransaction = FiberRef.unsafeMake<Option.Option<Pending>>(Option.none())

export const make = (options: QueueOptions = {}) =>
  Effect.flatMap(Effect.all([Events.current, resolveRetention(options)]), ([events, retention]) => Effect.sync(() => {
    const owner = {}
    const validation = {
      maxPayloadBytes: options.maxPayloadBytes ?? defaultMaxPayloadBytes,
      knownStages: options.knownStages ? new Set(options.knownStages) : undefined
    }
    const jobs = new Map<string, MutableJob>()
    // the stage registry: stages as declared, and per process and stage when it was last seen
    const registered = new Map<string, Registry.StageEntry & { registeredBy: string; updatedAt: number }>()
    const processes = new Map<string, { workerId: string; stage: string; concurrency: number; sweepMs: number; startedAt: number; lastSeenAt: number }>()
    const dead = new Map<string, { -readonly [K in keyof DeadLetter]: DeadLetter[K] }>()
    const listeners = new Set<Wakeups>()
    let nextId = 1
    let nextDeadId = 1

    // the kept history: finished jobs with the instant their retention passes
    const archive = new Map<string, { job: MutableJob; keepUntil: number }>()
    const controls = new Map<string, { -readonly [K in keyof StageControl]: StageControl[K] }>()
    const retainMs = (stage: string, override?: Duration.Duration) =>
      Math.max(0, Duration.toMillis(override ?? retention.stages?.[stage] ?? retention.default))
    /** Hands a job that left the live table to the history, when its stage keeps any. */
    const keep = (j: MutableJob, status: "completed" | "dead" | "cancelled", now: number, override?: Duration.Duration) => {
      const ms = retainMs(j.stage, override)
      if (ms <= 0) return
      archive.set(j.id, {
        // as jobs_archive keeps them: no lease, no count of parents, no batch
        job: { ...j, status, lockedBy: null, lockedUntil: null, finishedAt: new Date(now), updatedAt: new Date(now), waitingOn: null, batchId: null },
        keepUntil: now + ms
      })
    }

    const wake = (stage: string) => listeners.forEach((l) => l.onWake(stage))
    /** Uniqueness windows taken, `[org, key, window start]` → the window's job (kept: the twin is short-lived). */
    const windows = new Map<string, string>()

    // batches, by id (the table job_batches)
    const batches = new Map<string, { -readonly [K in keyof Batch]: Batch[K] } & { onComplete: CallbackSpec | null; onFailure: CallbackSpec | null }>()
    let nextBatchId = 1
    /** A sealed batch whose jobs have all finished: its callbacks, once (as `enqueue_batch_callbacks`). */
    const finishBatch = (b: typeof batches extends Map<string, infer B> ? B : never, now: number) => {
      b.finishedAt = new Date(now)
      const counts = { id: b.id, total: b.total, completed: b.completed, failed: b.failed }
      const specs = [b.onComplete, b.failed > 0 ? b.onFailure : null].filter((c): c is CallbackSpec => c !== null)
      const valid = validateAll(specs.map((c) => ({
        stage: c.stage,
        orgId: b.orgId,
        payload: { ...(c.payload as object), batch: counts },
        priority: c.priority,
        maxAttempts: c.maxAttempts
      })), { ...validation, knownStages: undefined })
      if (Either.isLeft(valid)) throw new Error(`batch ${b.id} callback rejected: ${valid.left.message}`)
      b.callbacks = insertNow(valid.right, now).map((r) => r.id)
    }
    const countInBatches = (finished: ReadonlyArray<Finished>, now: number) => {
      for (const f of finished) {
        const b = f.batchId === null ? undefined : batches.get(f.batchId)
        if (b === undefined || b.finishedAt !== null) continue
        if (f.fate === "completed") b.completed++
        else b.failed++
        if (b.sealed && b.completed + b.failed >= b.total) finishBatch(b, now)
      }
    }

    // the dependency graph, by both ends (edges stay after both ends finish, as in job_dependencies)
    const edgesByParent = new Map<string, Array<Edge>>()
    const edgesByChild = new Map<string, Array<Edge>>()
    const addEdge = (e: Edge) => {
      if ((edgesByChild.get(e.jobId) ?? []).some((x) => x.dependsOn === e.dependsOn)) return
      edgesByParent.set(e.dependsOn, [...(edgesByParent.get(e.dependsOn) ?? []), e])
      edgesByChild.set(e.jobId, [...(edgesByChild.get(e.jobId) ?? []), e])
    }

    /**
     * What `settle_dependents` (migration 0021) does when parents finish: a completed parent (or a failed one under
     * `continue`) counts down its waiting dependents, the last one queues them; a failed parent cancels or
     * dead-letters them with the reason, and their own dependents settle in turn.
     */
    const settleDependents = (finished: ReadonlyArray<Finished>, now: number): void => {
      countInBatches(finished, now)
      const failed: Array<Finished> = []
      const woken = new Set<string>()
      let later = false
      for (const parent of finished) {
        for (const e of edgesByParent.get(parent.id) ?? []) {
          const j = jobs.get(e.jobId)
          if (j === undefined || j.status !== "waiting") continue
          if (parent.fate === "completed" || e.onFailure === "continue") {
            j.waitingOn = (j.waitingOn ?? 1) - 1
            j.updatedAt = new Date(now)
            if (j.waitingOn <= 0) {
              j.status = "queued"
              j.waitingOn = null
              if (j.availableAt.getTime() < now) j.availableAt = new Date(now)
              woken.add(j.stage)
              if (j.availableAt.getTime() > now) later = true
            }
            continue
          }
          const strictest = (edgesByChild.get(j.id) ?? []).some((x) => x.onFailure === "deadLetter" && finished.some((f) => f.id === x.dependsOn && f.fate !== "completed"))
          const reason = `parent job ${parent.id} was ${parent.fate === "dead" ? "dead-lettered" : "cancelled"}${parent.reason === null ? "" : `: ${parent.reason}`}`.slice(0, 4000)
          jobs.delete(j.id)
          if (strictest || e.onFailure === "deadLetter") {
            moveToDead(j, { ...errorEntry(j.attempts, new Date(now), "ParentFailed", reason), attempt: j.attempts }, now, undefined, false)
            failed.push({ id: j.id, fate: "dead", reason, batchId: j.batchId })
          } else {
            keep({ ...j, lastError: reason, waitingOn: null }, "cancelled", now)
            failed.push({ id: j.id, fate: "cancelled", reason, batchId: j.batchId })
          }
        }
      }
      woken.forEach(wake)
      if (later) wake(laterTopic)
      if (failed.length > 0) settleDependents(failed, now)
    }
    const snapshot = (j: MutableJob): Job => ({ ...j, errors: [...j.errors] })
    const heldBy = (lease: Lease) => {
      const j = jobs.get(lease.id)
      return j !== undefined && j.lease === lease.lease ? j : undefined
    }

    /** Dedupe against live jobs, then reserve ids; `write` makes the rows appear (or updates) and wakes their stages. */
    const prepareInsert = (valid: ReadonlyArray<ValidJob>, now: number, tx?: Pending): Either.Either<{ results: Array<EnqueueResult>; write: () => void }, InvalidJob> => {
      const results: Array<EnqueueResult> = []
      // batches: open, and of the job's org (another org's is not found, as in PgQueue)
      for (const [i, v] of valid.entries()) {
        if (v.batchId === null) continue
        const b = batches.get(v.batchId)
        const at = valid.length > 1 ? `job ${i}: ` : ""
        if (b === undefined || b.orgId !== v.orgId) return Either.left(new InvalidJob({ field: "batchId", message: `${at}batch ${v.batchId} not found` }))
        if (b.sealed) return Either.left(new InvalidJob({ field: "batchId", message: `${at}batch ${v.batchId} is sealed` }))
      }
      // parents: live (or enqueued earlier in this transaction), else finished in the history, in the job's org
      const waiting: Array<number> = []
      for (let i = 0; i < valid.length; i++) {
        let n = 0
        for (const dep of valid[i]!.dependsOn) {
          const live = jobs.get(dep.id) ?? tx?.rows.get(dep.id)
          const finished = archive.get(dep.id)?.job
          const problem = parentProblem(valid[i]!, dep, live && { orgId: live.orgId }, finished && { org_id: finished.orgId, status: finished.status }, valid.length > 1 ? i : undefined)
          if (problem !== undefined) return Either.left(problem)
          if (live) n++
        }
        waiting.push(n)
      }
      const edges: Array<Edge> = []
      // uniqueness windows (`uniqueFor`): aligned periods of the clock; a taken one returns its job
      const claimedWindows = new Map<string, string>()
      const windowOf = (v: ValidJob) =>
        v.uniqueForMs === null ? null : JSON.stringify([v.orgId, v.dedupeKey, Math.floor(now / v.uniqueForMs) * v.uniqueForMs])
      const rows = new Map<string, MutableJob>()
      // duplicates that update a live, still queued job (`replace`, `debounce`), applied at write time
      const updates = new Map<string, ValidJob>()
      const seen = new Map<string, string>()
      const availableAt = (v: ValidJob) => v.runAt ?? new Date(now + v.delayMs)
      for (const [index, v] of valid.entries()) {
        const window = windowOf(v)
        const windowJob = window === null ? undefined : claimedWindows.get(window) ?? windows.get(window)
        if (windowJob !== undefined) {
          results.push({ id: windowJob, deduped: true })
          continue
        }
        // dedupe keys are per org (jobs with no org share a space of their own), as in Postgres's jobs_dedupe
        const scoped = v.dedupeKey === null ? null : JSON.stringify([v.orgId, v.dedupeKey])
        const existing = scoped === null
          ? undefined
          : seen.get(scoped) ??
            [...jobs.values()].find((j) => j.dedupeKey === v.dedupeKey && j.orgId === v.orgId)?.id
        if (existing !== undefined) {
          if (window !== null) claimedWindows.set(window, existing)
          results.push({ id: existing, deduped: true })
          if (v.dedupeMode !== "first") {
            const pending = rows.get(existing)
            // a duplicate within the batch: the newest enqueue wins, as it would against a live row
            if (pending) {
              pending.payload = v.payload
              pending.priority = v.priority
              pending.availableAt = v.dedupeMode === "debounce" && pending.availableAt > availableAt(v) ? pending.availableAt : availableAt(v)
            } else updates.set(existing, v)
          }
          continue
        }
        const id = String(nextId++)
        if (scoped !== null) seen.set(scoped, id)
        if (window !== null) claimedWindows.set(window, id)
        rows.set(id, {
          id,
          stage: v.stage,
          orgId: v.orgId,
          subjectId: v.subjectId,
          payload: v.payload,
          priority: v.priority,
          status: waiting[index]! > 0 ? "waiting" : "queued",
          attempts: 0,
          maxAttempts: v.maxAttempts,
          polls: 0,
          availableAt: availableAt(v),
          lockedBy: null,
          lockedUntil: null,
          lease: 0,
          dedupeKey: v.dedupeKey,
          errors: [],
          lastError: null,
          createdAt: new Date(now),
          updatedAt: new Date(now),
          startedAt: null,
          finishedAt: null,
          lastRunMs: null,
          output: null,
          progress: null,
          progressMessage: null,
          timeoutMs: v.timeoutMs,
          waitingOn: waiting[index]! > 0 ? waiting[index]! : null,
          batchId: v.batchId
        })
        for (const dep of v.dependsOn) edges.push({ jobId: id, dependsOn: dep.id, onFailure: dep.onFailure })
        results.push({ id, deduped: false })
      }
      if (tx?.rows) rows.forEach((row, id) => tx.rows.set(id, row))
      const write = () => {
        rows.forEach((row) => {
          jobs.set(row.id, row)
          if (row.batchId !== null) batches.get(row.batchId)!.total++
        })
        edges.forEach(addEdge)
        claimedWindows.forEach((id, window) => windows.set(window, id))
        const ready = [...rows.values()].filter((r) => r.status === "queued")
        const woken = new Set(ready.map((r) => r.stage))
        let later = ready.some((r) => r.availableAt.getTime() > now)
        updates.forEach((v, id) => {
          const j = jobs.get(id)
          if (j === undefined || j.status !== "queued") return
          j.payload = v.payload
          j.priority = v.priority
          const at = availableAt(v)
          j.availableAt = v.dedupeMode === "debounce" && j.availableAt > at ? j.availableAt : at
          j.updatedAt = new Date(now)
          woken.add(j.stage)
          if (j.availableAt.getTime() > now) later = true
        })
        woken.forEach(wake)
        // as the insert trigger does: jobs not due yet ask the Wakers to re-arm their timers
        if (later) wake(laterTopic)
      }
      return Either.right({ results, write })
    }

    /** A follow-up whose parents are not found is a defect, as in PgQueue (it cannot be known before the write). */
    const insertNow = (valid: ReadonlyArray<ValidJob>, now: number) => {
      const prepared = prepareInsert(valid, now)
      if (Either.isLeft(prepared)) throw new Error(`follow-up rejected: ${prepared.left.message}`)
      prepared.right.write()
      return prepared.right.results
    }

    const inTransaction = Effect.map(FiberRef.get(currentTransaction), (tx) =>
      Option.isSome(tx) && tx.value.owner === owner ? tx.value : undefined
    )

    const enqueueValid = (valid: ReadonlyArray<ValidJob>) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.flatMap(inTransaction, (tx) =>
          Effect.suspend(() => {
            const prepared = prepareInsert(valid, now, tx)
            if (Either.isLeft(prepared)) return Effect.fail(prepared.left)
            const { results, write } = prepared.right
            // inside a transaction the rows appear (and wake workers) only at commit
            if (tx === undefined) write()
            else tx.actions.push(write)
            return Effect.succeed(results)
          })))

    const enqueue = (newJobs: ReadonlyArray<NewJob>) => {
      const valid = validateAll(newJobs, validation.knownStages === undefined || registered.size === 0
        ? validation
        : { ...validation, knownStages: new Set([...validation.knownStages, ...registered.keys()]) })
      return Either.isLeft(valid)
        ? Effect.fail(valid.left)
        : Effect.tap(
          events.holding(Effect.tap(enqueueValid(valid.right), (results) =>
            Effect.sync(() => events.active() && events.publish(Events.enqueued(valid.right, results))))),
          (results) => countEnqueued(valid.right, results)
        )
    }

    const transaction = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.flatMap(inTransaction, (tx) => {
        if (tx !== undefined) return effect
        const pending: Pending = { owner, actions: [], rows: new Map() }
        return Effect.locally(effect, currentTransaction, Option.some(pending)).pipe(
          Effect.onExit((exit) => Effect.sync(() => Exit.isSuccess(exit) && pending.actions.forEach((a) => a())))
        )
      })

    const overrides = new Map<string, Limits.Override>()
    /** Where each stage's next fair claim starts its walk over orgs (PgQueue keeps one per process). */
    const cursors = new Map<string, string>()
    /** Token buckets by `stage|org` (org '' for the stage's own), as in the rate_buckets table. */
    const buckets = new Map<string, { tokens: number; refilledAt: number; nextTokenAt: number | null }>()
    const orgKey = (j: MutableJob) => j.orgId ?? ""
    const byAge = (a: MutableJob, b: MutableJob) => a.availableAt.getTime() - b.availableAt.getTime() || Number(a.id) - Number(b.id)
    const byClaimOrder = (a: MutableJob, b: MutableJob) => a.priority - b.priority || byAge(a, b)

    /** The same semantics as JobsSql.claimShares; one synchronous step, so no lock is needed. */
    const claimBatch = (stage: string, limit: number, o: ClaimOptions) =>
      Effect.map(Clock.currentTimeMillis, (now): Limits.ClaimResult<Job> => {
        if (limit <= 0 || controls.get(stage)?.paused) return { jobs: [], rateLimitedForMs: null, capped: false }
        const s = Limits.applyOverride(o.shares ?? Limits.defaultShares, overrides.get(stage))
        const ready = [...jobs.values()]
          .filter((j) => j.stage === stage && j.status === "queued" && j.availableAt.getTime() <= now)
          .sort(byClaimOrder)
        const rate = s.rate
        const tokensIn = (key: string) => {
          const b = buckets.get(`${stage}|${key}`)
          if (!rate) return Infinity
          return b === undefined ? rate.burst : Math.min(rate.burst, b.tokens + Math.max(0, now - b.refilledAt) * rate.limit / rate.perMs)
        }
        const runningBy = new Map<string, number>()
        let runningTotal = 0
        for (const j of jobs.values()) {
          if (j.stage !== stage || j.status === "queued" || j.status === "waiting") continue
          runningTotal++
          runningBy.set(orgKey(j), (runningBy.get(orgKey(j)) ?? 0) + 1)
        }
        const room = Math.min(
          limit,
          s.maxRunning === null ? limit : Math.max(0, s.maxRunning - runningTotal),
          rate && !rate.perOrg ? Math.floor(tokensIn("")) : limit
        )
        let picked: Array<MutableJob>
        const heads: Array<string> = []
        if (s.fair || s.maxRunningPerOrg !== null || (rate?.perOrg ?? false)) {
          // the orgs with queued jobs at the most urgent ready priority, in org order from after the cursor,
          // wrapping, at most `limit` of them: what the loose index scan visits
          const prio = ready[0]?.priority
          const queuedOrgs = [...new Set([...jobs.values()]
            .filter((j) => j.stage === stage && j.status === "queued" && j.priority === prio)
            .map(orgKey))].sort()
          const cursor = cursors.get(stage)
          const after = cursor === undefined ? queuedOrgs : queuedOrgs.filter((org) => org > cursor)
          const wrapped = cursor === undefined ? [] : queuedOrgs.filter((org) => org <= cursor)
          const visited = [...after, ...wrapped].slice(0, limit)
          if (visited.length > 0) cursors.set(stage, visited[visited.length - 1]!)
          heads.push(...visited)
          const readyOf = (org: string) => ready.filter((j) => j.priority === prio && orgKey(j) === org)
          const ranked: Array<{ job: MutableJob; rank: number }> = []
          const offers: Array<{ list: Array<MutableJob>; offer: number; room: number }> = []
          for (const org of visited) {
            const room = Math.min(
              limit,
              s.maxRunningPerOrg === null ? limit : Math.max(0, s.maxRunningPerOrg - (runningBy.get(org) ?? 0)),
              rate?.perOrg ? Math.floor(tokensIn(org)) : limit
            )
            const offer = Math.min(room, s.fair ? Math.ceil(limit / visited.length) : limit)
            offers.push({ list: readyOf(org), offer, room })
          }
          for (const { list, offer } of offers) list.slice(0, offer).forEach((job, i) => ranked.push({ job, rank: i + 1 }))
          // the orgs that filled their share make up for those that could not, up to the shortfall each
          const shortfall = limit - ranked.length
          if (shortfall > 0) {
            for (const { list, offer, room } of offers) {
              if (offer >= room || list.length < offer) continue
              list.slice(offer, offer + Math.min(room - offer, shortfall)).forEach((job, i) => ranked.push({ job, rank: offer + i + 1 }))
            }
          }
          // still short: the next priorities, in age order (not while caps or buckets are per org)
          const perOrgLimits = s.maxRunningPerOrg !== null || (rate?.perOrg ?? false)
          if (!perOrgLimits && ranked.length < limit) {
            ready.filter((j) => j.priority > prio!).slice(0, limit - ranked.length).forEach((job) => ranked.push({ job, rank: 0 }))
          }
          picked = ranked
            .sort((a, b) => a.job.priority - b.job.priority || (s.fair ? a.rank - b.rank : 0) || byAge(a.job, b.job))
            .slice(0, room)
            .map((r) => r.job)
        } else {
          picked = ready.slice(0, room)
        }
        const claimed = picked.map((j) => {
          j.status = "running"
          j.lockedBy = o.workerId
          j.lockedUntil = new Date(now + Duration.toMillis(o.leaseFor))
          j.lease += 1
          j.updatedAt = new Date(now)
          j.startedAt ??= new Date(now)
          return snapshot(j)
        })
        let rateLimitedForMs: number | null = null
        if (rate) {
          const spent = new Map<string, number>()
          for (const j of claimed) {
            const key = rate.perOrg ? j.orgId ?? "" : ""
            spent.set(key, (spent.get(key) ?? 0) + 1)
          }
          for (const [key, n] of spent) {
            const tokens = tokensIn(key) - n
            const refilledAt = Math.max(now, buckets.get(`${stage}|${key}`)?.refilledAt ?? now)
            buckets.set(`${stage}|${key}`, { tokens, refilledAt, nextTokenAt: tokens < 1 ? refilledAt + (1 - tokens) * rate.perMs / rate.limit : null })
          }
          const least = Math.min(...(rate.perOrg ? heads : [""]).map(tokensIn))
          if (claimed.length < limit && ready.length > 0 && least < 1) {
            rateLimitedForMs = Math.max(1, Math.ceil((1 - least) * rate.perMs / rate.limit))
          }
        }
        const capped = (s.maxRunning !== null || s.maxRunningPerOrg !== null) && claimed.length < limit && ready.length > 0
        return { jobs: claimed, rateLimitedForMs, capped }
      })

    const claim = (stage: string, limit: number, o: ClaimOptions) => Effect.map(claimBatch(stage, limit, o), (r) => r.jobs)

    const limits = {
      list: Effect.sync(() => new Map(overrides) as ReadonlyMap<string, Limits.Override>),
      set: (stage: string, o: Partial<Limits.Override>) =>
        Effect.sync(() => {
          const was = overrides.get(stage) ?? Limits.emptyOverride
          // each field given (not null) replaces the stage's; the others stay as they were
          const merged: Limits.Override = {
            fair: o.fair ?? was.fair,
            maxRunning: o.maxRunning ?? was.maxRunning,
            maxRunningPerOrg: o.maxRunningPerOrg ?? was.maxRunningPerOrg,
            rateLimit: o.rateLimit ?? was.rateLimit,
            ratePerMs: o.ratePerMs ?? was.ratePerMs,
            rateBurst: o.rateBurst ?? was.rateBurst,
            ratePerOrg: o.ratePerOrg ?? was.ratePerOrg
          }
          overrides.set(stage, merged)
          return merged
        }),
      clear: (stage: string) =>
        Effect.sync(() => {
          for (const key of [...buckets.keys()]) if (key.startsWith(`${stage}|`)) buckets.delete(key)
          return overrides.delete(stage)
        }),
      // one process's memory: every claim reads the overrides as they are
      changed: () => undefined
    }

    const heartbeat = (leases: ReadonlyArray<Beat>, leaseFor: Duration.Duration) =>
      Effect.map(Clock.currentTimeMillis, (now) =>
        leases.flatMap((l) => {
          const j = heldBy(l)
          if (!j || j.status !== "running") return []
          j.lockedUntil = new Date(now + Duration.toMillis(leaseFor))
          if (l.reported !== undefined) {
            j.progress = l.reported.value
            j.progressMessage = l.reported.message
          }
          return [j.id]
        }))

    const moveToDead = (j: MutableJob, entry: ErrorEntry, now: number, retain?: Duration.Duration, ran = true) => {
      jobs.delete(j.id)
      // claimed with its attempts already spent (the reaper recorded the last one): count and history as is; a
      // dependent dead-lettered for its parent never ran, so spent none
      const spent = !ran || j.attempts >= j.maxAttempts
      keep({
        ...j,
        attempts: spent ? j.attempts : j.attempts + 1,
        errors: spent ? j.errors : [...j.errors, entry],
        lastError: entry.message
      }, "dead", now, retain)
      const id = String(nextDeadId++)
      dead.set(id, {
        id,
        jobId: j.id,
        stage: j.stage,
        orgId: j.orgId,
        subjectId: j.subjectId,
        payload: j.payload,
        priority: j.priority,
        attempts: spent ? j.attempts : j.attempts + 1,
        maxAttempts: j.maxAttempts,
        dedupeKey: j.dedupeKey,
        reason: entry.message,
        errorHistory: spent ? j.errors : [...j.errors, entry],
        jobCreatedAt: j.createdAt,
        deadAt: new Date(now),
        resolutionStatus: null,
        resolutionNotes: null,
        resolvedAt: null,
        retriedJobId: null
      })
      if (ran) settleDependents([{ id: j.id, fate: "dead", reason: entry.message, batchId: j.batchId }], now)
    }

    /** One outcome, applied at once; each call is one synchronous step, so a batch is atomic here too. */
    const settleOne = (o: Outcome.Outcome, followUps: ReadonlyArray<ValidJob> | undefined, invalid: string | undefined, now: number, retain: Duration.Duration | undefined): { settled: Settled; reason?: string; enqueued?: ReadonlyArray<EnqueueResult> } => {
      const j = heldBy(o.lease)
      if (!j || j.status === "queued" || j.status === "waiting") return { settled: "fenced" }
      if (o.runMs !== undefined) j.lastRunMs = o.runMs
      if (o.progress !== undefined) {
        j.progress = o.progress.value
        j.progressMessage = o.progress.message
      }
      if (o._tag === "Complete" && invalid === undefined) {
        jobs.delete(j.id)
        keep({ ...j, output: o.output === undefined ? null : JSON.parse(JSON.stringify(o.output)) }, "completed", now, retain)
        settleDependents([{ id: j.id, fate: "completed", reason: null, batchId: j.batchId }], now)
        return followUps ? { settled: "completed", enqueued: insertNow(followUps, now) } : { settled: "completed" }
      }
      if (j.status === "cancelled") {
        jobs.delete(j.id)
        keep(j, "cancelled", now, retain)
        settleDependents([{ id: j.id, fate: "cancelled", reason: null, batchId: j.batchId }], now)
        return { settled: "released" }
      }
      const requeue = (delay: Duration.Duration) => {
        j.status = "queued"
        j.availableAt = new Date(now + Duration.toMillis(delay))
        j.lockedBy = null
        j.lockedUntil = null
        j.updatedAt = new Date(now)
        if (Duration.toMillis(delay) <= 0) wake(j.stage)
        else wake(laterTopic)
      }
      switch (o._tag) {
        case "Complete":
        case "DeadLetter": {
          const error = o._tag === "DeadLetter" ? o.error : { tag: "InvalidFollowUp", message: invalid! }
          const entry = errorEntry(j.attempts + 1, new Date(now), error.tag, error.message, j.lockedBy)
          moveToDead(j, entry, now, retain)
          return { settled: "deadLettered", reason: entry.message }
        }
        case "Retry": {
          const entry = errorEntry(j.attempts + 1, new Date(now), o.error.tag, o.error.message, j.lockedBy)
          if (j.attempts + 1 >= j.maxAttempts) {
            moveToDead(j, entry, now, retain)
            return { settled: "deadLettered", reason: entry.message }
          }
          j.attempts += 1
          j.lastError = o.error.message
          j.errors = [...j.errors, entry]
          requeue(o.delay)
          return { settled: "retried" }
        }
        case "Reschedule":
          j.polls += 1
          requeue(o.delay)
          return { settled: "rescheduled" }
        case "Release":
          requeue(Duration.zero)
          return { settled: "released" }
      }
    }

    // a follow-up is stored before its Enqueued is published: a pool's Started for it waits in the bus (Events.holding)
    const settle = (outcomes: ReadonlyArray<Outcome.Outcome>, settleOptions: Outcome.SettleOptions = {}) =>
      events.holding(Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const prepared = outcomes.map((o) => {
          if (o._tag !== "Complete" || o.followUps.length === 0) return { followUps: undefined, invalid: undefined }
          const valid = validateAll(o.followUps, validation)
          return Either.isLeft(valid)
            ? { followUps: undefined, invalid: `follow-up rejected: ${valid.left.message}` }
            : { followUps: valid.right, invalid: undefined }
        })
        const jobStages = new Map(outcomes.map((o) => [o.lease.id, jobs.get(o.lease.id)?.stage] as const))
        const done = outcomes.map((o, i) => settleOne(o, prepared[i]!.followUps, prepared[i]!.invalid, now, settleOptions.retain))
        for (let i = 0; i < done.length; i++) {
          if (done[i]!.enqueued) {
            yield* countEnqueued(prepared[i]!.followUps!, done[i]!.enqueued!)
            if (events.active()) events.publish(Events.enqueued(prepared[i]!.followUps!, done[i]!.enqueued!))
          }
        }
        const dead = done.flatMap((d, index): Array<Outcome.DeadLettered> =>
          d.settled === "deadLettered" ? [{ index, reason: d.reason ?? "", exhausted: outcomes[index]!._tag === "Retry" }] : []
        )
        if (dead.length > 0 && settleOptions.onDeadLettered) yield* transaction(settleOptions.onDeadLettered(dead))
        if (settleOptions.wakeFreed) new Set(outcomes.map((o) => jobStages.get(o.lease.id))).forEach((stage) => stage && wake(stage))
        return done.map((d) => d.settled) as ReadonlyArray<Settled>
      }))

    const savepoint = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.flatMap(inTransaction, (tx) => {
        if (tx === undefined) return transaction(effect)
        // a nested buffer: its enqueues join the outer transaction only when the effect succeeds
        const nested: Pending = { owner, actions: [], rows: tx.rows }
        return Effect.locally(effect, currentTransaction, Option.some(nested)).pipe(
          Effect.tap(() => Effect.sync(() => tx.actions.push(...nested.actions)))
        )
      })

    const reapExpired = Effect.map(Clock.currentTimeMillis, (now) => {
      let requeued = 0
      const deadLettered = 0
      let removedCancelled = 0
      const stages = new Set<string>()
      for (const j of [...jobs.values()]) {
        if (j.status === "queued" || j.status === "waiting" || j.lockedUntil === null || j.lockedUntil.getTime() >= now) continue
        if (j.status === "cancelled") {
          jobs.delete(j.id)
          settleDependents([{ id: j.id, fate: "cancelled", reason: null, batchId: j.batchId }], now)
          removedCancelled++
          continue
        }
        // the last attempt's job is requeued too: its stage's claim dead-letters it (see Queue.reapExpired)
        const message = `lease expired: the worker ${j.lockedBy ?? "?"} stopped heartbeating`
        const entry = errorEntry(j.attempts + 1, new Date(now), "LeaseExpired", message, j.lockedBy)
        j.attempts += 1
        j.status = "queued"
        j.availableAt = new Date(now)
        j.lockedBy = null
        j.lockedUntil = null
        j.lastError = message
        j.errors = [...j.errors, entry]
        stages.add(j.stage)
        requeued++
      }
      stages.forEach(wake)
      return { requeued, deadLettered, removedCancelled, ran: true }
    })

    const registry = {
      register: (presence: Registry.Presence, entries: ReadonlyArray<Registry.StageEntry>) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          for (const e of entries) {
            registered.set(e.name, { ...e, registeredBy: presence.workerId, updatedAt: now })
            const key = `${presence.workerId}\u0000${e.name}`
            const was = processes.get(key)
            processes.set(key, {
              workerId: presence.workerId, stage: e.name, concurrency: e.concurrency, sweepMs: presence.sweepMs,
              startedAt: was?.startedAt ?? now, lastSeenAt: now
            })
          }
        }),
      unregister: (workerId: string, names: ReadonlyArray<string>) =>
        Effect.sync(() => names.forEach((n) => processes.delete(`${workerId}\u0000${n}`))),
      list: Effect.map(Clock.currentTimeMillis, (now): ReadonlyArray<Registry.RegisteredStage> =>
        [...registered.values()].sort((a, b) => (a.name < b.name ? -1 : 1)).map(({ updatedAt, ...e }) => ({
          ...e,
          updatedAt: new Date(updatedAt),
          processes: [...processes.values()].filter((p) => p.stage === e.name).sort((a, b) => (a.workerId < b.workerId ? -1 : 1))
            .map((p) => ({
              workerId: p.workerId,
              concurrency: p.concurrency,
              startedAt: new Date(p.startedAt),
              lastSeenAt: new Date(p.lastSeenAt),
              live: p.lastSeenAt > now - 3 * p.sweepMs
            }))
        })))
    }

    const nextWake = (stages: ReadonlyArray<string>, options?: { readonly seenBy?: string | undefined }) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        if (options?.seenBy !== undefined) {
          for (const p of processes.values()) if (p.workerId === options.seenBy) p.lastSeenAt = now
        }
        let due: number | null = null
        let lease: number | null = null
        const dueNow = new Set<string>()
        for (const j of jobs.values()) {
          if (j.status === "queued") {
            if (!stages.includes(j.stage)) continue
            due = Math.min(due ?? Infinity, j.availableAt.getTime())
            if (j.availableAt.getTime() <= now) dueNow.add(j.stage)
          } else if (j.lockedUntil !== null) {
            lease = Math.min(lease ?? Infinity, j.lockedUntil.getTime())
          }
        }
        return {
          jobDueInMs: due === null ? null : Math.max(0, due - now),
          dueNow: [...dueNow],
          leaseExpiresInMs: lease === null ? null : Math.max(0, lease - now)
        }
      })

    const cancel = (id: string) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const j = jobs.get(id)
        if (!j) return "not-found" as const
        if (j.status === "queued" || j.status === "waiting") {
          jobs.delete(id)
          keep({ ...j, waitingOn: null }, "cancelled", now)
          settleDependents([{ id, fate: "cancelled", reason: null, batchId: j.batchId }], now)
          if (events.active()) events.publish([{ _tag: "Cancelled", jobId: id, stage: j.stage, orgId: j.orgId, attempt: 0, at: new Date() }])
          return "cancelled" as const
        }
        j.status = "cancelled"
        return "cancelling" as const
      })

    const runNow = (id: string) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const j = jobs.get(id)
        if (!j) return "not-found" as const
        if (j.status !== "queued" || j.availableAt.getTime() <= now) return "not-delayed" as const
        j.availableAt = new Date(now)
        j.updatedAt = new Date(now)
        wake(j.stage)
        return "due" as const
      })

    const get = (id: string) =>
      Effect.sync(() => {
        const live = jobs.get(id)
        if (live) return snapshot(live)
        const finished = archive.get(id)
        return finished ? snapshot(finished.job) : null
      })

    const dependencies = (id: string) =>
      Effect.sync((): Dependencies | null => {
        if (!jobs.has(id) && !archive.has(id)) return null
        const link = (other: string, onFailure: OnParentFailure): DependencyLink => {
          const j = jobs.get(other) ?? archive.get(other)?.job
          return { id: other, stage: j?.stage ?? null, status: j?.status ?? null, onFailure, output: j?.status === "completed" ? j.output : null }
        }
        const byId = (a: DependencyLink, b: DependencyLink) => Number(a.id) - Number(b.id)
        return {
          parents: (edgesByChild.get(id) ?? []).map((e) => link(e.dependsOn, e.onFailure)).sort(byId),
          children: (edgesByParent.get(id) ?? []).map((e) => link(e.jobId, e.onFailure)).sort(byId)
        }
      })

    const batchView = (b: typeof batches extends Map<string, infer B> ? B : never): Batch => ({
      id: b.id, orgId: b.orgId, total: b.total, completed: b.completed, failed: b.failed, sealed: b.sealed,
      finishedAt: b.finishedAt, callbacks: [...b.callbacks]
    })
    const seal = (id: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const b = batches.get(id)
        if (b === undefined) return Effect.fail(new JobNotFound({ message: `batch ${id} not found` }))
        if (!b.sealed) {
          b.sealed = true
          if (b.completed + b.failed >= b.total) finishBatch(b, now)
        }
        return Effect.succeed(batchView(b))
      })
    const batchesApi = {
      create: (o: BatchOptions) =>
        Effect.gen(function*() {
          const callbacks = validateCallbacks(o, validation)
          if (Either.isLeft(callbacks)) return yield* callbacks.left
          const id = String(nextBatchId++)
          const orgId = o.orgId ?? null
          batches.set(id, {
            id, orgId, total: 0, completed: 0, failed: 0, sealed: false, finishedAt: null, callbacks: [],
            onComplete: callbacks.right.onComplete, onFailure: callbacks.right.onFailure
          })
          const created = (o.jobs ?? []).length === 0 ? [] : yield* transaction(enqueue((o.jobs ?? []).map((j) => ({ ...j, orgId, batchId: id }))))
          if (!(o.open ?? false)) yield* Effect.orDie(seal(id))
          return { id, jobs: created }
        }),
      add: (id: string, newJobs: ReadonlyArray<NewJob>) => enqueue(newJobs.map((j) => ({ ...j, batchId: id }))),
      seal,
      get: (id: string) => Effect.sync(() => {
        const b = batches.get(id)
        return b === undefined ? null : batchView(b)
      })
    }

    const history = {
      list: (o: import("./Job.js").HistoryListOptions = {}) =>
        Effect.sync(() =>
          [...archive.values()].map((a) => a.job)
            .filter((j) => (o.stage === undefined || j.stage === o.stage) && (o.status === undefined || j.status === o.status))
            .filter((j) => o.beforeId === undefined || Number(j.id) < Number(o.beforeId))
            .sort((a, b) => Number(b.id) - Number(a.id))
            .slice(0, Math.max(1, Math.min(o.limit ?? 100, 10_000)))
            .map(snapshot)
        ),
      prune: (o: { readonly batch?: number; readonly maxBatches?: number } = {}) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          const most = Math.max(1, o.batch ?? 5000) * Math.max(1, o.maxBatches ?? 1000)
          const due = [...archive.entries()].filter(([, a]) => a.keepUntil <= now)
            .sort(([, a], [, b]) => a.keepUntil - b.keepUntil)
            .slice(0, most)
          for (const [id] of due) archive.delete(id)
          return due.length
        })
    }

    const stageControls = {
      list: Effect.sync(() => [...controls.values()].map((c) => ({ ...c })).sort((a, b) => (a.stage < b.stage ? -1 : 1))),
      setPaused: (stage: string, paused: boolean, by?: string) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          controls.set(stage, { stage, paused, changedBy: by ?? null, changedAt: new Date(now) })
          wake(stageControlsTopic)
        }),
      purge: (stage: string, by?: string) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          let n = 0
          for (const j of [...jobs.values()]) {
            if (j.stage === stage && j.status === "queued") {
              jobs.delete(j.id)
              // the stage's retention here, else as its worker registered it (as PgQueue's purge)
              const registeredMs = retention.stages?.[stage] === undefined ? registered.get(stage)?.retainMs ?? null : null
              keep({ ...j, lastError: `purged by ${by ?? "an operator"}` }, "cancelled", now, registeredMs === null ? undefined : Duration.millis(registeredMs))
              settleDependents([{ id: j.id, fate: "cancelled", reason: "purged", batchId: j.batchId }], now)
              n++
            }
          }
          return n
        })
    }

    const list = (o: import("./Job.js").ListOptions = {}) =>
      Effect.map(Clock.currentTimeMillis, (now) =>
        [...jobs.values()]
          .filter((j) => (o.stage === undefined || j.stage === o.stage) && (o.status === undefined || j.status === o.status))
          .filter((j) => Bulk.matches({ payload: o.payload, error: o.error }, j, now))
          .filter((j) => o.afterId === undefined || Number(j.id) > Number(o.afterId))
          .sort((a, b) => Number(a.id) - Number(b.id))
          .slice(0, Math.max(1, Math.min(o.limit ?? 100, 10_000)))
          .map(snapshot)
      )

    const stats = Effect.map(Clock.currentTimeMillis, (now): ReadonlyArray<StageStats> => {
      const by = new Map<string, { -readonly [K in keyof StageStats]: StageStats[K] }>()
      const row = (stage: string) => {
        if (!by.has(stage)) {
          by.set(stage, { stage, ready: 0, scheduled: 0, running: 0, cancelling: 0, deadLetters: 0, oldestReadyAgeMs: 0, paused: controls.get(stage)?.paused ?? false, rateLimited: false })
        }
        return by.get(stage)!
      }
      for (const j of jobs.values()) {
        const r = row(j.stage)
        if (j.status === "waiting") continue
        if (j.status === "running") r.running++
        else if (j.status === "cancelled") r.cancelling++
        else if (j.availableAt.getTime() <= now) {
          r.ready++
          r.oldestReadyAgeMs = Math.max(r.oldestReadyAgeMs, now - j.availableAt.getTime())
        } else r.scheduled++
      }
      for (const d of dead.values()) if (d.resolutionStatus === null) row(d.stage).deadLetters++
      for (const c of controls.values()) if (c.paused) row(c.stage)
      for (const [key, b] of buckets) {
        const r = by.get(key.slice(0, key.indexOf("|")))
        if (r && r.ready > 0 && b.nextTokenAt !== null && b.nextTokenAt > now) r.rateLimited = true
      }
      return [...by.values()].sort((a, b) => a.stage.localeCompare(b.stage))
    })

    const deadLetters = {
      list: (o: import("./Job.js").DeadLetterListOptions = {}) =>
        Effect.sync(() =>
          [...dead.values()]
            .filter((d) => (o.stage === undefined || d.stage === o.stage) && (!(o.unresolvedOnly ?? true) || d.resolutionStatus === null))
            .filter((d) => o.afterId === undefined || Number(d.id) > Number(o.afterId))
            .slice(0, Math.max(1, Math.min(o.limit ?? 100, 10_000)))
            .map((d) => ({ ...d }))
        ),
      get: (id: string) => Effect.sync(() => (dead.has(id) ? { ...dead.get(id)! } : null)),
      retry: (id: string) =>
        Effect.gen(function*() {
          const d = dead.get(id)
          if (!d) return yield* new JobNotFound({ message: `dead letter ${id} not found` })
          const [created] = yield* enqueue([yield* jobFromDeadLetter(d)])
          const now = yield* Clock.currentTimeMillis
          d.resolutionStatus = "retried"
          d.resolvedAt = new Date(now)
          d.retriedJobId = created!.id
          return created!.id
        }),
      resolve: (id: string, notes?: string) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const d = dead.get(id)
          if (!d) return Effect.fail(new JobNotFound({ message: `dead letter ${id} not found` }))
          d.resolutionStatus = "resolved"
          d.resolvedAt = new Date(now)
          d.resolutionNotes = notes ?? null
          return Effect.void
        }),
      purge: (o: { readonly olderThan?: Duration.Duration; readonly includeUnresolved?: boolean } = {}) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          let n = 0
          for (const d of [...dead.values()]) {
            if (!(o.includeUnresolved ?? false) && d.resolutionStatus === null) continue
            if (o.olderThan && d.deadAt.getTime() >= now - Duration.toMillis(o.olderThan)) continue
            dead.delete(d.id)
            n++
          }
          return n
        })
    }

    const actionLog: Array<Bulk.ActionRecord> = []
    const applicable = (filter: Bulk.JobFilter, action: Bulk.BulkAction, now: number) =>
      [...jobs.values()].filter((j) => Bulk.matches(filter, j, now) && Bulk.applies(action, j, now)).sort((a, b) => Number(a.id) - Number(b.id))
    const bulk = {
      preview: (filter: Bulk.JobFilter, action: Bulk.BulkAction) =>
        Effect.map(Clock.currentTimeMillis, (now) => applicable(filter, action, now).length),
      // one synchronous step: atomic here, as each of PgQueue's batches is
      apply: (filter: Bulk.JobFilter, action: Bulk.BulkAction, o: Bulk.BulkOptions) =>
        Effect.map(Clock.currentTimeMillis, (now) => {
          const targets = applicable(filter, action, now)
          let cancelling = 0
          const woken = new Set<string>()
          for (const j of targets) {
            switch (action.kind) {
              case "cancel":
                if (j.status === "queued" || j.status === "waiting") {
                  jobs.delete(j.id)
                  keep({ ...j, waitingOn: null }, "cancelled", now)
                  settleDependents([{ id: j.id, fate: "cancelled", reason: null, batchId: j.batchId }], now)
                  if (events.active()) events.publish([{ _tag: "Cancelled", jobId: j.id, stage: j.stage, orgId: j.orgId, attempt: 0, at: new Date(now) }])
                } else {
                  j.status = "cancelled"
                  j.updatedAt = new Date(now)
                  cancelling++
                }
                break
              case "retry":
              case "run-now":
                j.availableAt = new Date(now)
                j.updatedAt = new Date(now)
                woken.add(j.stage)
                break
              case "priority":
                j.priority = action.priority
                j.updatedAt = new Date(now)
                break
            }
          }
          woken.forEach(wake)
          const record: Bulk.ActionRecord = {
            id: String(actionLog.length + 1),
            action: action.kind,
            filter: Bulk.filterRecord(filter),
            priority: action.kind === "priority" ? action.priority : null,
            orgId: filter.org ?? null,
            actor: o.actor,
            matched: targets.length,
            affected: targets.length,
            interrupted: false,
            startedAt: new Date(now),
            finishedAt: new Date(now)
          }
          actionLog.push(record)
          return { matched: targets.length, affected: targets.length, cancelling, actionId: record.id }
        }),
      actions: (o: { readonly limit?: number | undefined } = {}) =>
        Effect.sync(() => [...actionLog].reverse().slice(0, Math.max(1, Math.min(o.limit ?? 100, 10_000))))
    }

    // one process: each subscription leads every stage it asks for
    const listening: Listening = {
      tryLead: (stages) => Effect.succeed(stages),
      unlead: () => Effect.void,
      notify: (topic) => Effect.sync(() => wake(topic)),
      // no event log in memory, so nothing to hear
      followEvents: Effect.void
    }
    const listen = (wakeups: Wakeups) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          listeners.add(wakeups)
          wakeups.onListening()
        }),
        () => Effect.sync(() => listeners.delete(wakeups))
      ).pipe(Effect.as(listening))

    return Queue.of({
      enqueue,
      transaction,
      claim,
      claimBatch,
      limits,
      heartbeat,
      settle,
      savepoint,
      reapExpired,
      nextWake,
      cancel,
      runNow,
      get,
      dependencies,
      batches: batchesApi,
      list,
      stats,
      deadLetters,
      history,
      stageControls,
      bulk,
      registry,
      listen
    })
  }))

export const layer = (options: QueueOptions = {}) => Layer.effect(Queue, make(options))
