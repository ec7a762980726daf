-- An insert of jobs that are not due yet says so: besides the stage's NOTIFY (as before), the payload
-- 'pgfiber:later' asks every worker's Waker to re-arm its next-due timer. Workers no longer look up the next
-- due time after every claim that comes back short (at a steady rate that was one more statement per job,
-- as costly on the server as the claim), so a job inserted for later must tell them itself.
-- Still one NOTIFY per stage per statement, plus at most one 'pgfiber:later'; sent at commit.
create or replace function {{schema}}.jobs_notify_inserted() returns trigger
language plpgsql as $$
declare
  inserted_stage text;
begin
  for inserted_stage in select distinct stage from new_jobs loop
    perform pg_notify('{{schema}}_jobs', inserted_stage);
  end loop;
  if exists (select 1 from new_jobs where available_at > now()) then
    perform pg_notify('{{schema}}_jobs', 'pgfiber:later');
  end if;
  return null;
end
$$;
