/**
 * A real PgBouncer (transaction mode) in front of the test database, for the tests that run pgfiber behind one.
 *
 * PgBouncer 1.18 (Debian 12) does not pass `search_path` on, so it is told to ignore it, and the role it logs in
 * as carries the schema in its own settings (`alter role … set search_path`), as docs/operations.md says.
 * `.ci/run` installs pgbouncer; elsewhere the tests are skipped when it is missing, unless PGFIBER_REQUIRE_PGBOUNCER=1.
 */
import { Effect } from "effect"
import { rawSql } from "./pg.js"

export { pgbouncerBin, type PgBouncerOptions, startPgBouncer } from "./pgbouncerProcess.js"

/** CI sets PGFIBER_REQUIRE_PGBOUNCER=1: a missing pgbouncer fails the test instead of skipping it. */
export const pgbouncerRequired = process.env.PGFIBER_REQUIRE_PGBOUNCER === "1"

/**
 * A login role whose own settings carry the schema (PgBouncer 1.18 cannot pass search_path on); its sessions are
 * ended and it is dropped at the end. `suffix` tells several roles on one schema apart.
 */
export const roleFor = (schema: string, suffix = "r") =>
  Effect.gen(function*() {
    const role = `${schema}_${suffix}`
    const password = `pw_${Math.random().toString(36).slice(2)}`
    const admin = rawSql()
    yield* Effect.addFinalizer(() =>
      Effect.promise(async () => {
        await admin`select pg_terminate_backend(pid) from pg_stat_activity where usename = ${role}`
        await admin.unsafe(`drop role if exists ${role}`)
        await admin.end({ timeout: 5 })
      }).pipe(Effect.ignore)
    )
    yield* Effect.promise(async () => {
      await admin.unsafe(`create role ${role} login superuser password '${password}'`)
      await admin.unsafe(`alter role ${role} set search_path = ${schema}`)
    })
    return { role, password, admin }
  })
