/**
 * How the API answers a database failure: unavailable → 503; a transaction PostgreSQL rolled back for another's
 * sake (a deadlock, a serialization failure) → 503 "try again", since nothing was written and the same request
 * succeeds; anything else is a bug (a defect, logged, answered 500). The same whether the failure reaches the face
 * from Db itself or from the Queue (the Queue's own error, mapped at PgQueue's edge).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import { dbFailure } from "../../packages/service/src/http/Jobs.js"

const failure = (code: string | undefined, unavailable = false) =>
  new Db.DbError({ message: `failed with ${code}`, code, unavailable, cause: undefined })

describe("dbFailure", () => {
  it.effect("a deadlock or a serialization failure is a 503 to retry, not a 500", () =>
    Effect.gen(function*() {
      for (const code of ["40P01", "40001"]) {
        const exit = yield* Effect.exit(dbFailure(failure(code)))
        expect(Exit.isFailure(exit) && Cause.isFailType(exit.cause) && exit.cause.error._tag).toBe("Unavailable")
      }
    }))

  it.effect("the database unavailable is a 503; any other error is a defect (500)", () =>
    Effect.gen(function*() {
      const down = yield* Effect.exit(dbFailure(failure("ECONNREFUSED", true)))
      expect(Exit.isFailure(down) && Cause.isFailType(down.cause) && down.cause.error._tag).toBe("Unavailable")
      const bug = yield* Effect.exit(dbFailure(failure("42P01")))
      expect(Exit.isFailure(bug) && Cause.isDie(bug.cause)).toBe(true)
    }))

  it.effect("a failure under the Queue (QueueError) answers exactly as the Db failure it came from", () =>
    Effect.gen(function*() {
      for (const [code, unavailable] of [["ECONNREFUSED", true], ["40P01", false], ["40001", false], ["42P01", false]] as const) {
        const fromDb = yield* Effect.exit(dbFailure(failure(code, unavailable)))
        const fromQueue = yield* Effect.exit(dbFailure(PgQueue.queueError("Queue.enqueue", failure(code, unavailable))))
        expect(Exit.isFailure(fromQueue) && Cause.isDie(fromQueue.cause)).toBe(Exit.isFailure(fromDb) && Cause.isDie(fromDb.cause))
        // the same response body: the same error, field for field (status 503 is Unavailable's)
        const answer = (exit: typeof fromDb) => (Exit.isFailure(exit) && Cause.isFailType(exit.cause) ? { ...exit.cause.error } : "defect")
        expect(answer(fromQueue)).toEqual(answer(fromDb))
      }
    }))
})
