/**
 * The cluster-wide event log: every job's lifecycle, as every process wrote it, kept for a retention and read
 * by cursor. The job statements write it (migration 0020, JobsSql); this service reads and prunes it. The
 * in-process bus (`Events.ts`) stays what it was: this process's facts, at once, for metrics and hooks. The log
 * is what another process, an SSE client or a webhook reads: durable, ordered per job, resumable by event id.
 *
 * Postgres only: the in-memory queue has its bus and no log (nothing else could read it anyway).
 */
import { Config, ConfigError, Context, Duration, Effect, Either, Layer, Schema } from "effect"
import * as Db from "../layers/Db.js"
import * as EventsSql from "./EventsSql.js"
import { parseRetention } from "./Queue.js"

/**
 * `PGFIBER_EVENTS_RETAIN`: how long the event log keeps an event (how far back a client can resume); pruned by
 * the `pgfiber.events-retention` schedule every 10 minutes. `0`: pruned at every run of it.
 */
export const retentionConfig: Config.Config<Duration.Duration> = Config.string("PGFIBER_EVENTS_RETAIN").pipe(
  Config.mapOrFail((text) => Either.mapLeft(parseRetention(text), (m) => ConfigError.InvalidData([], m))),
  Config.withDefault(Duration.days(1))
)

/** The kinds of logged events, in a job's life order (a job may repeat started → retried/rescheduled). */
export const kinds = ["enqueued", "started", "progress", "completed", "retried", "rescheduled", "dead", "cancelled"] as const
export const Kind = Schema.Literal(...kinds)
export type Kind = typeof Kind.Type

export const LoggedEvent = Schema.Struct({
  /** Its place in the log; what SSE sends as the event id and takes back as `Last-Event-ID`. */
  id: Schema.String,
  kind: Kind,
  jobId: Schema.String,
  stage: Schema.String,
  orgId: Schema.NullOr(Schema.String),
  subjectId: Schema.NullOr(Schema.String),
  /** The run the event belongs to (1-based); 0 before any run (enqueued) or for a queued job cancelled. */
  attempt: Schema.Number,
  /**
   * Small facts of the kind: `runAt` (enqueued for later), `worker` (started), `progress` and `message`
   * (progress), `outputBytes` and `runMs` (completed), `delayMs`, `tag` and `message` (retried, rescheduled,
   * dead).
   */
  data: Schema.NullOr(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  at: Schema.Date
})
export type LoggedEvent = typeof LoggedEvent.Type

const isKind = Schema.is(Kind)

/**
 * The events of one row of `readEvents`' JSON (its fields by position, `EventsSql.rowFields`; its time as epoch
 * ms), in order: a row holds one statement's events of one org, stage and kind, job by job. Not Schema-decoded
 * objects: a follower reads every event of every job, and parsing and decoding 1,000 objects with a Schema cost
 * 4-8 ms in the follower's process (often the worker's), 13-24 % of a 20,000-job drain's time on a 2-core
 * machine. Only the kind is checked (the table's CHECK holds it too; the other fields' types are the columns').
 * The model is still `LoggedEvent`. Events go straight into `out` as they are handed out (no copy per event
 * afterwards). `skip`: how many of the row's first events the reader has already had. Returns the place after
 * the last one looked at. Exported for bench/sseEncode.ts, which makes its events as the reader does.
 */
export const unnestRow = (
  a: ReadonlyArray<unknown>,
  skip: number,
  keep: ((jobId: string, subjectId: string | null) => boolean) | null,
  out: Array<LoggedEvent>,
  max: number
): number => {
  const kind = a[2]
  if (!isKind(kind)) throw new Error(`event row ${String(a[0])} has an unknown kind ${String(kind)}`)
  const rowId = a[0] as string, stage = a[3] as string, orgId = a[4] as string | null
  // one Date for the row's events: they were written by one statement at one instant
  const at = new Date(a[5] as number)
  // numbers while every job id fits a double exactly (EventsSql.readEvents), else strings
  const jobIds = a[6] as ReadonlyArray<number | string>
  const subjectIds = a[7] as ReadonlyArray<string | null> | null
  const attempts = a[8] as ReadonlyArray<number>
  const data = a[9] as ReadonlyArray<Record<string, unknown> | null> | null
  // one element: every event of the row shares it (EventsSql's header)
  const shared = data !== null && data.length === 1 ? data[0] ?? null : undefined
  const id = eventIds(rowId)
  let n = skip
  for (; n < jobIds.length && out.length < max; n++) {
    const subjectId = subjectIds?.[n] ?? null
    const jobId = String(jobIds[n]!)
    if (keep !== null && !keep(jobId, subjectId)) continue
    out.push({
      id: id(n), kind, jobId, stage, orgId, subjectId, attempt: attempts[n] ?? 0,
      data: shared !== undefined ? shared : data?.[n] ?? null, at
    })
  }
  return n
}

/** The ids of a row's events: the row's id × `EventsSql.idScale` + the place (as Numbers while exact). */
const eventIds = (rowId: string): (place: number) => string => {
  const row = Number(rowId)
  if (row * EventsSql.idScale + EventsSql.idScale <= Number.MAX_SAFE_INTEGER) {
    const base = row * EventsSql.idScale
    return (place) => String(base + place)
  }
  const base = BigInt(rowId) * BigInt(EventsSql.idScale)
  return (place) => String(base + BigInt(place))
}

/** Where event `id` sits: its row and its place there. */
export const placeOf = (id: string) => {
  const n = BigInt(id)
  return { row: String(n / BigInt(EventsSql.idScale)), place: Number(n % BigInt(EventsSql.idScale)) }
}

/** A reader's place: the last (tx, id) it has, in the log's read order. */
export interface Cursor {
  readonly tx: string
  readonly id: string
}

export interface Filter {
  /** Only this org's events; undefined: every org (owner work, never a tenant's). */
  readonly org?: string | undefined
  readonly stages?: ReadonlyArray<string> | undefined
  readonly kinds?: ReadonlyArray<Kind> | undefined
  readonly jobId?: string | undefined
  readonly subjectId?: string | undefined
}

export interface Page {
  readonly events: ReadonlyArray<LoggedEvent>
  /** Where the next read starts. */
  readonly next: Cursor
  /** More may be there at once (a full page). */
  readonly full: boolean
  /** Events past the horizon wait for an older transaction to end: read again soon. */
  readonly held: boolean
}

/**
 * One row of the log, decoded once: what one statement logged for one org, stage and kind, in order. The
 * process's shared reader (runtime/EventReader.ts) reads rows, not events, and hands each follower the rows its
 * filter takes, so that N followers cost one read and one decode.
 */
export interface Row {
  readonly tx: string
  /** The row's id (an event's id is this × `EventsSql.idScale` + its place). */
  readonly id: string
  readonly kind: Kind
  readonly stage: string
  readonly orgId: string | null
  /** The row's events from place `first` on (the places before it were behind the cursor). */
  readonly first: number
  readonly events: ReadonlyArray<LoggedEvent>
}

export interface RowPage {
  /** Whole rows, in read order. */
  readonly rows: ReadonlyArray<Row>
  /** Where the next read starts (the end of the last row, or the horizon when nothing is left below it). */
  readonly next: Cursor
  /** More may be there at once. */
  readonly full: boolean
  /** Events past the horizon wait for an older transaction to end: read again soon. */
  readonly held: boolean
}

export class EventLogError extends Schema.TaggedError<EventLogError>()("EventLogError", { message: Schema.String }) {}

export class EventLog extends Context.Tag("pgfiber/EventLog")<EventLog, {
  /** The cursor for "from now on" (events written by transactions still running are included). */
  readonly now: Effect.Effect<Cursor, EventLogError>
  /**
   * The cursor just after event `id` for this filter's org: exact when the event is kept and the org may see it;
   * the log's beginning when `id` is older than anything kept; else "from now".
   */
  readonly after: (id: string, filter: Filter) => Effect.Effect<Cursor, EventLogError>
  /** The next page after `cursor` (at most `limit` events). */
  readonly read: (cursor: Cursor, filter: Filter, limit?: number) => Effect.Effect<Page, EventLogError>
  /**
   * The next whole rows after `cursor` (at least `limit` events when there are so many; the rows of a job or
   * subject filter hold other jobs' events too, which the caller drops).
   */
  readonly readRows: (cursor: Cursor, filter: Filter, limit?: number) => Effect.Effect<RowPage, EventLogError>
  /** Deletes events older than `retention`, `batch` per statement, until none are left; returns how many. */
  readonly prune: (retention: Duration.Duration, options?: { readonly batch?: number; readonly maxBatches?: number }) => Effect.Effect<number, EventLogError>
}>() {}

/** The beginning of the log: before every row (xid8 0 is never assigned). */
export const beginning: Cursor = { tx: "0", id: "0" }

const isId = (s: string) => /^[0-9]{1,18}$/.test(s)

/** Later of two cursors in read order (xids and ids are 64-bit: compared as bigints). */
export const later = (a: Cursor, b: Cursor): Cursor => {
  const ta = BigInt(a.tx), tb = BigInt(b.tx)
  if (ta !== tb) return ta > tb ? a : b
  return BigInt(a.id) >= BigInt(b.id) ? a : b
}

const sqlFilter = (f: Filter): EventsSql.EventFilter => ({
  org: f.org ?? null,
  stages: f.stages && f.stages.length > 0 ? f.stages : null,
  kinds: f.kinds && f.kinds.length > 0 ? f.kinds : null,
  jobId: f.jobId !== undefined && isId(f.jobId) ? f.jobId : f.jobId !== undefined ? "-1" : null,
  subjectId: f.subjectId ?? null
})

export const make = Effect.gen(function*() {
  const db = yield* Db.Db
  const run = <A>(query: (sql: Db.Sql) => PromiseLike<A>) =>
    Db.asOwner(db.run(query)).pipe(Effect.mapError((e) => new EventLogError({ message: e.message })))

  const now = Effect.map(run((sql) => EventsSql.horizon(sql)), ([row]): Cursor => ({ tx: row!.xmin, id: "0" }))

  const after = (id: string, filter: Filter) =>
    Effect.gen(function*() {
      if (!isId(id)) return yield* now
      const [row] = yield* run((sql) => EventsSql.cursorAfter(sql, id, filter.org ?? null))
      if (row?.tx != null) return { tx: row.tx, id }
      if (row?.oldest == null || BigInt(id) < BigInt(row.oldest)) return beginning
      return yield* now
    })

  const fail = (e: unknown) => new EventLogError({ message: e instanceof Error ? e.message : String(e) })

  const read = (cursor: Cursor, filter: Filter, limit = 500) =>
    Effect.gen(function*() {
      const f = sqlFilter(filter)
      const [row] = yield* run((sql) => EventsSql.readEvents(sql, cursor, f, limit))
      const keep = f.jobId === null && f.subjectId === null ? null : (jobId: string, subjectId: string | null) =>
        (f.jobId === null || jobId === f.jobId) && (f.subjectId === null || subjectId === f.subjectId)
      const at = placeOf(cursor.id)
      const events: Array<LoggedEvent> = []
      // the cursor's own row (the first, when it is still there) was read up to the cursor's place
      let last: Cursor | undefined
      let lastTx = cursor.tx
      const unnested = yield* Effect.try({
        try: () => {
          for (const r of row!.rows) {
            const skip = r[1] === cursor.tx && r[0] === at.row ? at.place + 1 : 0
            const before = events.length
            const upTo = unnestRow(r, skip, keep, events, limit)
            if (events.length > before) lastTx = r[1] as string
            const length = (r[6] as ReadonlyArray<unknown>).length
            if (upTo < length) return false // the page is full inside this row
            last = { tx: r[1] as string, id: eventIds(r[0] as string)(length - 1) }
          }
          return true
        },
        catch: fail
      })
      const full = !unnested || events.length >= limit || row!.truncated
      const next = !unnested || events.length >= limit
        ? { tx: lastTx, id: events[events.length - 1]!.id }
        // every row read to its end: after the last, or (nothing more below it) the horizon, which rows the
        // filter left out are behind
        : row!.truncated ? last ?? cursor : later(last ?? cursor, { tx: row!.horizon, id: "0" })
      return { events, next, full, held: row!.held }
    })

  const readRows = (cursor: Cursor, filter: Filter, limit = 5000) =>
    Effect.gen(function*() {
      const f = sqlFilter(filter)
      const [page] = yield* run((sql) => EventsSql.readEvents(sql, cursor, f, limit))
      const at = placeOf(cursor.id)
      const rows = yield* Effect.try({
        try: () =>
          page!.rows.map((r): Row => {
            const tx = r[1] as string, id = r[0] as string
            const first = tx === cursor.tx && id === at.row ? at.place + 1 : 0
            const events: Array<LoggedEvent> = []
            unnestRow(r, first, null, events, Number.MAX_SAFE_INTEGER)
            return { tx, id, kind: r[2] as Kind, stage: r[3] as string, orgId: r[4] as string | null, first, events }
          }),
        catch: fail
      })
      const lastRow = rows[rows.length - 1]
      const last = lastRow === undefined
        ? cursor
        : later(cursor, { tx: lastRow.tx, id: eventIds(lastRow.id)(lastRow.first + lastRow.events.length - 1) })
      const next = page!.truncated ? last : later(last, { tx: page!.horizon, id: "0" })
      return { rows, next, full: page!.truncated, held: page!.held }
    })

  const prune = (retention: Duration.Duration, o: { readonly batch?: number; readonly maxBatches?: number } = {}) =>
    Effect.gen(function*() {
      const batch = o.batch ?? 5000
      let total = 0
      for (let i = 0; i < (o.maxBatches ?? 1000); i++) {
        const [row] = yield* run((sql) => EventsSql.pruneEvents(sql, Duration.toMillis(retention), batch))
        total += row?.n ?? 0
        if ((row?.n ?? 0) < batch) break
      }
      return total
    })

  return EventLog.of({ now, after, read, readRows, prune })
})

export const layer = Layer.effect(EventLog, make)
