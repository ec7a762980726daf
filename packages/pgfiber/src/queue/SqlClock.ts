/**
 * Whose clock the queue's statements read. In production the database's: every statement falls back to `now()`,
 * so a fleet of processes on different hosts agrees on one clock (a job due, a lease expired, a token refilled).
 * A test gives the statements Effect's Clock instead (`layerTest`): each statement then takes the fiber's current
 * time as a parameter, so `TestClock.adjust` moves the queue's time and the Postgres contract suite sleeps nowhere,
 * as River does (`coalesce(@now::timestamptz, now())`; here production statements keep `now()` itself).
 *
 * The clock is read for each statement, from the caller's fiber (PgQueue resolves the reference once, when it is
 * built, and runs its `now` per statement), and every time in that statement comes from it: a job's times compared
 * anywhere on its path (due on claim, due again on retry) must come from one clock, never part from `now()`.
 */
import { Clock, Context, Effect, Layer } from "effect"
import type { Sql } from "../layers/Db.js"

/** The time a statement runs at: null for the database's own (`now()`), else that instant. */
export type At = Date | null

/**
 * `now`: the effect that reads the time, run in the calling fiber for each statement; null (the default) for the
 * database's clock, where the statements use `now()` as they always did and no effect runs for it.
 */
export class SqlClock extends Context.Reference<SqlClock>()("pgfiber/SqlClock", {
  defaultValue: (): { readonly now: Effect.Effect<Date> | null } => ({ now: null })
}) {}

/** Effect's Clock of the calling fiber (under `it.effect`, the TestClock), as the statements' time. */
export const layerTest: Layer.Layer<SqlClock> = Layer.succeed(SqlClock, {
  now: Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
})

/**
 * `f` with the time its statements run at: with the database's clock `f(null)` as it is (nothing more on the hot
 * path), else `f` of the time read from the calling fiber's clock.
 */
export const withAt = (clock: { readonly now: Effect.Effect<Date> | null }) =>
<A, E, R>(f: (at: At) => Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  clock.now === null ? f(null) : Effect.flatMap(clock.now, f)

/**
 * The statement's time as SQL: with the database's clock (`at` null) `now()` itself (or `statement_timestamp()`,
 * `statement`, where a statement read that), so production statements are the text they always were and their
 * plans the same: the claims run on forced generic plans (JobsSql.claimPlan), where a `coalesce($at, now())`
 * could not be estimated from the column's statistics as `now()` is. With a test clock, its instant as a
 * parameter (ISO text).
 */
export const now = (sql: Sql, at: At, fallback: "now" | "statement" = "now") =>
  at !== null ? sql`${at.toISOString()}::timestamptz` : fallback === "now" ? sql`now()` : sql`statement_timestamp()`
