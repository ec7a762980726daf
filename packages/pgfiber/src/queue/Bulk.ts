/**
 * Bulk actions on live jobs chosen by a filter, and the search the same filter gives the job lists: by stage,
 * state, org, subject, payload containment (JSON `@>`, or `key=value`), a substring of the last error, and age.
 * The operator sees how many jobs an action would change (`preview`), then the queue changes them in batches
 * (PgQueue: 1,000 rows per statement, each its own transaction, SKIP LOCKED), so a running claim never waits on
 * a bulk action for long. Every action is recorded with its actor (`job_actions`). The filter is checked here
 * once, for the CLI, HTTP and the dashboard alike: bad input is a `InvalidFilter` naming its field.
 */
import { Data, Duration, Either, Option } from "effect"
import { jsonProblem, stagePattern, textProblem } from "./Job.js"

/** The live states a filter can name; `queued` is due now, `delayed` is queued for later (backing off, scheduled). */
export const filterStatuses = ["waiting", "queued", "delayed", "running"] as const
export type FilterStatus = typeof filterStatuses[number]

export interface JobFilter {
  readonly stage?: string | undefined
  readonly status?: FilterStatus | undefined
  readonly org?: string | undefined
  readonly subject?: string | undefined
  /** The payload contains this JSON value (PostgreSQL's `@>`): `{"customer":42}` matches `{"customer":42,"x":1}`. */
  readonly payload?: unknown
  /** A substring of the last error, case-insensitive. */
  readonly error?: string | undefined
  /** Created longer ago than this. */
  readonly olderThan?: Duration.Duration | undefined
  /** Created within this much of now. */
  readonly newerThan?: Duration.Duration | undefined
  /** Stages left out whatever else matches: a tenant sees public stages only. */
  readonly hiddenStages?: ReadonlyArray<string> | undefined
}

/**
 * What a bulk action does to each matching job:
 * - `cancel`: a queued job is removed (into the history as cancelled), a running one is marked for its worker to
 *   stop at its next heartbeat (the single-job cancel's semantics);
 * - `retry`: a job that failed and waits for its next attempt is made due now (its attempts are kept);
 * - `run-now`: any job queued for later (delayed, scheduled, backing off) is made due now;
 * - `priority`: queued jobs get this priority.
 */
export type BulkAction =
  | { readonly kind: "cancel" }
  | { readonly kind: "retry" }
  | { readonly kind: "run-now" }
  | { readonly kind: "priority"; readonly priority: number }

export const actionKinds = ["cancel", "retry", "run-now", "priority"] as const
export type ActionKind = typeof actionKinds[number]

export interface BulkOptions {
  /** Who asked: an API key's id, `cli`, a dashboard viewer; recorded with the action. */
  readonly actor: string
  /** Rows per statement (default 1,000). */
  readonly batch?: number | undefined
  /**
   * After each batch, rest this many times as long as the batch took (default 1: half the time working), so a
   * large action leaves the server to the workers' claims and settles; 0: no rest.
   */
  readonly pace?: number | undefined
}

export interface BulkResult {
  /** Jobs the action applied to when it started (what `preview` said). */
  readonly matched: number
  /** Jobs it changed: for cancel, removed plus marked. */
  readonly affected: number
  /** For cancel: running jobs marked, stopped by their workers at the next heartbeat (in `affected`). */
  readonly cancelling: number
  /** The record in `job_actions`. */
  readonly actionId: string
}

/** One recorded bulk action. */
export interface ActionRecord {
  readonly id: string
  readonly action: ActionKind
  readonly filter: unknown
  readonly priority: number | null
  readonly orgId: string | null
  readonly actor: string
  readonly matched: number
  readonly affected: number
  /** It ended before its last batch (a client gone, the database lost): `affected` is what it changed. */
  readonly interrupted: boolean
  readonly startedAt: Date
  /** Null while it runs. */
  readonly finishedAt: Date | null
}

export const defaultBatch = 1000
export const defaultPace = 1

/** Bad filter or action: nothing was read or changed. */
export class InvalidFilter extends Data.TaggedError("InvalidFilter")<{
  readonly message: string
  readonly field: string
}> {}

const invalid = (field: string, message: string) => Either.left(new InvalidFilter({ field, message }))

/** Longest error-text search: a search, not a document. */
const maxErrorSearch = 200

const maxIdText = 200

const checkText = (field: string, value: string | undefined, max: number): Either.Either<void, InvalidFilter> => {
  if (value === undefined) return Either.void
  if (value.length === 0) return invalid(field, `${field} must not be empty`)
  if (value.length > max) return invalid(field, `${field} is longer than ${max} characters`)
  const problem = textProblem(value)
  return problem === undefined ? Either.void : invalid(field, `${field} ${problem}`)
}

/** Checks a filter as every face takes it; `requireNarrowing`: a bulk action must name at least one condition. */
export const validateFilter = (filter: JobFilter): Either.Either<JobFilter, InvalidFilter> => {
  if (filter.stage !== undefined && !stagePattern.test(filter.stage)) {
    return invalid("stage", `stage ${JSON.stringify(filter.stage)} is not a stage name (lowercase letters, digits, _ . : -)`)
  }
  if (filter.status !== undefined && !(filterStatuses as ReadonlyArray<string>).includes(filter.status)) {
    return invalid("status", `status must be one of ${filterStatuses.join(", ")}`)
  }
  for (const [field, value, max] of [["org", filter.org, maxIdText], ["subject", filter.subject, maxIdText], ["error", filter.error, maxErrorSearch]] as const) {
    const checked = checkText(field, value, max)
    if (Either.isLeft(checked)) return Either.left(checked.left)
  }
  if (filter.payload !== undefined) {
    if (filter.payload === null || typeof filter.payload !== "object" || Array.isArray(filter.payload)) {
      return invalid("payload", "payload must be a JSON object the job's payload contains, e.g. {\"customer\":42}")
    }
    const problem = jsonProblem(filter.payload, "payload")
    if (problem !== undefined) return invalid("payload", problem)
  }
  for (const [field, d] of [["olderThan", filter.olderThan], ["newerThan", filter.newerThan]] as const) {
    if (d !== undefined && (!Duration.isFinite(d) || Duration.toMillis(d) < 0)) return invalid(field, `${field} must be a finite duration`)
  }
  return Either.right(filter)
}

export const validateAction = (action: BulkAction): Either.Either<BulkAction, InvalidFilter> =>
  action.kind === "priority" && !(Number.isInteger(action.priority) && action.priority >= 0 && action.priority <= 100)
    ? invalid("priority", "priority must be an integer 0..100 (fast 10, normal 50, bulk 90)")
    : Either.right(action)

/**
 * A payload search as people type it: a JSON object (`{"customer":42}`), or `key=value` pairs separated by
 * commas or `&` (`customer=42,region=eu`; a dotted key reaches into nested objects, `order.id=7`). A value that
 * parses as JSON is that value (42, true, null, "42"), anything else is a string. Both become containment.
 */
export const parsePayloadSearch = (text: string): Either.Either<Record<string, unknown>, InvalidFilter> => {
  const t = text.trim()
  if (t.length === 0) return invalid("payload", "the payload search is empty")
  if (t.startsWith("{")) {
    let parsed: unknown
    try {
      parsed = JSON.parse(t)
    } catch (e) {
      return invalid("payload", `the payload search is not valid JSON: ${e instanceof Error ? e.message : String(e)}`)
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return invalid("payload", "the payload search must be a JSON object")
    return Either.right(parsed as Record<string, unknown>)
  }
  const out: Record<string, unknown> = {}
  for (const pair of t.split(/[,&]/)) {
    const at = pair.indexOf("=")
    if (at <= 0) return invalid("payload", `"${pair.trim()}" is not key=value (or give a JSON object)`)
    const path = pair.slice(0, at).trim().split(".")
    if (path.some((k) => k.length === 0)) return invalid("payload", `"${pair.trim()}" has an empty key`)
    const raw = pair.slice(at + 1).trim()
    let value: unknown = raw
    try {
      value = JSON.parse(raw)
    } catch {
      value = raw
    }
    let node = out
    for (const key of path.slice(0, -1)) {
      const next = node[key]
      if (next === undefined) node[key] = {}
      else if (next === null || typeof next !== "object" || Array.isArray(next)) return invalid("payload", `"${key}" is given both a value and nested keys`)
      node = node[key] as Record<string, unknown>
    }
    node[path[path.length - 1]!] = value
  }
  return Either.right(out)
}

/** An age as people type it: `90s`, `30m`, `2h`, `7d`, `500ms`, or Effect's `2 hours`. */
export const parseAge = (field: string, text: string): Either.Either<Duration.Duration, InvalidFilter> => {
  const t = text.trim()
  const short = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/.exec(t)
  if (short !== null) {
    const n = Number(short[1])
    const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[short[2] as "ms" | "s" | "m" | "h" | "d"]
    return Either.right(Duration.millis(n * unit))
  }
  const d = Duration.decodeUnknown(t)
  return Option.isSome(d) && Duration.isFinite(d.value)
    ? Either.right(d.value)
    : invalid(field, `${field} "${text}" is not an age such as 30m, 2h, 7d`)
}

/** The filter as it is recorded with an action: durations as ms, absent fields left out. */
export const filterRecord = (filter: JobFilter): Record<string, unknown> =>
  Object.fromEntries(
    Object.entries({
      stage: filter.stage,
      status: filter.status,
      org: filter.org,
      subject: filter.subject,
      payload: filter.payload,
      error: filter.error,
      olderThanMs: filter.olderThan === undefined ? undefined : Duration.toMillis(filter.olderThan),
      newerThanMs: filter.newerThan === undefined ? undefined : Duration.toMillis(filter.newerThan)
    }).filter(([, v]) => v !== undefined)
  )

/** An ILIKE pattern matching `text` anywhere, its `%`, `_` and `\` taken literally (the error search). */
export const containsPattern = (text: string): string => `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`

/** PostgreSQL's `jsonb @>` on plain JSON values: objects by key, arrays by "each wanted element is in it". */
export const jsonContains = (have: unknown, want: unknown): boolean => {
  if (want === null || typeof want !== "object") return have === want
  if (Array.isArray(want)) {
    if (!Array.isArray(have)) return false
    return want.every((w) => have.some((h) => jsonContains(h, w)))
  }
  if (have === null || typeof have !== "object" || Array.isArray(have)) return false
  const h = have as Record<string, unknown>
  return Object.entries(want as Record<string, unknown>).every(([k, w]) => k in h && jsonContains(h[k], w))
}

/** The live job fields a filter reads (the in-memory queue's match; PgQueue's is its WHERE clause). */
export interface Matchable {
  readonly stage: string
  readonly status: string
  readonly orgId: string | null
  readonly subjectId: string | null
  readonly payload: unknown
  readonly lastError: string | null
  readonly availableAt: Date
  readonly createdAt: Date
  readonly priority: number
}

export const matches = (f: JobFilter, j: Matchable, now: number): boolean =>
  (f.stage === undefined || j.stage === f.stage) &&
  (f.hiddenStages === undefined || !f.hiddenStages.includes(j.stage)) &&
  (f.status === undefined ||
    (f.status === "queued" && j.status === "queued" && j.availableAt.getTime() <= now) ||
    (f.status === "delayed" && j.status === "queued" && j.availableAt.getTime() > now) ||
    (f.status === "running" && j.status === "running") ||
    (f.status === "waiting" && j.status === "waiting")) &&
  (f.org === undefined || j.orgId === f.org) &&
  (f.subject === undefined || j.subjectId === f.subject) &&
  (f.payload === undefined || jsonContains(j.payload, f.payload)) &&
  (f.error === undefined || (j.lastError !== null && j.lastError.toLowerCase().includes(f.error.toLowerCase()))) &&
  (f.olderThan === undefined || j.createdAt.getTime() < now - Duration.toMillis(f.olderThan)) &&
  (f.newerThan === undefined || j.createdAt.getTime() >= now - Duration.toMillis(f.newerThan))

/** Whether the action changes this (matching) job. */
export const applies = (a: BulkAction, j: Matchable, now: number): boolean => {
  switch (a.kind) {
    case "cancel":
      return j.status === "waiting" || j.status === "queued" || j.status === "running"
    case "retry":
      return j.status === "queued" && j.availableAt.getTime() > now && j.lastError !== null
    case "run-now":
      return j.status === "queued" && j.availableAt.getTime() > now
    case "priority":
      return j.status === "queued" && j.priority !== a.priority
  }
}

/** A filter as the faces receive it: text fields (a form, a query string, a JSON body), a payload as text or an object. */
export interface FilterText {
  readonly stage?: string | undefined
  readonly status?: string | undefined
  readonly org?: string | undefined
  readonly subject?: string | undefined
  readonly payload?: string | Readonly<Record<string, unknown>> | undefined
  readonly error?: string | undefined
  readonly olderThan?: string | undefined
  readonly newerThan?: string | undefined
}

/** The filter the text gives (empty fields are absent), checked; or the first bad field. */
export const filterFromText = (t: FilterText): Either.Either<JobFilter, InvalidFilter> =>
  Either.gen(function*() {
    const present = (v: string | undefined) => (v === undefined || v.trim() === "" ? undefined : v.trim())
    const payloadText = typeof t.payload === "string" ? present(t.payload) : undefined
    const olderThan = present(t.olderThan)
    const newerThan = present(t.newerThan)
    const status = present(t.status)
    if (status !== undefined && !(filterStatuses as ReadonlyArray<string>).includes(status)) {
      return yield* Either.left(new InvalidFilter({ field: "status", message: `status must be one of ${filterStatuses.join(", ")}` }))
    }
    return yield* validateFilter({
      stage: present(t.stage),
      status: status as FilterStatus | undefined,
      org: present(t.org),
      subject: present(t.subject),
      payload: typeof t.payload === "object" ? t.payload : payloadText === undefined ? undefined : yield* parsePayloadSearch(payloadText),
      error: present(t.error),
      olderThan: olderThan === undefined ? undefined : yield* parseAge("olderThan", olderThan),
      newerThan: newerThan === undefined ? undefined : yield* parseAge("newerThan", newerThan)
    })
  })

/** Whether the filter names any condition: a bulk action must (an empty filter would be every live job). */
export const narrows = (f: JobFilter): boolean =>
  [f.stage, f.status, f.org, f.subject, f.payload, f.error, f.olderThan, f.newerThan].some((v) => v !== undefined)
