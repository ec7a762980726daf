/**
 * Read-only statements for browsing jobs (the dashboard's jobs and job pages): live jobs, the kept history
 * (completed, dead, cancelled) and dead letters of jobs no longer in it, as one list, newest first, with
 * keyset pagination on the job id; a payload search (containment) and an error search (a substring) apply to each
 * part, bounded by the page's limit as the other filters are; and the newest events of the event log, for the
 * dashboard's events page (the log's own reader, EventsSql, reads forward by cursor only). Run under the
 * viewer's org (row-level security) or, for an operator, as the owner. Locking: none; plain reads.
 */
import type { Sql } from "../layers/Db.js"
import { containsPattern } from "./Bulk.js"
import type { BrowseFilter } from "./Job.js"

export const browseJobs = (sql: Sql, f: BrowseFilter, limit: number) => {
  const payload = f.payload ?? null
  const error = f.error === null || f.error === undefined ? null : containsPattern(f.error)
  // rows as they come: Reads decodes them (Job.JobSummaryFromRow)
  return sql<Array<Record<string, unknown>>>`
    select * from (
      select id::text as id, stage, org_id, subject_id,
             case when status = 'queued' and available_at > now() then 'delayed' else status end as status,
             attempts, max_attempts, created_at, updated_at, available_at, last_error, null::text as dead_letter_id
      from jobs
      where (${f.status}::text is null or ${f.status}::text in ('waiting', 'queued', 'delayed', 'running', 'cancelled'))
        and (${payload}::text is null or payload @> ${payload}::text::jsonb)
        and (${error}::text is null or last_error ilike ${error}::text)
      union all
      select id::text, stage, org_id, subject_id, status, attempts, max_attempts, created_at, finished_at, null,
             last_error, null
      from jobs_archive
      where (${f.status}::text is null or ${f.status}::text in ('completed', 'dead', 'cancelled'))
        and (${payload}::text is null or payload @> ${payload}::text::jsonb)
        and (${error}::text is null or last_error ilike ${error}::text)
      union all
      select job_id::text, stage, org_id, subject_id, 'dead', attempts, max_attempts, job_created_at, dead_at, null,
             reason, id::text
      from dead_letters d
      where (${f.status}::text is null or ${f.status}::text = 'dead')
        and (${payload}::text is null or payload @> ${payload}::text::jsonb)
        and (${error}::text is null or reason ilike ${error}::text)
        and not exists (select 1 from jobs_archive a where a.id = d.job_id)
    ) j
    where (${f.stage}::text is null or stage = ${f.stage}::text)
      and (${f.status}::text is null or status = ${f.status}::text)
      and (${f.org}::text is null or org_id = ${f.org}::text)
      and (${f.subject}::text is null or subject_id = ${f.subject}::text)
      and (${f.since}::timestamptz is null or created_at >= ${f.since}::timestamptz)
      and (${f.until}::timestamptz is null or created_at < ${f.until}::timestamptz)
      and (${f.id}::bigint is null or id::bigint = ${f.id}::bigint)
      and (${f.before}::bigint is null or id::bigint < ${f.before}::bigint)
    order by id::bigint desc
    limit ${limit}`
}

/** The newest dead letter a job became, if any. */
export const deadLetterOfJob = (sql: Sql, jobId: string) =>
  sql<Array<{ id: string }>>`select id::text as id from dead_letters where job_id = ${jobId} order by id desc limit 1`

/** Open dead letters matching a filter, oldest first (the targets of a bulk action). */
export const openDeadLetterIds = (sql: Sql, stage: string | null, org: string | null, limit: number) =>
  sql<Array<{ id: string }>>`
    select id::text as id from dead_letters
    where resolution_status is null
      and (${stage}::text is null or stage = ${stage}::text)
      and (${org}::text is null or org_id = ${org}::text)
    order by id limit ${limit}`

/** How many dead letters a purge with these settings would delete (shown before it is confirmed). */
export const countPurgeable = (sql: Sql, olderThanMs: number | null, includeUnresolved: boolean) =>
  sql<Array<{ n: number }>>`
    select count(*)::int as n from dead_letters
    where (${includeUnresolved}::boolean or resolution_status is not null)
      and (${olderThanMs}::float8 is null or dead_at < now() - ${olderThanMs}::float8 * interval '1 millisecond')`

/** How many queued jobs a stage purge would delete (shown before it is confirmed); every org's, as the owner. */
export const countQueued = (sql: Sql, stage: string) =>
  sql<Array<{ n: number }>>`select count(*)::int as n from jobs where stage = ${stage} and status = 'queued'`
