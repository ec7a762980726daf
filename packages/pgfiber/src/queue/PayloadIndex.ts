/**
 * Keeps the live jobs' payload index (`jobs_payload`, GIN, migration 0019) from growing without end. GIN keeps
 * an entry key after the last row that had it is gone, so on a queue, where every row is short-lived, the index
 * grows with every distinct payload value ever queued: 380 MB after 10M jobs with unique payloads while the table
 * held a few thousand rows (docs/benchmarks.md, the soak). The housekeeping stage rebuilds it with
 * `REINDEX INDEX CONCURRENTLY` (reads and writes go on; claims never use this index) once it is larger than the
 * table itself and than `minBytes`: a payload index that is still smaller than the rows it indexes is not bloated.
 */
import { type Context, Effect } from "effect"
import * as Db from "../layers/Db.js"

export interface Options {
  /** Never rebuild an index smaller than this (64 MiB by default). */
  readonly minBytes?: number
}

export interface Upkeep {
  /** The index's size before, in bytes (null: there is no payload index, e.g. dropped by an operator). */
  readonly indexBytes: number | null
  /** The table's size (heap), in bytes. */
  readonly tableBytes: number
  /** Whether it was rebuilt, and its size after. */
  readonly rebuilt: boolean
  readonly afterBytes: number | null
  /** Invalid copies a failed earlier rebuild left, dropped first. */
  readonly droppedLeftovers: ReadonlyArray<string>
}

export const defaultMinBytes = 64 * 1024 * 1024

const sizes = (db: Context.Tag.Service<Db.Db>) =>
  db.run((sql) =>
    sql<Array<{ index_bytes: string | null; table_bytes: string }>>`
      select pg_relation_size(to_regclass('jobs_payload'))::text as index_bytes,
             pg_relation_size(to_regclass('jobs'))::text as table_bytes`
  ).pipe(Effect.map(([r]) => ({
    index: r?.index_bytes == null ? null : Number(r.index_bytes),
    table: Number(r?.table_bytes ?? 0)
  })))

/**
 * Rebuilds `jobs_payload` when it has outgrown the table. Each statement runs on its own, outside any transaction
 * (REINDEX CONCURRENTLY cannot run in one), as the schema's owner.
 */
export const upkeep = (options: Options = {}) =>
  Db.asOwner(Effect.gen(function*() {
    const db = yield* Db.Db
    // a rebuild that failed (a cancel, a lost connection) leaves an invalid copy behind, which every write to
    // `jobs` would keep up to date for nothing: dropped before anything else
    const leftovers = yield* db.run((sql) =>
      sql<Array<{ name: string }>>`
        select c.relname as name from pg_index i join pg_class c on c.oid = i.indexrelid
        where i.indrelid = to_regclass('jobs') and not i.indisvalid and c.relname like 'jobs_payload_ccnew%'`
    )
    for (const { name } of leftovers) yield* db.run((sql) => sql`drop index concurrently if exists ${sql(name)}`)
    const before = yield* sizes(db)
    const rebuilt = before.index !== null && before.index > Math.max(options.minBytes ?? defaultMinBytes, before.table)
    if (rebuilt) yield* db.run((sql) => sql`reindex index concurrently jobs_payload`)
    const afterBytes = rebuilt ? (yield* sizes(db)).index : before.index
    return { indexBytes: before.index, tableBytes: before.table, rebuilt, afterBytes, droppedLeftovers: leftovers.map((l) => l.name) } satisfies Upkeep
  })).pipe(Effect.withSpan("PayloadIndex.upkeep"))
