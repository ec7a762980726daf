/**
 * Every statement that reads or prunes the event log (`job_events`, migration 0020). The rows are written by the
 * job statements themselves (JobsSql's `logged` CTEs, the insert trigger); nothing here writes an event.
 *
 * The log's rows hold up to `jobsPerRow` events each (one per job, migration 0023): a row is what one statement
 * logged for one org, stage and kind. An event's id is its row's id × `idScale` + its place in the row, so
 * event ids are integers in the log's order and a reader resumes inside a row. A row's `data` holds each event's
 * data in place order, or one element that every event of the row shares (a claim's worker: `JobsSql.logEvents`'
 * `shared`); a reader takes `data[1]` when its cardinality is 1 (for a row of one job both mean the same).
 *
 * Readers go in (tx, id) order, and only over rows whose transaction is older than every transaction still
 * running (`tx < pg_snapshot_xmin(pg_current_snapshot())`): those are all committed or rolled back, and no row
 * can be written later with a smaller tx, so a cursor never passes a row that appears behind it. Going by id
 * alone could: ids are handed out when a row is written, not when it commits.
 *
 * And only over what a crash cannot take back (`durableFence`): a transaction can end before its WAL is written
 * (a claim commits with synchronous_commit off; an abort never waits), and after a crash of the server such a
 * transaction is gone and its xid (and the ids of its rows) are handed out again, below a cursor that passed
 * them. So a read answers only once every transaction its snapshot sees as ended is on disk.
 */
import type { Sql } from "../layers/Db.js"

/** The most events one row of the log holds (the writers' chunk; the table's CHECK). */
export const jobsPerRow = 1000
/** An event's id is its row's id × this + its 0-based place in the row (> `jobsPerRow`). */
export const idScale = 1024

/** Which events a reader wants; null fields do not filter. `org` null: every org (owner work only). */
export interface EventFilter {
  readonly org: string | null
  readonly stages: ReadonlyArray<string> | null
  readonly kinds: ReadonlyArray<string> | null
  readonly jobId: string | null
  readonly subjectId: string | null
}

/**
 * Makes every transaction the statement's snapshot sees as ended durable before the statement answers: when WAL
 * written so far is not yet flushed (`insert > flush`, read in that order), the statement's own transaction
 * writes a WAL record (an empty transactional logical message, which touches no table and takes no lock) and so
 * commits by flushing the WAL up to its commit record, which follows the end of every transaction it saw
 * (with synchronous_commit on for it, whatever the session's). Nothing is written while the WAL is flushed
 * already (only synchronous commits since, or nothing at all). True when it wrote.
 */
const durableFence = (sql: Sql) =>
  sql`case when pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()
      then set_config('synchronous_commit', case when current_setting('synchronous_commit') = 'off' then 'on' else current_setting('synchronous_commit') end, true) is not null
           and pg_logical_emit_message(true, 'pgfiber.events', '') is not null
      else false end`

/** The order of a row's fields in `readEvents`' arrays. */
export const rowFields = ["id", "tx", "kind", "stage", "orgId", "at", "jobIds", "subjectIds", "attempts", "data"] as const

/**
 * The next rows after the cursor (tx, id: an event id), in (tx, id) order, of transactions older than every
 * running one, holding at least `limit` events past the cursor when there are so many (the caller unnests them
 * and keeps `limit`; a row costs the server one array of each field, not an object per event, and a follower
 * reads every event of a busy queue); whether rows were left for the next read (`truncated`); the horizon (that
 * oldest running xid) it read up to; and whether rows at or past the horizon are waiting for an older
 * transaction to end (`held`: the caller looks again soon, since that transaction may write no event and so
 * NOTIFY nothing). Rows of other jobs or subjects than the filter's are left out here; the caller drops their
 * other events. Locking: none; the (tx, id) index from the cursor; at most one WAL record and its flush (the fence).
 */
export const readEvents = (sql: Sql, cursor: { readonly tx: string; readonly id: string }, f: EventFilter, limit: number) =>
  sql<Array<{ rows: ReadonlyArray<ReadonlyArray<unknown>>; truncated: boolean; horizon: string; fenced: boolean; held: boolean }>>`
    with horizon as (
      select pg_snapshot_xmin(pg_current_snapshot()) as xmin, ${durableFence(sql)} as fenced,
             -- every job id is at most the sequence's last value: below 2^53 they go as JSON numbers, which the
             -- reader parses faster than strings (and the server writes faster than text)
             coalesce(pg_sequence_last_value(pg_get_serial_sequence('jobs', 'id')::regclass), 0) < 9007199254740992 as ids_fit
    ), scanned as (
      -- the events before each row (its first row's, of which some may be behind the cursor, too), from each
      -- row's stored size (migration 0025): the arrays are read only for the page's rows
      select e.id, e.tx, sum(e.jobs) over (order by e.tx, e.id) - e.jobs as before
      from job_events e
      where (e.tx, e.id) >= (${cursor.tx}::xid8, ${cursor.id}::bigint / ${idScale})
        and e.tx < (select xmin from horizon)
        and (${f.org}::text is null or e.org_id = ${f.org}::text)
        and (${f.stages}::text[] is null or e.stage = any(${f.stages}::text[]))
        and (${f.kinds}::text[] is null or e.kind = any(${f.kinds}::text[]))
        and (${f.jobId}::bigint is null or ${f.jobId}::bigint = any(e.job_ids))
        and (${f.subjectId}::text is null or ${f.subjectId}::text = any(e.subject_ids))
      order by e.tx, e.id
      limit ${limit}
    ), page as (
      select e.* from scanned s join job_events e on e.id = s.id where s.before < ${limit + idScale}::bigint
    )
    -- each row an array of its fields in \`rowFields\` order, its time as epoch ms (see EventLog.unnestRow)
    select coalesce((
      select json_agg(json_build_array(
        p.id::text, p.tx::text, p.kind, p.stage, p.org_id, floor(date_part('epoch', p.at) * 1000 + 0.0005),
        case when (select ids_fit from horizon) then to_json(p.job_ids) else to_json(p.job_ids::text[]) end,
        p.subject_ids, p.attempts, p.data) order by p.tx, p.id)
      from page p), '[]'::json) as rows,
      (select count(*) from scanned) >= ${limit} or exists (select 1 from scanned where before >= ${limit + idScale}::bigint) as truncated,
      (select xmin::text from horizon) as horizon,
      -- in the answer, so the fence is evaluated (and a reader can tell it wrote)
      (select fenced from horizon) as fenced,
      exists (select 1 from job_events e where e.tx >= (select xmin from horizon)) as held`

/**
 * Where a reader resumes after event `id` (a client's Last-Event-ID): that event's own (tx, id) when it is still
 * kept and the reader may see it; the log's beginning when it is older than anything kept (it was pruned: the
 * reader gets everything retained); else nothing (unknown: the caller starts from now). Locking: none.
 */
export const cursorAfter = (sql: Sql, id: string, org: string | null) =>
  sql<Array<{ tx: string | null; oldest: string | null }>>`
    select (select tx::text from job_events
            where id = ${id}::bigint / ${idScale} and (${org}::text is null or org_id = ${org}::text)) as tx,
           (select (min(id) * ${idScale})::text from job_events) as oldest`

/**
 * The cursor "from now": the oldest running transaction (every row before it is settled and, by the fence, on
 * disk). Locking: none.
 */
export const horizon = (sql: Sql) =>
  sql<Array<{ xmin: string; fenced: boolean }>>`select pg_snapshot_xmin(pg_current_snapshot())::text as xmin, ${durableFence(sql)} as fenced`

/**
 * Deletes up to `limit` of the oldest events written before the retention: the first `limit` ids, of which
 * those old enough (the log is appended in roughly `at` order, so this never scans the kept rows). Locking: SKIP
 * LOCKED is not needed (no one updates events); concurrent pruners may delete the same rows, harmlessly.
 */
export const pruneEvents = (sql: Sql, retentionMs: number, limit: number) =>
  sql<Array<{ n: number }>>`
    with gone as (
      delete from job_events where id = any(array(
        select id from (select id, at from job_events order by id limit ${limit}) oldest
        where at < now() - ${retentionMs}::float8 * interval '1 millisecond'))
      returning jobs as n
    )
    select coalesce(sum(n), 0)::int as n from gone`

/**
 * The newest `limit` events matching the filter, newest first, one per job of each row (an event's id is its row's
 * id × idScale + its 0-based place, as the log's reader numbers them). Newest by row id: the order rows were written
 * in, which is the log's read order but for transactions that overlapped. Walks the primary key backwards.
 */
export const recentEvents = (
  sql: Sql,
  f: { readonly org: string | null; readonly stages: ReadonlyArray<string> | null; readonly kinds: ReadonlyArray<string> | null },
  limit: number
) =>
  sql<Array<Record<string, unknown>>>`
    select (e.id * ${idScale} + u.n - 1)::text as id, e.kind, u.job_id::text as job_id, e.stage, e.org_id,
           e.subject_ids[u.n] as subject_id, coalesce(e.attempts[u.n], 0) as attempt,
           -- one element: shared by every event of the row (this file's header)
           e.data[case when cardinality(e.data) = 1 then 1 else u.n end] as data, e.at
    from (
      select * from job_events
      where (${f.org}::text is null or org_id = ${f.org}::text)
        and (${f.stages as Array<string> | null}::text[] is null or stage = any(${f.stages as Array<string> | null}::text[]))
        and (${f.kinds as Array<string> | null}::text[] is null or kind = any(${f.kinds as Array<string> | null}::text[]))
      order by id desc
      limit ${limit}
    ) e
    cross join lateral unnest(e.job_ids) with ordinality as u(job_id, n)
    order by e.id desc, u.n desc
    limit ${limit}`
