-- A change to a stage's run-time limits (`stage_limits`: `pgfiber limits set|reset`, PUT/DELETE /limits/:stage)
-- says so at commit: every worker's Waker hears 'pgfiber:limits' on the jobs channel, its queue reads the
-- overrides again at its next claim, and its pools held back by a limit claim again under the new ones. Claims
-- no longer read the overrides again every second while they run (one statement a second per claiming process);
-- a process that misses the notification reads them within 10 s, or at once when its LISTEN connection is back.
--
-- One trigger function for a table whose change is a topic on the jobs channel: the topic is the trigger's
-- argument. `stage_controls` (0010) had a function of its own for 'pgfiber:stages'; its trigger uses this one now.
create function {{schema}}.notify_jobs_channel() returns trigger
language plpgsql as $$
begin
  perform pg_notify('{{schema}}_jobs', tg_argv[0]);
  return null;
end
$$;

create trigger stage_limits_notify after insert or update or delete on {{schema}}.stage_limits
  for each statement execute function {{schema}}.notify_jobs_channel('pgfiber:limits');

drop trigger stage_controls_notify on {{schema}}.stage_controls;
create trigger stage_controls_notify after insert or update or delete on {{schema}}.stage_controls
  for each statement execute function {{schema}}.notify_jobs_channel('pgfiber:stages');
drop function {{schema}}.stage_controls_notify();
