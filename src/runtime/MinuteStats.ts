/**
 * Per-minute counts of what this process settled (completions, retries, dead letters, handler run time) per
 * stage and org, kept in memory and written to `job_stats_minute` in one batched upsert per flush interval
 * (default once a minute), and once more at shutdown. The dashboard's charts read that small table instead of
 * scanning jobs. An idle worker writes nothing. Listeners (the dashboard's live view in the same process)
 * are told that something settled, so they can refresh sooner than their idle interval.
 */
import { Config, Context, Duration, Effect, Layer } from "effect"
import * as Db from "../layers/Db.js"
import type * as Outcome from "../queue/Outcome.js"
import * as StatsSql from "../queue/StatsSql.js"

export interface MinuteStatsOptions {
  /** How often the counts are written. */
  readonly flushInterval: Duration.Duration
  /** Rows older than this are deleted by the writers. */
  readonly keep: Duration.Duration
}

export const config: Config.Config<MinuteStatsOptions> = Config.all({
  flushInterval: Config.integer("PGFIBER_STATS_FLUSH_MS").pipe(
    Config.validate({ message: "must be a number of milliseconds from 100 to 3600000", validation: (n) => n >= 100 && n <= 3_600_000 }),
    Config.withDefault(60_000),
    Config.map(Duration.millis)
  ),
  keep: Config.integer("PGFIBER_STATS_KEEP_MS").pipe(
    Config.validate({ message: "must be a number of milliseconds from 3600000 (an hour) up", validation: (n) => n >= 3_600_000 }),
    Config.withDefault(24 * 3_600_000),
    Config.map(Duration.millis)
  )
})

export class MinuteStats extends Context.Tag("pgfiber/MinuteStats")<MinuteStats, {
  /** Counts one settled job (in memory; no statement). */
  readonly record: (stage: string, orgId: string | null, result: Outcome.Settled, seconds: number | undefined) => void
  /** Writes what has accumulated now. */
  readonly flush: Effect.Effect<void, Db.DbError>
  /** Calls `listener` after each batch recorded, until the returned function is called. */
  readonly onRecorded: (listener: () => void) => () => void
}>() {}

interface Cell {
  completed: number
  retried: number
  deadLettered: number
  runMsSum: number
  runMsMax: number
  runs: number
}

export const make = (options: MinuteStatsOptions) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    let cells = new Map<string, { minute: number; stage: string; orgKey: string; cell: Cell }>()
    const listeners = new Set<() => void>()
    const keepMs = Duration.toMillis(options.keep)

    const record = (stage: string, orgId: string | null, result: Outcome.Settled, seconds: number | undefined) => {
      const counted = result === "completed" || result === "retried" || result === "deadLettered"
      if (!counted) return
      const minute = Math.floor(Date.now() / 60_000) * 60_000
      const orgKey = orgId ?? ""
      const key = `${minute}\u0000${stage}\u0000${orgKey}`
      let entry = cells.get(key)
      if (entry === undefined) {
        entry = { minute, stage, orgKey, cell: { completed: 0, retried: 0, deadLettered: 0, runMsSum: 0, runMsMax: 0, runs: 0 } }
        cells.set(key, entry)
      }
      const c = entry.cell
      if (result === "completed") c.completed++
      else if (result === "retried") c.retried++
      else c.deadLettered++
      if (seconds !== undefined) {
        const ms = seconds * 1000
        c.runs++
        c.runMsSum += ms
        if (ms > c.runMsMax) c.runMsMax = ms
      }
      listeners.forEach((listener) => listener())
    }

    const flush = Effect.suspend(() => {
      if (cells.size === 0) return Effect.void
      const taken = cells
      cells = new Map()
      const rows: Array<StatsSql.MinuteRow> = [...taken.values()].map((e) => ({
        minute: new Date(e.minute), stage: e.stage, orgKey: e.orgKey, ...e.cell
      }))
      // the queue's own bookkeeping: across orgs, as the owner
      return Db.asOwner(db.run((sql) => StatsSql.upsertMinutes(sql, rows, keepMs))).pipe(
        Effect.asVoid,
        // not lost on a failed write: merged back for the next flush
        Effect.tapError(() => Effect.sync(() => {
          for (const [key, e] of taken) {
            const now = cells.get(key)
            if (now === undefined) cells.set(key, e)
            else {
              now.cell.completed += e.cell.completed
              now.cell.retried += e.cell.retried
              now.cell.deadLettered += e.cell.deadLettered
              now.cell.runMsSum += e.cell.runMsSum
              now.cell.runMsMax = Math.max(now.cell.runMsMax, e.cell.runMsMax)
              now.cell.runs += e.cell.runs
            }
          }
        }))
      )
    })

    const onRecorded = (listener: () => void) => {
      listeners.add(listener)
      return () => {
        listeners.delete(listener)
      }
    }

    yield* Effect.forkScoped(
      Effect.sleep(options.flushInterval).pipe(
        Effect.zipRight(flush),
        Effect.catchAllCause((cause) => Effect.logWarning("writing the per-minute job counts failed; retrying at the next flush", cause)),
        Effect.forever,
        Effect.annotateLogs({ component: "minute-stats" })
      )
    )
    // what the last minutes counted is written on the way out too
    yield* Effect.addFinalizer(() => flush.pipe(Effect.catchAllCause(() => Effect.void)))

    return MinuteStats.of({ record, flush, onRecorded })
  })

export const layer = (options: MinuteStatsOptions) => Layer.scoped(MinuteStats, make(options))

export const layerFromConfig = Layer.unwrapEffect(Effect.map(config, layer))
