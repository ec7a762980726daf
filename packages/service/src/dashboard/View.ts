/**
 * What one viewer may see of a live snapshot: an org key its own org's rows only, an operator every org's (or
 * one org's, when they pick one). The snapshot is read across orgs once (Live.ts); the filtering is here.
 */
import type * as ApiKeys from "../auth/ApiKeys.js"
import type * as Queue from "pgfiber/internal/queue/Queue.js"
import type * as Live from "./Live.js"

export interface Scope {
  readonly viewer: ApiKeys.Viewer
  /** An operator's choice of one org; ignored for org keys (they see theirs). */
  readonly org: string | null
}

/** The org whose rows a scope shows; null: every org (operators only). */
export const orgOf = (scope: Scope): string | null => (scope.viewer.admin ? scope.org : scope.viewer.orgId ?? "\u0000none")

const visible = (scope: Scope) => {
  const org = orgOf(scope)
  return (row: { readonly org: string | null }) => org === null || row.org === org
}

export interface StageRow {
  readonly stage: string
  readonly ready: number
  readonly delayed: number
  readonly running: number
  readonly cancelling: number
  readonly dead: number
  /** Age of the oldest ready job, e.g. "12 s". */
  readonly oldest: string
  /** "paused" when an operator paused the stage, "rate limited" while its rate limit holds ready jobs back, else "". */
  readonly state: string
}

export interface ChartData {
  readonly t: ReadonlyArray<number>
  readonly names: ReadonlyArray<string>
  readonly values: ReadonlyArray<ReadonlyArray<number | null>>
}

export interface Overview {
  readonly at: string
  readonly stages: ReadonlyArray<StageRow>
  readonly workers: ReadonlyArray<{ readonly worker: string; readonly stage: string; readonly running: number }>
  readonly series: { readonly throughput: ChartData; readonly latency: ChartData }
}

export const age = (ms: number | null): string => {
  if (ms === null || ms <= 0) return "–"
  if (ms < 1000) return `${Math.round(ms)} ms`
  if (ms < 120_000) return `${Math.round(ms / 1000)} s`
  if (ms < 7_200_000) return `${Math.round(ms / 60_000)} min`
  return `${Math.round(ms / 3_600_000)} h`
}

const minuteKey = (iso: string) => Math.floor(new Date(iso).getTime() / 60_000) * 60

/** The charts: completions per stage and failures per minute, average run time per stage, over `minutes`. */
const charts = (rows: ReadonlyArray<Queue.LiveSnapshot["series"][number]>, now: Date, minutes: number) => {
  const end = Math.floor(now.getTime() / 60_000) * 60
  const t = Array.from({ length: minutes + 1 }, (_, i) => end - (minutes - i) * 60)
  const index = new Map(t.map((s, i) => [s, i]))
  const stages = [...new Set(rows.map((r) => r.stage))].sort()
  const completed = stages.map(() => t.map((): number => 0))
  const failed = t.map(() => 0)
  const sums = stages.map(() => t.map(() => ({ ms: 0, runs: 0 })))
  for (const r of rows) {
    const i = index.get(minuteKey(r.minute))
    if (i === undefined) continue
    const s = stages.indexOf(r.stage)
    completed[s]![i]! += Number(r.completed)
    failed[i]! += Number(r.retried) + Number(r.dead_lettered)
    sums[s]![i]!.ms += Number(r.run_ms_sum)
    sums[s]![i]!.runs += Number(r.runs)
  }
  return {
    throughput: { t, names: [...stages.map((s) => `${s} completed`), "failed (all stages)"], values: [...completed, failed] },
    latency: {
      t,
      names: stages,
      values: sums.map((row) => row.map((c) => (c.runs === 0 ? null : Math.round((c.ms / c.runs) * 10) / 10)))
    }
  }
}

/**
 * `knownStages` get a row even with no jobs; `noProcess` are registered stages no live process runs, whose
 * waiting jobs say so. An org's viewer sees only `knownStages` (the public ones): its own jobs of internal
 * stages are counted nowhere on the overview.
 */
export const overview = (
  snapshot: Live.Snapshot,
  scope: Scope,
  knownStages: ReadonlyArray<string>,
  minutes: number,
  noProcess: ReadonlySet<string> = new Set()
): Overview => {
  const seeOrg = visible(scope)
  const shown = new Set(knownStages)
  const see = (row: { readonly org: string | null; readonly stage: string }) => seeOrg(row) && (scope.viewer.admin || shown.has(row.stage))
  const byStage = new Map<string, { ready: number; delayed: number; running: number; cancelling: number; dead: number; oldest: number }>()
  const row = (stage: string) => {
    let r = byStage.get(stage)
    if (r === undefined) byStage.set(stage, (r = { ready: 0, delayed: 0, running: 0, cancelling: 0, dead: 0, oldest: 0 }))
    return r
  }
  for (const stage of knownStages) row(stage)
  for (const d of snapshot.row.depth) {
    if (!see(d)) continue
    const r = row(d.stage)
    r.ready += Number(d.ready)
    r.delayed += Number(d.delayed)
    r.running += Number(d.running)
    r.cancelling += Number(d.cancelling)
    r.dead += Number(d.dead)
    r.oldest = Math.max(r.oldest, Number(d.oldest_ready_ms ?? 0))
  }
  const workers = new Map<string, { worker: string; stage: string; running: number }>()
  for (const w of snapshot.row.workers) {
    if (!see(w)) continue
    const key = `${w.worker}\u0000${w.stage}`
    const entry = workers.get(key) ?? { worker: w.worker, stage: w.stage, running: 0 }
    entry.running += Number(w.running)
    workers.set(key, entry)
  }
  const paused = new Set(snapshot.row.paused)
  const rateLimited = new Set(snapshot.row.rate_limited ?? [])
  return {
    at: snapshot.at.toISOString(),
    stages: [...byStage.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([stage, r]) => ({
      stage, ready: r.ready, delayed: r.delayed, running: r.running, cancelling: r.cancelling, dead: r.dead, oldest: age(r.oldest),
      state: paused.has(stage)
        ? "paused"
        : rateLimited.has(stage)
        ? "rate limited"
        : noProcess.has(stage) && r.ready + r.delayed > 0
        ? "no live process"
        : ""
    })),
    workers: [...workers.values()].sort((a, b) => (a.worker + a.stage < b.worker + b.stage ? -1 : 1)),
    series: charts(snapshot.row.series.filter(see), new Date(snapshot.row.now), minutes)
  }
}

export interface OrgRow {
  readonly org: string
  readonly queued: number
  readonly running: number
  readonly dead: number
  readonly completedLastHour: number
  readonly failedLastHour: number
}

export const orgs = (snapshot: Live.Snapshot, scope: Scope): ReadonlyArray<OrgRow> => {
  const see = visible({ ...scope, org: null })
  const out = new Map<string, { queued: number; running: number; dead: number; completedLastHour: number; failedLastHour: number }>()
  const row = (org: string | null) => {
    const key = org ?? "(no org)"
    let r = out.get(key)
    if (r === undefined) out.set(key, (r = { queued: 0, running: 0, dead: 0, completedLastHour: 0, failedLastHour: 0 }))
    return r
  }
  for (const d of snapshot.row.depth) {
    if (!see(d)) continue
    const r = row(d.org)
    r.queued += Number(d.ready) + Number(d.delayed)
    r.running += Number(d.running)
    r.dead += Number(d.dead)
  }
  for (const s of snapshot.row.series) {
    if (!see(s)) continue
    const r = row(s.org)
    r.completedLastHour += Number(s.completed)
    r.failedLastHour += Number(s.retried) + Number(s.dead_lettered)
  }
  return [...out.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([org, r]) => ({ org, ...r }))
}

/** A watched job as its page shows it; `gone` when it has left the jobs table (finished or dead). */
export const job = (snapshot: Live.Snapshot, scope: Scope, id: string): Record<string, unknown> | undefined => {
  if (!snapshot.looked.has(id)) return undefined
  const row = snapshot.row.watched.find((j) => j.id === id)
  const org = orgOf({ ...scope, org: null })
  if (row === undefined || (org !== null && row.org_id !== org)) return { gone: true }
  const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(String(v)).toISOString())
  return {
    status: row.status === "queued" && row.available_at !== null && new Date(String(row.available_at)) > new Date(snapshot.row.now) ? "delayed" : row.status,
    attempts: row.attempts,
    maxAttempts: row.max_attempts,
    polls: row.polls,
    availableAt: iso(row.available_at),
    lockedBy: row.locked_by ?? null,
    lockedUntil: iso(row.locked_until),
    lastError: row.last_error ?? null,
    updatedAt: iso(row.updated_at),
    startedAt: iso(row.started_at),
    progress: row.progress === null || row.progress === undefined ? "" : String(row.progress),
    progressMessage: row.progress_message ?? ""
  }
}
