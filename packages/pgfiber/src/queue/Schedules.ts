/**
 * Recurring schedules: rows that say "enqueue this job for this stage on every tick of this cron expression
 * (or fixed interval)", and the one operation that turns due ticks into jobs exactly once.
 *
 * Exactly once, without a leader: each schedule's row holds a cursor, `nextTickAt`, the next tick nobody has
 * fired. Firing compares-and-sets that cursor and enqueues the tick's jobs in one transaction, each job keyed
 * `schedule:<org>:<name>:<tick ISO>`; two workers firing the same tick at once make one job (the loser's
 * compare fails, and the key would dedupe it anyway). The cron arithmetic runs here (croner); where the
 * schedules live is a `Store` (Postgres in PgSchedules.ts, memory in MemorySchedules.ts).
 *
 * Time zones and DST follow croner's documented rules: a fixed-time expression (single second, minute and
 * hour, e.g. `30 2 * * *`) whose time falls in a spring-forward gap runs once, when the clock has jumped
 * forward (03:00 local), and once on the first occurrence of a repeated (fall-back) time; an interval-like
 * expression (`*\/30 * * * *`) skips times in a gap and runs on both occurrences of a repeated time. Fixed
 * intervals (`every`) are counted in milliseconds from the Unix epoch and know no time zone.
 */
import { Cron } from "croner"
import { Context, Data, Effect, Either, Layer } from "effect"
import type * as Db from "../layers/Db.js"
import type { Priority } from "./Job.js"
import * as Queue from "./Queue.js"

export type CatchUp = "skip" | "backfill"

/** What defines a schedule: given in code (`Stage`-side declarations), by the CLI or over HTTP. */
export interface ScheduleSpec {
  readonly name: string
  readonly stage: string
  readonly payload?: unknown
  /** 5 fields (minute precision) or 6 (seconds first). Exactly one of `cron` and `every`. */
  readonly cron?: string | undefined
  /** A fixed interval in milliseconds (at least 1000), ticks aligned to the Unix epoch. */
  readonly everyMs?: number | undefined
  /** IANA zone the cron expression is read in (default UTC). */
  readonly timeZone?: string | undefined
  readonly orgId?: string | null | undefined
  readonly enabled?: boolean | undefined
  /** After downtime: `skip` (default) fires only the latest missed tick; `backfill` up to `backfillLimit`. */
  readonly catchUp?: CatchUp | undefined
  readonly backfillLimit?: number | undefined
  readonly priority?: Priority | undefined
  readonly maxAttempts?: number | undefined
  /** The first tick is the first one after this instant (default: now). */
  readonly startAfter?: Date | undefined
}

/** A schedule's definition with every default resolved, and its cursor: what a stored and a validated one share. */
export interface ResolvedSchedule {
  readonly name: string
  readonly orgId: string | null
  readonly stage: string
  readonly payload: unknown
  readonly priority: number
  readonly maxAttempts: number
  readonly cron: string | null
  readonly everyMs: number | null
  readonly timeZone: string
  readonly enabled: boolean
  readonly catchUp: CatchUp
  readonly backfillLimit: number
  readonly nextTickAt: Date
}

export interface Schedule extends ResolvedSchedule {
  readonly lastTickAt: Date | null
  readonly source: "code" | "runtime"
  readonly createdAt: Date
  readonly updatedAt: Date
}

/** A schedule as a store writes it: validated, its first tick computed. */
export interface ValidSchedule extends ResolvedSchedule {
  readonly payloadJson: string
  /** The first tick after the moment it was validated. */
  readonly nextTickAt: Date
  /** The definition as JSON, for code-declared schedules: compared at the next start-up. */
  readonly declared: string
}

export class InvalidSchedule extends Data.TaggedError("InvalidSchedule")<{
  readonly field: string
  readonly message: string
}> {}

export class ScheduleNotFound extends Data.TaggedError("ScheduleNotFound")<{
  readonly message: string
}> {}

export type ScheduleError = Db.DbError

export const namePattern = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/

/** The schedule's timing, parsed once: the tick after an instant, and the latest tick at or before one. */
export interface Timing {
  readonly next: (after: Date) => Date | null
  readonly latestAtOrBefore: (at: Date) => Date | null
}

export const validTimeZone = (zone: string): boolean => {
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: zone })
    return true
  } catch {
    return false
  }
}

export const timing = (s: { readonly cron: string | null; readonly everyMs: number | null; readonly timeZone: string }): Either.Either<Timing, InvalidSchedule> => {
  if (s.everyMs !== null) {
    const every = s.everyMs
    if (!Number.isInteger(every) || every < 1000) {
      return Either.left(new InvalidSchedule({ field: "every", message: "an interval must be a whole number of milliseconds, at least 1000" }))
    }
    return Either.right({
      next: (after) => new Date((Math.floor(after.getTime() / every) + 1) * every),
      latestAtOrBefore: (at) => new Date(Math.floor(at.getTime() / every) * every)
    })
  }
  if (s.cron === null) return Either.left(new InvalidSchedule({ field: "cron", message: "a cron expression or an interval is required" }))
  if (!validTimeZone(s.timeZone)) {
    return Either.left(new InvalidSchedule({ field: "timeZone", message: `"${s.timeZone}" is not an IANA time zone (e.g. Europe/Berlin)` }))
  }
  try {
    const cron = new Cron(s.cron.trim(), { timezone: s.timeZone, paused: true, mode: "5-or-6-parts" })
    // croner's previousRuns includes a run at the reference's own second; step a second on for "at or before"
    return Either.right({
      next: (after) => cron.nextRun(after),
      latestAtOrBefore: (at) => cron.previousRuns(1, new Date(Math.floor(at.getTime() / 1000) * 1000 + 1000))[0] ?? null
    })
  } catch (e) {
    return Either.left(new InvalidSchedule({
      field: "cron",
      message: `"${s.cron}" is not a cron expression of 5 or 6 fields: ${e instanceof Error ? e.message.replace(/^CronPattern: /, "") : String(e)}`
    }))
  }
}

/** Validates a spec and computes its first tick after `now`. */
export const validate = (spec: ScheduleSpec, now: Date): Either.Either<ValidSchedule, InvalidSchedule> => {
  const fail = (field: string, message: string) => Either.left(new InvalidSchedule({ field, message }))
  if (typeof spec.name !== "string" || !namePattern.test(spec.name)) return fail("name", `name must match ${namePattern.source}`)
  if (typeof spec.stage !== "string" || spec.stage.length === 0) return fail("stage", "stage is required")
  const cron = spec.cron === undefined ? null : spec.cron
  const everyMs = spec.everyMs === undefined ? null : spec.everyMs
  if ((cron === null) === (everyMs === null)) return fail("cron", "give exactly one of a cron expression and an interval")
  const timeZone = spec.timeZone ?? "UTC"
  const t = timing({ cron, everyMs, timeZone })
  if (Either.isLeft(t)) return Either.left(t.left)
  if (spec.startAfter !== undefined && (!(spec.startAfter instanceof Date) || Number.isNaN(spec.startAfter.getTime()))) {
    return fail("startAfter", "startAfter must be a valid Date")
  }
  const from = spec.startAfter ?? now
  const nextTickAt = t.right.next(from)
  if (nextTickAt === null) return fail("cron", `"${cron}" never runs after ${from.toISOString()}`)
  const catchUp = spec.catchUp ?? "skip"
  if (catchUp !== "skip" && catchUp !== "backfill") return fail("catchUp", "catch-up must be skip or backfill")
  const backfillLimit = catchUp === "skip" ? 1 : spec.backfillLimit ?? 10
  if (!Number.isInteger(backfillLimit) || backfillLimit < 1 || backfillLimit > 1000) {
    return fail("backfillLimit", "backfill limit must be a whole number from 1 to 1000")
  }
  // the job fields are checked by the queue's own rules
  const job = Queue.validate({
    stage: spec.stage,
    payload: spec.payload,
    orgId: spec.orgId,
    priority: spec.priority,
    maxAttempts: spec.maxAttempts
  }, { maxPayloadBytes: 64 * 1024, knownStages: undefined })
  if (Either.isLeft(job)) return fail(job.left.field, job.left.message)
  const definition = {
    stage: spec.stage,
    payload: job.right.payload,
    cron,
    everyMs,
    timeZone,
    orgId: job.right.orgId,
    catchUp,
    backfillLimit,
    priority: job.right.priority,
    maxAttempts: job.right.maxAttempts
  }
  return Either.right({
    name: spec.name,
    orgId: job.right.orgId,
    stage: spec.stage,
    payload: job.right.payload,
    payloadJson: job.right.payloadJson,
    priority: job.right.priority,
    maxAttempts: job.right.maxAttempts,
    cron,
    everyMs,
    timeZone,
    enabled: spec.enabled ?? true,
    catchUp,
    backfillLimit,
    nextTickAt,
    declared: Queue.stableJson(definition)
  })
}

/** The dedupe key of a tick's job: the same tick always makes the same key, whichever process fires it. */
const tickKey = (s: { readonly orgId: string | null; readonly name: string }, tick: Date) =>
  `schedule:${s.orgId ?? ""}:${s.name}:${tick.toISOString()}`

export interface Firing {
  /** The ticks to enqueue now, oldest first (at most the schedule's backfill limit). */
  readonly ticks: ReadonlyArray<Date>
  /** Ticks that were due but are not fired (beyond the backfill limit). */
  readonly skipped: number
  /** The cursor's new value: the first tick after `now`. */
  readonly nextTickAt: Date | null
}

/**
 * Which of a schedule's due ticks to fire at `now`: every tick from its cursor up to `now`, of which only
 * the latest `backfillLimit` (1 for `skip`) are kept. Counting is bounded: past 1,000 ticks only the latest
 * ones are computed, walking back from `now`.
 */
export const firing = (s: Pick<Schedule, "cron" | "everyMs" | "timeZone" | "backfillLimit" | "nextTickAt">, now: Date): Either.Either<Firing, InvalidSchedule> =>
  Either.map(timing(s), (t) => {
    const limit = Math.max(1, s.backfillLimit)
    const ticks: Array<Date> = []
    let count = 0
    let tick: Date | null = s.nextTickAt
    while (tick !== null && tick.getTime() <= now.getTime() && count < 1000) {
      count++
      ticks.push(tick)
      if (ticks.length > limit) ticks.shift()
      tick = t.next(tick)
    }
    if (tick !== null && tick.getTime() <= now.getTime()) {
      // a very long downtime: take the latest ticks walking back from now instead
      const latest: Array<Date> = []
      let at: Date | null = t.latestAtOrBefore(now)
      while (at !== null && latest.length < limit && at.getTime() >= s.nextTickAt.getTime()) {
        latest.unshift(at)
        at = t.latestAtOrBefore(new Date(at.getTime() - 1))
      }
      return { ticks: latest, skipped: count - latest.length, nextTickAt: t.next(now) }
    }
    return { ticks, skipped: count - ticks.length, nextTickAt: tick }
  })

export interface Fired {
  readonly name: string
  readonly orgId: string | null
  readonly ticks: ReadonlyArray<Date>
  readonly jobIds: ReadonlyArray<string>
  readonly skipped: number
}

export interface FireResult {
  /** The clock the firing used (the database's, or the one passed in). */
  readonly now: Date
  readonly fired: ReadonlyArray<Fired>
}

export interface ScheduleKey {
  readonly name: string
  readonly orgId?: string | null | undefined
}

export class Schedules extends Context.Tag("pgfiber/Schedules")<Schedules, {
  /** Adds or replaces a schedule (a runtime one; code-declared ones go through `declare`). */
  readonly put: (spec: ScheduleSpec) => Effect.Effect<Schedule, InvalidSchedule | ScheduleError>
  /**
   * Upserts schedules declared in code at start-up. A new one is inserted; an existing one takes the code's
   * definition only when that changed since the last start-up, so an operator's edits survive restarts.
   */
  readonly declare: (specs: ReadonlyArray<ScheduleSpec>) => Effect.Effect<void, InvalidSchedule | ScheduleError>
  readonly remove: (key: ScheduleKey) => Effect.Effect<void, ScheduleNotFound | ScheduleError>
  /** Enabling starts from the next tick after now: ticks missed while disabled are not fired. */
  readonly setEnabled: (key: ScheduleKey, enabled: boolean) => Effect.Effect<Schedule, ScheduleNotFound | ScheduleError>
  readonly get: (key: ScheduleKey) => Effect.Effect<Schedule | null, ScheduleError>
  readonly list: (options?: { readonly orgId?: string | null | undefined }) => Effect.Effect<ReadonlyArray<Schedule>, ScheduleError>
  /** Enqueues one job now, outside the ticks (the cursor does not move). */
  readonly runNow: (key: ScheduleKey) => Effect.Effect<Queue.EnqueueResult, ScheduleNotFound | Queue.InvalidJob | ScheduleError | Queue.QueueError>
  /**
   * Fires every enabled schedule whose cursor is at or before `at` (default: the store's clock, the
   * database's for Postgres): exactly once per tick however many processes call it at once.
   */
  readonly fireDue: (at?: Date) => Effect.Effect<FireResult, ScheduleError | Queue.QueueError>
}>() {}

/** Where schedules live; the firing logic above is shared by both stores. */
export interface Store {
  /** The clock (when `at` is not given) and the enabled schedules due by it. */
  readonly due: (at: Date | undefined) => Effect.Effect<{ readonly now: Date; readonly due: ReadonlyArray<Schedule> }, ScheduleError>
  /** The store's clock. */
  readonly now: Effect.Effect<Date, ScheduleError>
  readonly upsert: (s: ValidSchedule, source: "code" | "runtime") => Effect.Effect<Schedule, ScheduleError>
  readonly remove: (key: ScheduleKey) => Effect.Effect<boolean, ScheduleError>
  readonly setEnabled: (key: ScheduleKey, enabled: boolean, nextTickAt: Date | null) => Effect.Effect<Schedule | null, ScheduleError>
  readonly get: (key: ScheduleKey) => Effect.Effect<Schedule | null, ScheduleError>
  readonly list: (orgId: string | null | undefined) => Effect.Effect<ReadonlyArray<Schedule>, ScheduleError>
  /** Compare-and-set of the cursor; false when another process moved it first (or the schedule is gone). */
  readonly advance: (s: Schedule, nextTickAt: Date, lastTickAt: Date | null) => Effect.Effect<boolean, ScheduleError>
}

const invalidInStore = (s: Schedule, e: InvalidSchedule) =>
  Effect.logWarning(`schedule ${s.name}: cannot compute its ticks (${e.message}); disable or fix it`)

const jobForTick = (s: Schedule, dedupeKey: string, runAt: Date | undefined): Queue.NewJob => ({
  stage: s.stage,
  payload: s.payload,
  orgId: s.orgId,
  priority: s.priority,
  maxAttempts: s.maxAttempts,
  dedupeKey,
  ...(runAt ? { runAt } : {})
})

export const make = (store: Store) =>
  Effect.gen(function*() {
    const queue = yield* Queue.Queue

    const validOrFail = (spec: ScheduleSpec) =>
      Effect.flatMap(store.now, (now) => Either.match(validate(spec, now), { onLeft: Effect.fail, onRight: Effect.succeed }))

    const fireOne = (s: Schedule, now: Date) =>
      Either.match(firing(s, now), {
        onLeft: (e) => Effect.as(invalidInStore(s, e), null),
        onRight: (f) =>
          f.nextTickAt === null
            ? Effect.as(Effect.logWarning(`schedule ${s.name}: no tick after ${now.toISOString()}; left as it is`), null)
            : queue.transaction(
              Effect.gen(function*() {
                const won = yield* store.advance(s, f.nextTickAt!, f.ticks.at(-1) ?? s.lastTickAt)
                if (!won || f.ticks.length === 0) return null
                // a tick's job is due at its tick, which has passed: it runs now
                const results = yield* queue.enqueue(f.ticks.map((tick) => jobForTick(s, tickKey(s, tick), undefined)))
                return { name: s.name, orgId: s.orgId, ticks: f.ticks, jobIds: results.map((r) => r.id), skipped: f.skipped } satisfies Fired
              })
            ).pipe(
              // a job the queue refuses (e.g. the stage was renamed) must not stop the other schedules
              Effect.catchTag("InvalidJob", (e) =>
                Effect.as(Effect.logWarning(`schedule ${s.name}: its job is refused (${e.message}); disable or fix it`), null))
            )
      })

    const fireDue = (at?: Date) =>
      Effect.gen(function*() {
        const { now, due } = yield* store.due(at)
        const fired: Array<Fired> = []
        for (const s of due) {
          const f = yield* fireOne(s, now)
          if (f !== null) fired.push(f)
        }
        return { now, fired } satisfies FireResult
      }).pipe(Effect.withSpan("Schedules.fireDue"))

    const notFound = (key: ScheduleKey) =>
      new ScheduleNotFound({ message: `schedule ${key.name}${key.orgId ? ` (org ${key.orgId})` : ""} not found` })

    /**
     * A key no schedule can have (a name the table's check refuses, or text PostgreSQL cannot store, such as a
     * NUL in a URL's path) is simply not there: answered without asking the store, which would refuse the text.
     */
    const possible = (key: ScheduleKey) =>
      namePattern.test(key.name) && (key.orgId === null || key.orgId === undefined || Queue.textProblem(key.orgId) === undefined)
    const get = (key: ScheduleKey) => (possible(key) ? store.get(key) : Effect.succeed(null))

    return Schedules.of({
      put: (spec) => Effect.flatMap(validOrFail(spec), (v) => store.upsert(v, "runtime")),
      declare: (specs) => Effect.forEach(specs, (spec) => Effect.flatMap(validOrFail(spec), (v) => store.upsert(v, "code")), { discard: true }),
      remove: (key) =>
        Effect.flatMap(possible(key) ? store.remove(key) : Effect.succeed(false), (removed) => (removed ? Effect.void : Effect.fail(notFound(key)))),
      setEnabled: (key, enabled) =>
        Effect.gen(function*() {
          const s = yield* get(key)
          if (s === null) return yield* notFound(key)
          const now = yield* store.now
          const next = enabled && !s.enabled ? Either.getOrNull(Either.map(timing(s), (t) => t.next(now))) : null
          const updated = yield* store.setEnabled(key, enabled, next)
          if (updated === null) return yield* notFound(key)
          return updated
        }),
      get,
      list: (options = {}) => store.list(options.orgId),
      runNow: (key) =>
        Effect.gen(function*() {
          const s = yield* get(key)
          if (s === null) return yield* notFound(key)
          const now = yield* store.now
          return yield* Queue.enqueueOne(jobForTick(s, `schedule:${s.orgId ?? ""}:${s.name}:run-now:${now.toISOString()}`, undefined)).pipe(
            Effect.provideService(Queue.Queue, queue)
          )
        }),
      fireDue
    })
  })

/** For a layer built from a store effect. */
export const layerFrom = <E, R>(store: Effect.Effect<Store, E, R>) =>
  Layer.effect(Schedules, Effect.flatMap(store, make))
