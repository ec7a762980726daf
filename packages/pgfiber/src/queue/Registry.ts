/**
 * The stage registry: which stages exist, as the processes that run them declared them (visibility,
 * concurrency, the limits and retention in their code, their jobs' defaults, the payload's JSON Schema), and
 * which processes run each and when each was last seen. Workers write it (at a pool's start, refreshed by the
 * Waker's safety sweep inside the statement it already sends, removed at clean shutdown); every operator
 * surface reads it, so a stage defined in a user's own worker process can be paused, retried, limited and
 * enqueued to from the CLI, the HTTP API and the dashboard of a service that never compiled it.
 *
 * A stage's row outlives its processes: a stage whose processes all stopped is still known, and shown with no
 * live process. A process's row is live while it was seen within three of that process's sweeps.
 */
import { Schema } from "effect"
import type { Sql } from "../layers/Db.js"
import * as SqlClock from "./SqlClock.js"
import type { At } from "./SqlClock.js"
import type * as Limits from "./Limits.js"

export type Visibility = "public" | "internal"

/** A stage as a process declares it. */
export interface StageEntry {
  readonly name: string
  readonly visibility: Visibility
  readonly concurrency: number
  /** The limits in the stage's code (configuration and run-time overrides are not part of the stage). */
  readonly limits: Limits.Shares
  /** Retention of finished jobs; null: the service's default. */
  readonly retainMs: number | null
  readonly maxAttempts: number
  readonly priority: number
  /** The payload's JSON Schema (draft-07), or null when its Schema has none. */
  readonly payloadSchema: unknown
}

/** Who registers: a process, its sweep interval (what liveness is measured against). */
export interface Presence {
  readonly workerId: string
  readonly sweepMs: number
}

const RateSchema = Schema.Struct({ limit: Schema.Number, perMs: Schema.Number, burst: Schema.Number, perOrg: Schema.Boolean })
const SharesSchema = Schema.Struct({
  fair: Schema.Boolean,
  maxRunning: Schema.NullOr(Schema.Number),
  maxRunningPerOrg: Schema.NullOr(Schema.Number),
  rate: Schema.NullOr(RateSchema)
})

export const ProcessSchema = Schema.Struct({
  workerId: Schema.String,
  concurrency: Schema.Number,
  startedAt: Schema.DateFromString,
  lastSeenAt: Schema.DateFromString,
  /** Seen within three of its sweeps. */
  live: Schema.Boolean
})
export type Process = typeof ProcessSchema.Type

/** A registered stage, with its processes (live or not yet pruned). */
export const RegisteredStageSchema = Schema.Struct({
  name: Schema.String,
  visibility: Schema.Literal("public", "internal"),
  concurrency: Schema.Number,
  limits: SharesSchema,
  retainMs: Schema.NullOr(Schema.Number),
  maxAttempts: Schema.Number,
  priority: Schema.Number,
  payloadSchema: Schema.Unknown,
  registeredBy: Schema.String,
  updatedAt: Schema.DateFromSelf,
  processes: Schema.Array(ProcessSchema)
})
export type RegisteredStage = typeof RegisteredStageSchema.Type

/** The row the list statement returns, decoded at the edge. */
export const RegisteredRow = Schema.Struct({
  stage: Schema.String,
  visibility: Schema.Literal("public", "internal"),
  concurrency: Schema.Number,
  limits: SharesSchema,
  retain_ms: Schema.NullOr(Schema.Number),
  max_attempts: Schema.Number,
  priority: Schema.Number,
  payload_schema: Schema.Unknown,
  registered_by: Schema.String,
  updated_at: Schema.DateFromSelf,
  processes: Schema.Array(ProcessSchema)
})

export const fromRow = (r: typeof RegisteredRow.Type): RegisteredStage => ({
  name: r.stage,
  visibility: r.visibility,
  concurrency: r.concurrency,
  limits: r.limits,
  retainMs: r.retain_ms,
  maxAttempts: r.max_attempts,
  priority: r.priority,
  payloadSchema: r.payload_schema ?? null,
  registeredBy: r.registered_by,
  updatedAt: r.updated_at,
  processes: r.processes
})

/** True when some process that runs the stage was seen lately. */
export const isLive = (s: RegisteredStage) => s.processes.some((p) => p.live)

/**
 * Records the process's stages: each stage's row is replaced by this declaration (the latest process to start
 * speaks for the stage), the process's rows inserted or refreshed, and rows of processes not seen for a day
 * deleted. Locking: the stages' registry rows and this process's rows; one statement at a pool's start.
 */
export const register = (sql: Sql, at: At, presence: Presence, entries: ReadonlyArray<StageEntry>) =>
  sql`
    with declared as (
      select * from jsonb_to_recordset(${JSON.stringify(entries.map((e) => ({ ...e, payloadSchema: e.payloadSchema ?? null })))}::text::jsonb)
        as d(name text, visibility text, concurrency int, limits jsonb, "retainMs" float8, "maxAttempts" int, priority int,
             "payloadSchema" jsonb)
    ), stages as (
      insert into stage_registry (stage, visibility, concurrency, limits, retain_ms, max_attempts, priority, payload_schema,
                                  registered_by, updated_at)
      select name, visibility, concurrency, limits, "retainMs", "maxAttempts", priority, "payloadSchema", ${presence.workerId}, ${SqlClock.now(sql, at)}
      from declared
      on conflict (stage) do update set
        visibility = excluded.visibility, concurrency = excluded.concurrency, limits = excluded.limits,
        retain_ms = excluded.retain_ms, max_attempts = excluded.max_attempts, priority = excluded.priority,
        payload_schema = excluded.payload_schema, registered_by = excluded.registered_by, updated_at = ${SqlClock.now(sql, at)}
      returning stage
    ), gone as (
      delete from stage_processes where last_seen_at < ${SqlClock.now(sql, at)} - interval '1 day' returning 1
    )
    insert into stage_processes (worker_id, stage, concurrency, sweep_ms, started_at, last_seen_at)
    select ${presence.workerId}, name, concurrency, ${presence.sweepMs}, ${SqlClock.now(sql, at)}, ${SqlClock.now(sql, at)} from declared
    on conflict (worker_id, stage) do update set concurrency = excluded.concurrency, sweep_ms = excluded.sweep_ms,
      last_seen_at = ${SqlClock.now(sql, at)}`

/** A clean shutdown: the process no longer runs these stages. Locking: this process's rows. */
export const unregister = (sql: Sql, workerId: string, stages: ReadonlyArray<string>) =>
  sql`delete from stage_processes where worker_id = ${workerId} and stage = any(${stages}::text[])`

/** Every registered stage with its processes. Locking: none. */
export const list = (sql: Sql, at: At) =>
  sql<Array<Record<string, unknown>>>`
    select r.stage, r.visibility, r.concurrency, r.limits, r.retain_ms, r.max_attempts, r.priority, r.payload_schema,
           r.registered_by, r.updated_at,
           coalesce((
             select jsonb_agg(jsonb_build_object(
                      'workerId', p.worker_id, 'concurrency', p.concurrency,
                      'startedAt', to_char(p.started_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                      'lastSeenAt', to_char(p.last_seen_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                      'live', p.last_seen_at > ${SqlClock.now(sql, at)} - 3 * p.sweep_ms * interval '1 millisecond')
                    order by p.worker_id)
             from stage_processes p where p.stage = r.stage), '[]'::jsonb) as processes
    from stage_registry r order by r.stage`

/** The given names that are registered (visible to the caller's role). Locking: none. */
export const registeredAmong = (sql: Sql, names: ReadonlyArray<string>) =>
  sql<Array<{ stage: string }>>`select stage from stage_registry where stage = any(${names}::text[])`
