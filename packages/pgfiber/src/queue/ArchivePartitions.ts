/**
 * The kept history's partitions by finish time (migration 0022): created ahead so a settle's insert always finds
 * its day's partition, and dropped whole once every row in one is past its retention, so pruning a day of
 * history is one `drop table` instead of a day of row deletes and the vacuum work they leave. The batched
 * delete (`Queue.history.prune`) still takes rows whose retention ends before their partition's does.
 * Both statements are functions in the database, so pg_cron (deploy/pg_cron.sql) can run them as well.
 */
import { Duration, Effect } from "effect"
import * as Db from "../layers/Db.js"

export interface Options {
  /** How long a period each new partition covers (1 hour to 31 days; a day by default). */
  readonly width?: Duration.Duration
  /** How far past `now` partitions exist after `maintain` (2 days by default). */
  readonly ahead?: Duration.Duration
  /** The time to maintain for (the database's clock by default): a parameter so tests need not wait days. */
  readonly now?: Date
}

export interface Maintained {
  /** Partitions dropped because no row in them was still kept. */
  readonly dropped: ReadonlyArray<string>
  /** Partitions created ahead. */
  readonly created: ReadonlyArray<string>
}

const interval = (d: Duration.Duration) => `${Duration.toMillis(d)} milliseconds`

/**
 * Drops the wholly expired partitions, then creates those missing up to `now + ahead`. Locking: an advisory
 * lock per schema (a second maintainer skips); each create or drop locks the archive for a moment and gives up
 * after 2 s rather than queue the settles behind a long read of the history.
 */
export const maintain = (options: Options = {}) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const now = options.now ?? null
    const dropped = yield* Db.asOwner(db.run((sql) =>
      sql<Array<{ name: string }>>`
        select name from archive_drop_expired_partitions(coalesce(${now}::timestamptz, now())) as name`
    ))
    const created = yield* Db.asOwner(db.run((sql) =>
      sql<Array<{ name: string }>>`
        select name from archive_create_partitions(
          ${interval(options.width ?? Duration.days(1))}::interval, ${interval(options.ahead ?? Duration.days(2))}::interval,
          coalesce(${now}::timestamptz, now())) as name`
    ))
    return { dropped: dropped.map((r) => r.name), created: created.map((r) => r.name) } satisfies Maintained
  }).pipe(Effect.withSpan("ArchivePartitions.maintain"))

export interface Partition {
  readonly name: string
  /** null: the partition that took the archive as it was before 0022 (every earlier finish time). */
  readonly startsAt: Date | null
  readonly endsAt: Date
}

/** The range partitions, oldest first (the default one, for rows no period covers, is not listed). */
export const list = Effect.gen(function*() {
  const db = yield* Db.Db
  const rows = yield* Db.asOwner(db.run((sql) =>
    sql<Array<{ name: string; starts_at: Date | null; ends_at: Date }>>`
      select name, starts_at, ends_at from jobs_archive_partitions order by ends_at`
  ))
  return rows.map((r): Partition => ({ name: r.name, startsAt: r.starts_at, endsAt: r.ends_at }))
})
