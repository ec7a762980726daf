/**
 * Stages as layers: each stage's pool is a Layer on the process's worker runtime (one Waker, one LISTEN), and
 * each stage's own services are provided to its layer alone.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Schema, Scope } from "effect"
import * as MemoryQueue from "../../packages/pgfiber/src/queue/MemoryQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import * as Stage from "../../packages/pgfiber/src/runtime/Stage.js"
import * as Waker from "../../packages/pgfiber/src/runtime/Waker.js"
import * as Worker from "../../packages/pgfiber/src/runtime/Worker.js"
import { workerOptions } from "../support/memoryRuntime.js"
import { waitFor } from "../support/waitFor.js"

const options = workerOptions("layers", { concurrency: { shout: 3 } })

/** A service only the `greet` stage needs, and one only `shout` needs. */
class Greeting extends Context.Tag("test/Greeting")<Greeting, { readonly hello: (name: string) => string }>() {}
class Loudness extends Context.Tag("test/Loudness")<Loudness, { readonly louder: (text: string) => string }>() {}

const done: Array<string> = []
const greet = Stage.make({
  name: "greet",
  payload: Schema.Struct({ name: Schema.String }),
  handler: ({ name }) => Effect.map(Greeting, (g) => void done.push(g.hello(name)))
})
const shout = Stage.make({
  name: "shout",
  payload: Schema.Struct({ text: Schema.String }),
  handler: ({ text }) => Effect.map(Loudness, (l) => void done.push(l.louder(text)))
})

describe("stages as layers", () => {
  it.live("each stage is a layer with its own services, on one runtime: one Waker, both pools run", () =>
    Effect.gen(function*() {
      done.length = 0
      const scope = yield* Scope.make()
      const stages = Layer.mergeAll(
        Worker.stage(greet).pipe(Layer.provide(Layer.succeed(Greeting, { hello: (n) => `hello ${n}` }))),
        Worker.stage(shout).pipe(Layer.provide(Layer.succeed(Loudness, { louder: (t) => t.toUpperCase() })))
      )
      const context = yield* Layer.buildWithScope(
        stages.pipe(Layer.provideMerge(Worker.runtime(options)), Layer.provideMerge(MemoryQueue.layer())),
        scope
      )
      const queue = Context.get(context, Queue.Queue)
      const info = Context.get(context, Worker.WorkerInfo)
      // one runtime for both: WorkerInfo lists both pools, with the configured concurrency
      expect([...info.stages].sort((a, b) => a.name.localeCompare(b.name))).toEqual([
        { name: "greet", concurrency: greet.concurrency },
        { name: "shout", concurrency: 3 }
      ])
      expect(Context.getOption(context, Waker.Waker)._tag).toBe("Some")
      yield* queue.enqueue([{ stage: "greet", payload: { name: "ada" } }, { stage: "shout", payload: { text: "hi" } }])
      yield* waitFor("both stages' jobs to run", Effect.sync(() => done.length === 2))
      expect(done.sort()).toEqual(["HI", "hello ada"])
      const pools = yield* info.pools
      expect(pools.map((p) => p.stage).sort()).toEqual(["greet", "shout"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.live("a stage composed twice into one worker is a defect naming it", () =>
    Effect.gen(function*() {
      const twice = Layer.mergeAll(
        Worker.stage(greet),
        Worker.stage(greet)
      ).pipe(
        Layer.provide(Layer.succeed(Greeting, { hello: (n) => n })),
        Layer.provideMerge(Worker.runtime(options)),
        Layer.provideMerge(MemoryQueue.layer())
      )
      const exit = yield* Effect.exit(Effect.scoped(Layer.build(twice)))
      expect(Exit.isFailure(exit) && String(Exit.isFailure(exit) ? exit.cause : "")).toContain("the stage greet is composed into this worker twice")
    }))

  it.live("Worker.layer is the same composition: the list's stages on one runtime", () =>
    Effect.gen(function*() {
      done.length = 0
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        Worker.layer([greet], options).pipe(
          Layer.provide(Layer.succeed(Greeting, { hello: (n) => `hi ${n}` })),
          Layer.provideMerge(MemoryQueue.layer())
        ),
        scope
      )
      yield* Context.get(context, Queue.Queue).enqueue([{ stage: "greet", payload: { name: "bo" } }])
      yield* waitFor("the greet job to run", Effect.sync(() => done.length === 1))
      expect(done).toEqual(["hi bo"])
      expect(Context.get(context, Worker.WorkerInfo).stages.map((s) => s.name)).toEqual(["greet"])
      yield* Scope.close(scope, Exit.void)
    }))
})
