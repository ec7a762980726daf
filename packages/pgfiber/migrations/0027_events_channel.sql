-- The event log's NOTIFY moves to a channel of its own, '<schema>_events'. On the jobs channel every worker heard
-- it: three more notifications per job (enqueued, started, finished) for each worker process, on the path of the
-- wake-up that matters (the stage's NOTIFY). (Each listening backend still reads every NOTIFY of the database, as
-- PostgreSQL signals them all whatever the channel; it no longer sends these to workers.) Only processes that
-- follow the log (an SSE client, `pgfiber events`, `Events.follow`, an open dashboard) LISTEN on the new channel,
-- and only while they follow (runtime/EventFeed.ts), on the process's one LISTEN connection.
create or replace function {{schema}}.job_events_notify() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from new_events) then
    perform pg_notify('{{schema}}_events', 'pgfiber:events');
    if exists (select 1 from {{schema}}.webhooks) then
      insert into {{schema}}.jobs (stage, org_id, subject_id, payload, max_attempts)
      select 'pgfiber.webhook', w.org_id, u.job_id::text,
             jsonb_build_object('webhookId', w.id::text, 'eventId', (e.id * 1024 + u.n - 1)::text), 10
      from new_events e
      cross join lateral unnest(e.job_ids) with ordinality as u(job_id, n)
      join {{schema}}.webhooks w on w.org_id = e.org_id and e.kind = any(w.kinds) and (w.stages is null or e.stage = any(w.stages))
      where e.stage <> 'pgfiber.webhook'
      order by e.id, u.n, w.id;
    end if;
  end if;
  return null;
end
$$;
