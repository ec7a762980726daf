/** Test helpers for the process environment. */
import { Effect } from "effect"

/** Sets `process.env[name]` for the life of the scope, then puts back what was there (or removes it). */
export const withProcessEnv = (name: string, value: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const before = process.env[name]
      process.env[name] = value
      return before
    }),
    (before) => Effect.sync(() => (before === undefined ? delete process.env[name] : (process.env[name] = before)))
  )
