/**
 * `pgfiber.echo`: a built-in diagnostic stage, on unless `PGFIBER_ECHO_STAGE=false`. It needs nothing from the
 * outside world, so the quick start shows a job run with nothing configured, and an operator can prove a
 * deployment end to end (`pgfiber enqueue pgfiber.echo '{}'`, then
 * `pgfiber tick --max 1` or a running worker) and rehearse the dead-letter workflow (`"fail": "permanent"`).
 */
import { Config, Duration, Effect, Schema } from "effect"
import { Permanent, Transient } from "pgfiber/internal/JobError.js"
import * as Stage from "pgfiber/internal/runtime/Stage.js"

export const name = "pgfiber.echo"

export const Payload = Schema.Struct({
  message: Schema.optional(Schema.String.pipe(Schema.maxLength(10_000))),
  /** Make the run fail on purpose: `transient` retries with backoff, `permanent` dead-letters at once. */
  fail: Schema.optional(Schema.Literal("transient", "permanent")),
  /** Hold the job this long first (a stand-in for real work). */
  sleepMs: Schema.optional(Schema.Int.pipe(Schema.between(0, 60_000)))
})

export const stage = Stage.make({
  name,
  // a diagnostic tenants may run too: it touches nothing but its own job
  visibility: "public",
  payload: Payload,
  concurrency: 4,
  handler: (payload) =>
    Effect.gen(function*() {
      if (payload.sleepMs) yield* Effect.sleep(Duration.millis(payload.sleepMs))
      if (payload.fail === "permanent") return yield* new Permanent({ message: payload.message ?? "echo: asked to fail permanently" })
      if (payload.fail === "transient") return yield* new Transient({ message: payload.message ?? "echo: asked to fail transiently" })
      yield* Effect.logInfo(`echo: ${payload.message ?? "(no message)"}`)
    })
})

/** On by default, so the service and the CLI agree on it without a variable; `PGFIBER_ECHO_STAGE=false` hides it. */
export const enabled = Config.boolean("PGFIBER_ECHO_STAGE").pipe(Config.withDefault(true))

/** The application's stages, plus the echo stage when enabled. */
export const withEcho = <S extends Stage.Any>(stages: ReadonlyArray<S>) =>
  Effect.map(enabled, (on): ReadonlyArray<S | typeof stage> => (on ? [...stages, stage] : stages))
