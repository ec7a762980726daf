/**
 * ConnectionSlots (Db behind a transaction pooler): a pool of N connections never has more than N statements or
 * transactions out, a statement keeps its slot until its promise settles (also once its caller was interrupted),
 * and a transaction whose connection is kept out of the pool keeps its slot.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import * as ConnectionSlots from "../../packages/pgfiber/src/layers/ConnectionSlots.js"

/** A statement porsager has not answered yet: `answer()` settles it. */
const pendingStatement = () => {
  let answer!: () => void
  const promise = new Promise<string>((resolve) => (answer = () => resolve("answered")))
  return { promise, answer: () => answer() }
}

const send = <A>(thunk: () => PromiseLike<A>) => Effect.promise(() => Promise.resolve(thunk()))

/** Whether `fiber` is still waiting after the scheduler has run everything else it can. */
const stillWaiting = <A, E>(fiber: Fiber.RuntimeFiber<A, E>) =>
  Effect.zipRight(Effect.yieldNow({ priority: 0 }).pipe(Effect.repeatN(20)), Effect.map(fiber.poll, (exit) => exit._tag === "None"))

describe("ConnectionSlots", () => {
  it.live("a pool of 2 sends a third statement only once one of the first two is answered", () =>
    Effect.gen(function*() {
      const slots = yield* ConnectionSlots.make(2)
      const a = pendingStatement()
      const b = pendingStatement()
      const sent: Array<string> = []
      const first = yield* Effect.fork(slots.statement(() => (sent.push("a"), a.promise), send))
      const second = yield* Effect.fork(slots.statement(() => (sent.push("b"), b.promise), send))
      const third = yield* Effect.fork(slots.statement(() => (sent.push("c"), Promise.resolve("c")), send))
      expect(yield* stillWaiting(third)).toBe(true)
      expect(sent).toEqual(["a", "b"])
      b.answer()
      expect(yield* Fiber.join(third)).toBe("c")
      expect(yield* Fiber.join(second)).toBe("answered")
      a.answer()
      expect(yield* Fiber.join(first)).toBe("answered")
    }))

  it.live("an interrupted statement keeps its slot until porsager settles it", () =>
    Effect.gen(function*() {
      const slots = yield* ConnectionSlots.make(1)
      const a = pendingStatement()
      const first = yield* Effect.fork(slots.statement(() => a.promise, send))
      yield* Effect.yieldNow()
      yield* Fiber.interrupt(first)
      const next = yield* Effect.fork(slots.statement(() => Promise.resolve("next"), send))
      // the first statement is still on the connection: the next one must not be pipelined behind it
      expect(yield* stillWaiting(next)).toBe(true)
      a.answer()
      expect(yield* Fiber.join(next)).toBe("next")
    }))

  it.live("a transaction holds its slot for its whole life, and for good when its connection is kept out", () =>
    Effect.gen(function*() {
      const slots = yield* ConnectionSlots.make(1)
      const done = yield* Deferred.make<void>()
      const tx = yield* Effect.fork(slots.transaction(() => Deferred.await(done)))
      const during = yield* Effect.fork(slots.statement(() => Promise.resolve("after the transaction"), send))
      expect(yield* stillWaiting(during)).toBe(true)
      yield* Deferred.succeed(done, undefined)
      yield* Fiber.join(tx)
      expect(yield* Fiber.join(during)).toBe("after the transaction")

      yield* slots.transaction((keepOut) => Effect.sync(keepOut))
      const afterKept = yield* Effect.fork(slots.statement(() => Promise.resolve("never"), send))
      expect(yield* stillWaiting(afterKept)).toBe(true)
      yield* Fiber.interrupt(afterKept)
    }))

  it.live("unbounded (straight to PostgreSQL) never waits", () =>
    Effect.gen(function*() {
      const a = pendingStatement()
      const first = yield* Effect.fork(ConnectionSlots.unbounded.statement(() => a.promise, send))
      expect(yield* ConnectionSlots.unbounded.statement(() => Promise.resolve("second"), send)).toBe("second")
      a.answer()
      expect(yield* Fiber.join(first)).toBe("answered")
    }))
})
