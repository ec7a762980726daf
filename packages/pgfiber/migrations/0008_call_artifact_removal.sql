-- Storage retention for calls: once a call's transcript is stored, its raw upload and its OGG audio may be
-- removed from storage (configurable). The artifact row stays, stamped with when its object was removed, so
-- a redelivered stage can tell "removed on purpose" from "missing" and a reader sees what is gone.
alter table {{schema}}.call_artifacts add column removed_at timestamptz;
