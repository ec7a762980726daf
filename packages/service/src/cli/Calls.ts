/**
 * `calls add FILE --org ORG` (upload a recording and start the pipeline) and `calls show ID`. The call pipeline
 * (storage, its SQL) is imported when one of them runs, not when the CLI loads.
 */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Option } from "effect"
import { NotFound } from "./Failure.js"
import { operator } from "./Jobs.js"
import * as Output from "./Output.js"

const loadCalls = Effect.promise(() => import("@pgfiber/media/internal/stages/calls/index.js"))
const loadStorage = Effect.promise(() => import("@pgfiber/media/internal/layers/Storage.js"))

const add = Command.make(
  "add",
  {
    file: Args.file({ name: "FILE", exists: "yes" }).pipe(Args.withDescription("The recording (any format ffmpeg reads)")),
    org: Options.text("org").pipe(Options.withDescription("The org the call belongs to (required)"))
  },
  ({ file, org }) =>
    operator(() =>
      Effect.gen(function*() {
        const { Calls } = yield* loadCalls
        const Storage = yield* loadStorage
        const id = yield* Calls.create({ orgId: org, file }).pipe(Effect.provide(Storage.layerFromConfig))
        yield* Effect.logInfo("call created").pipe(Effect.annotateLogs({ callId: id, org }))
        yield* Output.line(id)
      })
    )
).pipe(Command.withDescription("Upload a recording to storage and start its pipeline; prints the call id"))

const show = Command.make(
  "show",
  {
    id: Args.text({ name: "id" }).pipe(Args.withDescription("The call's id")),
    org: Options.text("org").pipe(Options.optional, Options.withDescription("Read as this org (row-level security)"))
  },
  ({ id, org }) =>
    operator(() =>
      Effect.flatMap(loadCalls, ({ Calls }) => Calls.get(id, { orgId: Option.getOrUndefined(org) })).pipe(
        Effect.catchTag("CallNotFound", (e) => Effect.fail(new NotFound({ message: e.message }))),
        Effect.flatMap(Output.json)
      )
    )
).pipe(Command.withDescription("Print a call with its status, artifacts, transcript and analysis as JSON"))

export const calls = Command.make("calls").pipe(
  Command.withDescription("Recorded calls: add a recording, show a call"),
  Command.withSubcommands([add, show])
)
