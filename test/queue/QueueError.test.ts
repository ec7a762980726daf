/**
 * PgQueue's edge: a Db failure becomes the Queue's own error, named by the operation, keeping PostgreSQL's message,
 * code and whether the database was unreachable; what it keeps of its cause never shows a secret (a Redacted value
 * stays redacted in its text, its JSON and its encoded form, which is how it is stored or sent).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Either, Redacted, Schema } from "effect"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"

const secret = "hunter2-not-for-logs"

describe("QueueError", () => {
  it.effect("a Db failure under the Queue is a QueueError with the operation, message, code and unavailable", () =>
    Effect.gen(function*() {
      const down = new Db.DbError({ message: "connect ECONNREFUSED 127.0.0.1:5432", code: "ECONNREFUSED", unavailable: true, cause: undefined })
      const failed = yield* Effect.either(PgQueue.atEdge("Queue.claim")(Effect.fail(down)))
      expect(Either.isLeft(failed) && failed.left).toMatchObject({
        _tag: "QueueError",
        operation: "Queue.claim",
        message: "connect ECONNREFUSED 127.0.0.1:5432",
        code: "ECONNREFUSED",
        unavailable: true
      })
      // the Queue's other errors pass through the edge as they are
      const invalid = new Queue.InvalidJob({ field: "stage", message: "no such stage" })
      const refused = yield* Effect.either(PgQueue.atEdge("Queue.enqueue")(Effect.fail(invalid)))
      expect(Either.isLeft(refused) && refused.left).toBe(invalid)
    }))

  it("keeps a Redacted value of its cause redacted: in its text, its JSON, its encoded form and a logged Cause", () => {
    const cause = { options: { url: Redacted.make(`postgres://app:${secret}@db:5432/app`) } }
    const e = PgQueue.queueError("Queue.settle", new Db.DbError({ message: "terminating connection", code: "57P01", unavailable: true, cause }))
    expect(e.operation).toBe("Queue.settle")
    const shown = [
      String(e),
      JSON.stringify(e),
      JSON.stringify(Schema.encodeSync(Queue.QueueError)(e)),
      Cause.pretty(Cause.fail(e))
    ]
    for (const text of shown) expect(text).not.toContain(secret)
    // stored or sent, the cause is its name and message only
    expect(Schema.encodeSync(Queue.QueueError)(e).cause).toEqual({ name: "DbError", message: "terminating connection" })
  })
})
