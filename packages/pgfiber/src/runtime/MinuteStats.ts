/**
 * Per-minute counts of what this process settled (completions, retries, dead letters, handler run time) per
 * stage and org, counted in memory from the process's job events (Events.ts) and written to
 * `job_stats_minute` in one batched upsert per flush interval (default once a minute), and once more at
 * shutdown. The dashboard's charts read that small table instead of scanning jobs. An idle worker writes nothing.
 * The writing is the queue's (queue/MinuteStatsStore.ts): this module runs no SQL.
 */
import { Config, Context, Duration, Effect, Layer, Stream } from "effect"
import * as Millis from "../layers/Millis.js"
import * as MinuteStatsStore from "../queue/MinuteStatsStore.js"
import type { QueueError } from "../queue/Queue.js"
import * as Events from "./Events.js"

export interface MinuteStatsOptions {
  /** How often the counts are written. */
  readonly flushInterval: Duration.Duration
  /** Rows older than this are deleted by the writers. */
  readonly keep: Duration.Duration
}

export const config: Config.Config<MinuteStatsOptions> = Config.all({
  flushInterval: Millis.config("PGFIBER_STATS_FLUSH_MS", { min: 100, max: 3_600_000, fallback: 60_000 }),
  // at least an hour: the charts show the last hour
  keep: Millis.config("PGFIBER_STATS_KEEP_MS", { min: 3_600_000, max: 366 * 86_400_000, fallback: 24 * 3_600_000 })
})

export class MinuteStats extends Context.Tag("pgfiber/MinuteStats")<MinuteStats, {
  /** Counts one settled job (in memory; no statement). */
  readonly record: (event: Events.JobEvent) => void
  /** Writes what has accumulated now. */
  readonly flush: Effect.Effect<void, QueueError>
}>() {}

interface Cell {
  completed: number
  retried: number
  deadLettered: number
  runMsSum: number
  runMsMax: number
  runs: number
}

/** Counts into the given store. */
export const makeWith = (options: MinuteStatsOptions) =>
  Effect.gen(function*() {
    const store = yield* MinuteStatsStore.MinuteStatsStore
    let cells = new Map<string, { minute: number; stage: string; orgKey: string; cell: Cell }>()

    const record = (event: Events.JobEvent) => {
      if (event._tag !== "Completed" && event._tag !== "Retried" && event._tag !== "DeadLettered") return
      const { stage, seconds } = event
      const minute = Math.floor(event.at.getTime() / 60_000) * 60_000
      const orgKey = event.orgId ?? ""
      const key = `${minute}\u0000${stage}\u0000${orgKey}`
      let entry = cells.get(key)
      if (entry === undefined) {
        entry = { minute, stage, orgKey, cell: { completed: 0, retried: 0, deadLettered: 0, runMsSum: 0, runMsMax: 0, runs: 0 } }
        cells.set(key, entry)
      }
      const c = entry.cell
      if (event._tag === "Completed") c.completed++
      else if (event._tag === "Retried") c.retried++
      else c.deadLettered++
      if (seconds !== null) {
        const ms = seconds * 1000
        c.runs++
        c.runMsSum += ms
        if (ms > c.runMsMax) c.runMsMax = ms
      }
    }

    const flush = Effect.suspend(() => {
      if (cells.size === 0) return Effect.void
      const taken = cells
      cells = new Map()
      const rows: Array<MinuteStatsStore.MinuteRow> = [...taken.values()].map((e) => ({
        minute: new Date(e.minute), stage: e.stage, orgKey: e.orgKey, ...e.cell
      }))
      return store.add(rows, options.keep).pipe(
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

    const bus = yield* Events.current
    yield* Effect.forkScoped(
      bus.subscribe({ capacity: 65_536 }).pipe(Stream.runForEach((event) => Effect.sync(() => record(event))))
    )

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

    return MinuteStats.of({ record, flush })
  })

/** Counts into PostgreSQL's `job_stats_minute` (the queue's store over the Db). */
export const make = (options: MinuteStatsOptions) => makeWith(options).pipe(Effect.provide(MinuteStatsStore.layer))

export const layer = (options: MinuteStatsOptions) => Layer.scoped(MinuteStats, make(options))

export const layerFromConfig = Layer.unwrapEffect(Effect.map(config, layer))
