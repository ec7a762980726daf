-- Tenancy all the way through: dedupe keys are per org.
--
-- `jobs_dedupe` becomes unique on (org_id, dedupe_key) among live jobs (finished ones have left the table),
-- NULLS NOT DISTINCT so that jobs with no org share one space of their own: two orgs using the same key each
-- get their own job, one org (or the no-org space) gets its live job back. Every enqueue names it the same
-- way: `on conflict (org_id, dedupe_key) where dedupe_key is not null` (JobsSql.insertJobs, the documents
-- trigger below). PostgreSQL 15 or later (NULLS NOT DISTINCT).

drop index {{schema}}.jobs_dedupe;
create unique index jobs_dedupe on {{schema}}.jobs (org_id, dedupe_key) nulls not distinct
  where dedupe_key is not null;

-- the documents trigger from 0004, with the new conflict target (its jobs carry the document's org)
create or replace function {{schema}}.documents_enqueue_transcription() returns trigger
language plpgsql as $$
begin
  insert into {{schema}}.jobs (stage, org_id, subject_id, payload, max_attempts, dedupe_key)
  select 'transcribe_document', d.org_id, d.id::text, jsonb_build_object('documentId', d.id::text), 5,
         'transcribe_document:' || d.id::text
  from new_documents d
  where d.media_format in ('video', 'audio') and d.processing_status = 'pending'
  on conflict (org_id, dedupe_key) where dedupe_key is not null do nothing;
  return null;
end
$$;
