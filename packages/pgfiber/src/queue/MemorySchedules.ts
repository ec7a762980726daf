/**
 * Schedules in memory, on Effect's Clock: the twin of PgSchedules for unit tests (TestClock drives ticks,
 * time zones and DST). Each store operation is one synchronous step, which is what makes the cursor's
 * compare-and-set atomic here.
 */
import { Clock, Effect } from "effect"
import type { Schedule, ScheduleKey, Store } from "./Schedules.js"
import * as Schedules from "./Schedules.js"

export const makeStore = Effect.sync(() => {
  const rows = new Map<string, Schedule & { declared: string | null }>()
  const id = (key: ScheduleKey) => `${key.orgId ?? ""}\u0000${key.name}`
  const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
  const view = ({ declared: _d, ...s }: Schedule & { declared: string | null }): Schedule => s
  const sorted = () => [...rows.values()].sort((a, b) => id(a) < id(b) ? -1 : id(a) > id(b) ? 1 : 0)
  const store: Store = {
    due: (at) =>
      Effect.map(now, (clock) => {
        const when = at ?? clock
        return {
          now: when,
          due: sorted().filter((s) => s.enabled && s.nextTickAt.getTime() <= when.getTime())
            .sort((a, b) => a.nextTickAt.getTime() - b.nextTickAt.getTime())
            .map(view)
        }
      }),
    now,
    upsert: (s, source) =>
      Effect.map(now, (at) => {
        const old = rows.get(id(s))
        if (old && source === "code" && old.declared === s.declared) return view(old)
        const timingChanged = !old || old.cron !== s.cron || old.everyMs !== s.everyMs || old.timeZone !== s.timeZone
        const row = {
          name: s.name,
          orgId: s.orgId,
          stage: s.stage,
          payload: s.payload,
          priority: s.priority,
          maxAttempts: s.maxAttempts,
          cron: s.cron,
          everyMs: s.everyMs,
          timeZone: s.timeZone,
          enabled: old && source === "code" ? old.enabled : s.enabled,
          catchUp: s.catchUp,
          backfillLimit: s.backfillLimit,
          nextTickAt: timingChanged ? s.nextTickAt : old!.nextTickAt,
          lastTickAt: old?.lastTickAt ?? null,
          source,
          createdAt: old?.createdAt ?? at,
          updatedAt: at,
          declared: source === "code" ? s.declared : null
        }
        rows.set(id(s), row)
        return view(row)
      }),
    remove: (key) => Effect.sync(() => rows.delete(id(key))),
    setEnabled: (key, enabled, next) =>
      Effect.map(now, (at) => {
        const old = rows.get(id(key))
        if (!old) return null
        const row = { ...old, enabled, nextTickAt: next ?? old.nextTickAt, updatedAt: at }
        rows.set(id(key), row)
        return view(row)
      }),
    get: (key) => Effect.sync(() => { const r = rows.get(id(key)); return r ? view(r) : null }),
    list: (orgId) => Effect.sync(() => sorted().filter((s) => orgId === undefined || s.orgId === (orgId ?? null)).map(view)),
    advance: (s, next, lastTick) =>
      Effect.sync(() => {
        const row = rows.get(id(s))
        if (!row || !row.enabled || row.nextTickAt.getTime() !== s.nextTickAt.getTime()) return false
        rows.set(id(s), { ...row, nextTickAt: next, lastTickAt: lastTick })
        return true
      })
  }
  return store
})

/** Needs Queue (MemoryQueue: the tick's jobs are enqueued there). */
export const layer = Schedules.layerFrom(makeStore)
