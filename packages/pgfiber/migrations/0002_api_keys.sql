-- API keys for the HTTP API: each key belongs to one org, and every request made with it runs with that org
-- set for row-level security. Only a SHA-256 of the key's 32-byte random secret is stored; the public prefix
-- finds the row. The tenant role gets no access at all: keys are looked up by the service, before it
-- switches to that role.

create table {{schema}}.api_keys (
  id          bigint generated always as identity primary key,
  org_id      text        not null check (length(org_id) between 1 and 200),
  -- the public part of the key (`pgf_<prefix>_<secret>`): unique, so a lookup is one index probe
  prefix      text        not null unique check (prefix ~ '^[0-9a-f]{12}$'),
  -- sha256(secret): the secret has 256 random bits, so a slow hash would add nothing
  key_hash    bytea       not null check (length(key_hash) = 32),
  name        text        check (length(name) <= 200),
  created_at  timestamptz not null default now(),
  revoked_at  timestamptz
);
create index api_keys_org on {{schema}}.api_keys (org_id);

revoke all on {{schema}}.api_keys from public;
revoke all on {{schema}}.api_keys from pgfiber_tenant;
-- no policy for anyone: should a grant slip in later, the tenant role still sees no row
alter table {{schema}}.api_keys enable row level security;
