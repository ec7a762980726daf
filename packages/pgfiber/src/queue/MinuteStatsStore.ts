/**
 * Where the per-minute job counts go: `job_stats_minute`, which every process adds its own counts to (concurrent
 * writers add, never overwrite) and which the dashboard's charts read instead of scanning jobs. The runtime counts
 * in memory (runtime/MinuteStats.ts) and hands its rows here, so it runs no SQL of its own; the statement is
 * `StatsSql.upsertMinutes`. Owner-level work: the counts of every org, written as the queue's own bookkeeping.
 */
import { Context, Duration, Effect, Layer } from "effect"
import * as Db from "../layers/Db.js"
import { QueueError } from "./Queue.js"
import * as StatsSql from "./StatsSql.js"

export type MinuteRow = StatsSql.MinuteRow

export class MinuteStatsStore extends Context.Tag("pgfiber/MinuteStatsStore")<MinuteStatsStore, {
  /** Adds these counts to their minutes, and deletes the minutes older than `keep`, in one statement. */
  readonly add: (rows: ReadonlyArray<MinuteRow>, keep: Duration.Duration) => Effect.Effect<void, QueueError>
}>() {}

export const make = Effect.map(Db.Db, (db) =>
  MinuteStatsStore.of({
    add: (rows, keep) =>
      Db.asOwner(db.run((sql) => StatsSql.upsertMinutes(sql, rows, Duration.toMillis(keep)))).pipe(
        Effect.asVoid,
        Effect.mapError((e) =>
          new QueueError({ operation: "MinuteStatsStore.add", message: e.message, code: e.code, unavailable: e.unavailable, cause: e })
        )
      )
  }))

export const layer: Layer.Layer<MinuteStatsStore, never, Db.Db> = Layer.effect(MinuteStatsStore, make)
