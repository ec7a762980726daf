-- Documents and their transcriptions (issue 5, seed 003). Inserting a video or audio document enqueues a
-- `transcribe_document` job from a trigger, in the inserting transaction: a rolled-back insert leaves no job,
-- and the jobs table's own NOTIFY trigger wakes the workers at commit. Row-level security by org, as in 0001.

create table {{schema}}.documents (
  id                uuid        primary key default gen_random_uuid(),
  org_id            text        not null,
  -- lower case, so 'Video' cannot silently miss the trigger's 'video'
  media_format      text        not null check (media_format = lower(media_format)),
  canonical_url     text,
  metadata          jsonb       not null default '{}'::jsonb,
  lang              text,
  processing_status text        not null default 'pending'
                    check (processing_status in ('pending', 'processing', 'completed', 'error')),
  processing_error  text,
  -- the job that last moved the document to 'processing': a retry of that same job (its worker died
  -- mid-run) may take the document over, any other job leaves it alone
  processing_job_id bigint,
  processed_at      timestamptz,
  created_at        timestamptz not null default now(),
  updated_at        timestamptz not null default now(),
  -- the target of document_transcriptions' (document_id, org_id) key, so a transcription has its document's org
  unique (id, org_id)
);

create index documents_org on {{schema}}.documents (org_id);
-- the safety sweep: unfinished media documents, oldest first
create index documents_unfinished on {{schema}}.documents (updated_at)
  where processing_status in ('pending', 'processing') and media_format in ('video', 'audio');

create table {{schema}}.document_transcriptions (
  id               bigint      generated always as identity primary key,
  document_id      uuid        not null unique,
  org_id           text        not null,
  -- real JSON: a string holding JSON (seed 003's failure mode) is refused here, not discovered by readers
  segments         jsonb       not null check (jsonb_typeof(segments) = 'array'),
  language         text,
  source           text        not null default 'ai',
  confidence_score double precision,
  metadata         jsonb       not null default '{}'::jsonb,
  created_at       timestamptz not null default now(),
  updated_at       timestamptz not null default now(),
  foreign key (document_id, org_id) references {{schema}}.documents (id, org_id) on delete cascade
);

create index document_transcriptions_org on {{schema}}.document_transcriptions (org_id);

-- One INSERT into jobs per statement, whatever the number of rows. The job matches what
-- TranscribeDocument.jobFor builds (the sweep's re-enqueue): dedupe key `transcribe_document:<id>`, so a
-- live job is never doubled; max_attempts 5 (TranscribeDocument.maxAttempts), the seed's MAX_RETRIES.
-- Only pending rows: a document imported as 'completed' needs no work. Every name is schema-qualified, so
-- the trigger works whatever the inserting session's search_path.
create function {{schema}}.documents_enqueue_transcription() returns trigger
language plpgsql as $$
begin
  insert into {{schema}}.jobs (stage, org_id, subject_id, payload, max_attempts, dedupe_key)
  select 'transcribe_document', d.org_id, d.id::text, jsonb_build_object('documentId', d.id::text), 5,
         'transcribe_document:' || d.id::text
  from new_documents d
  where d.media_format in ('video', 'audio') and d.processing_status = 'pending'
  on conflict (dedupe_key) where dedupe_key is not null do nothing;
  return null;
end
$$;

create trigger documents_enqueue_transcription after insert on {{schema}}.documents
  referencing new table as new_documents
  for each statement execute function {{schema}}.documents_enqueue_transcription();

grant select, insert, update, delete on {{schema}}.documents, {{schema}}.document_transcriptions to pgfiber_tenant;

alter table {{schema}}.documents enable row level security;
alter table {{schema}}.document_transcriptions enable row level security;
create policy documents_by_org on {{schema}}.documents to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
create policy document_transcriptions_by_org on {{schema}}.document_transcriptions to pgfiber_tenant
  using (org_id = current_setting('pgfiber.org_id', true))
  with check (org_id = current_setting('pgfiber.org_id', true));
