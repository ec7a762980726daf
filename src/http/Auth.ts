/**
 * The bearer-key middleware: a missing, malformed, unknown or revoked key is 401 (the same answer for each,
 * so a caller learns nothing about which keys exist); a database that cannot be asked is 503.
 */
import { Effect, Layer, Option } from "effect"
import * as ApiKeys from "../auth/ApiKeys.js"
import { Authorization, Unauthorized, Unavailable } from "./Api.js"

export const layer = Layer.effect(
  Authorization,
  Effect.gen(function*() {
    const keys = yield* ApiKeys.ApiKeys
    return Authorization.of({
      bearer: (token) =>
        keys.verify(token).pipe(
          Effect.catchTag("DbError", (e) =>
            Effect.zipRight(
              Effect.logWarning("API key lookup failed", e.message),
              Effect.fail(new Unavailable({ message: "the database is unavailable; try again" }))
            )),
          Effect.flatMap(Option.match({
            onNone: () => Effect.fail(new Unauthorized({ message: "a valid API key is required: Authorization: Bearer pgf_…" })),
            onSome: (principal) => Effect.succeed(principal)
          })),
          Effect.tap((p) => Effect.annotateCurrentSpan({ "pgfiber.org": p.orgId, "pgfiber.key": p.keyId }))
        )
    })
  })
)
