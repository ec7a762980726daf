/**
 * The calls group: `POST /calls` takes a recording (a multipart upload in the part `file`, or JSON
 * `{ "uri": … }` naming an object already in storage) and starts the pipeline; `GET /calls/:id` reads the
 * call back with its artifacts, transcript and analysis. Both act for the API key's org under row-level
 * security (Calls.create / Calls.get with the org), so another org's call is not found. A URI must name an object
 * under the org's storage prefix (or one STORAGE_ORG_PREFIXES allows it); storage keys come back relative to it.
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Queue from "pgfiber/internal/queue/Queue.js"
import { Calls } from "@pgfiber/media/internal/stages/calls/index.js"
import * as Storage from "@pgfiber/media/internal/layers/Storage.js"
import { Api, BadRequest, CurrentOrg, NotFound, Unavailable } from "./Api.js"
import { dbFailure } from "./Jobs.js"

/** A call as its org sees it: storage keys relative to the org's prefix, no server path or URI. */
export const callView = (call: Calls.Call) => {
  const { sourceUri: _uri, ...rest } = call
  return {
    ...rest,
    sourceKey: Calls.keyForOrg(call.orgId, call.sourceKey),
    artifacts: call.artifacts.map((a) => ({ ...a, storageKey: Calls.keyForOrg(call.orgId, a.storageKey) }))
  }
}

export const layer = HttpApiBuilder.group(Api, "calls", (handlers) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const queue = yield* Queue.Queue
    const storage = yield* Storage.Storage
    const provide = <A, E>(effect: Effect.Effect<A, E, Db.Db | Queue.Queue | Storage.Storage>) =>
      effect.pipe(Effect.provideService(Db.Db, db), Effect.provideService(Queue.Queue, queue), Effect.provideService(Storage.Storage, storage))

    const orgPrefixes = yield* Calls.orgPrefixesConfig

    return handlers
      .handle("createCall", ({ payload }) =>
        Effect.gen(function*() {
          const { orgId } = yield* CurrentOrg
          const id = yield* provide(
            "uri" in payload
              ? Calls.create({ orgId, uri: payload.uri, sourcePrefixes: orgPrefixes.get(orgId) ?? [] })
              : Calls.create({ orgId, file: payload.file.path })
          )
          yield* Effect.logInfo("call created").pipe(Effect.annotateLogs({ callId: id, org: orgId }))
          return { id, status: "queued" as const }
        }).pipe(
          Effect.catchTags({
            InvalidCall: (e) => Effect.fail(new BadRequest({ message: e.message })),
            InvalidJob: (e) => Effect.fail(new BadRequest({ message: e.message, field: e.field })),
            Permanent: (e) => Effect.fail(new BadRequest({ message: e.message })),
            Transient: (e) =>
              Effect.zipRight(
                Effect.logWarning("storage unavailable while creating a call", e.message),
                Effect.fail(new Unavailable({ message: "storage is unavailable; try again" }))
              ),
            DbError: dbFailure,
            QueueError: dbFailure
          })
        ))
      .handle("getCall", ({ path }) =>
        Effect.flatMap(CurrentOrg, ({ orgId }) => provide(Calls.get(path.id, { orgId }))).pipe(
          Effect.map(callView),
          Effect.catchTags({
            CallNotFound: (e) => Effect.fail(new NotFound({ message: e.message })),
            DbError: dbFailure
          })
        ))
  }))
