/**
 * Every statement on the `webhooks` table (migration 0020), and the two reads a delivery makes. Locking: none
 * beyond the rows written; the table is small and written only when an org changes its subscriptions.
 */
import type { Sql } from "pgfiber/internal/layers/Db.js"
import { idScale } from "pgfiber/internal/queue/EventsSql.js"

export const insertWebhook = (sql: Sql, w: {
  readonly orgId: string
  readonly url: string
  readonly kinds: ReadonlyArray<string>
  readonly stages: ReadonlyArray<string> | null
  readonly secret: string
}) =>
  sql<Array<Record<string, unknown>>>`
    insert into webhooks (org_id, url, kinds, stages, secret)
    values (${w.orgId}, ${w.url}, ${w.kinds as Array<string>}::text[], ${w.stages as Array<string> | null}::text[], ${w.secret})
    returning id::text, org_id, url, kinds, stages, created_at`

/** An org's webhooks (every org's when `orgId` is null: an operator's list), without their secrets. */
export const listWebhooks = (sql: Sql, orgId: string | null) =>
  sql<Array<Record<string, unknown>>>`
    select id::text, org_id, url, kinds, stages, created_at from webhooks
    where (${orgId}::text is null or org_id = ${orgId}::text) order by id`

export const deleteWebhook = (sql: Sql, id: string, orgId: string | null) =>
  sql<Array<{ id: string }>>`
    delete from webhooks where id = ${id}::bigint and (${orgId}::text is null or org_id = ${orgId}::text) returning id::text`

/** What one delivery needs: the webhook (with its secret) and the event, each null when gone. */
export const deliveryParts = (sql: Sql, webhookId: string, eventId: string) =>
  sql<Array<{ webhook: Record<string, unknown> | null; event: Record<string, unknown> | null }>>`
    select
      (select json_build_object('id', id::text, 'orgId', org_id, 'url', url, 'secret', secret) from webhooks where id = ${webhookId}::bigint) as webhook,
      (select json_build_object('id', ${eventId}::text, 'kind', kind, 'jobId', job_ids[place]::text, 'stage', stage,
                                'orgId', org_id, 'subjectId', subject_ids[place], 'attempt', attempts[place],
                                -- one element: shared by every event of the row (EventsSql's header)
                                'data', data[case when cardinality(data) = 1 then 1 else place end], 'at', at)
       -- an event is its row's id × idScale + its 0-based place in the row (EventsSql, migration 0023)
       from job_events, (select (${eventId}::bigint % ${idScale})::int + 1 as place) p
       where id = ${eventId}::bigint / ${idScale} and place <= cardinality(job_ids)) as event`
