/**
 * Authentication, in two places that share one answer. The guard runs first for every request to a keyed
 * route, before a byte of its body is read: a missing, malformed, unknown or revoked key is 401 (the same for
 * each, so a caller learns nothing about which keys exist), a failing client over its budget is 429 with
 * `Retry-After` instead (AuthLimiter, shared with the dashboard's sign-in; a valid key always gets through), a
 * database that cannot be asked is 503. The API's bearer middleware then takes the principal the guard verified
 * instead of asking the database again.
 */
import { HttpServerRequest, HttpServerResponse } from "@effect/platform"
import type { HttpApp } from "@effect/platform"
import { Effect, FiberRef, Layer, Option, Redacted } from "effect"
import * as ApiKeys from "../auth/ApiKeys.js"
import * as AuthLimiter from "../auth/AuthLimiter.js"
import { Authorization, Unauthorized, Unavailable } from "./Api.js"

/** The principal the guard verified for the request in hand. */
const verified = FiberRef.unsafeMake<Option.Option<ApiKeys.Principal>>(Option.none())

const unauthorizedMessage = "a valid API key is required: Authorization: Bearer pgf_…"
const unavailableMessage = "the database is unavailable; try again"

const verify = (keys: ApiKeys.ApiKeys["Type"], token: Redacted.Redacted<string>) =>
  keys.verify(token).pipe(
    Effect.catchTag("DbError", (e) =>
      Effect.zipRight(
        Effect.logWarning("API key lookup failed", e.message),
        Effect.fail(new Unavailable({ message: unavailableMessage }))
      ))
  )

export const layer = Layer.effect(
  Authorization,
  Effect.gen(function*() {
    const keys = yield* ApiKeys.ApiKeys
    return Authorization.of({
      bearer: (token) =>
        Effect.flatMap(FiberRef.get(verified), (already) =>
          Option.isSome(already) ? Effect.succeed(Option.some(already.value)) : verify(keys, token)).pipe(
            Effect.flatMap(Option.match({
              onNone: () => Effect.fail(new Unauthorized({ message: unauthorizedMessage })),
              onSome: (principal) => Effect.succeed(principal)
            })),
            Effect.tap((p) => Effect.annotateCurrentSpan({ "pgfiber.org": p.orgId, "pgfiber.key": p.keyId }))
          )
    })
  })
)

const json = (status: number, tag: string, message: string, headers: Record<string, string> = {}) =>
  HttpServerResponse.unsafeJson({ _tag: tag, message }, { status, headers })

const bearerToken = (header: string | undefined) => {
  const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header ?? "")
  return match === null ? undefined : match[1]!
}

/**
 * Authenticates every request whose path is not in `openPaths` before anything else reads it (the body
 * included), under the failed-authentication limit.
 */
export const guard = (
  openPaths: { readonly has: (path: string) => boolean },
  routePath: (url: string) => string
) =>
  Effect.gen(function*() {
    const keys = yield* ApiKeys.ApiKeys
    const limiter = yield* AuthLimiter.AuthLimiter
    return <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
      Effect.gen(function*() {
        const request = yield* HttpServerRequest.HttpServerRequest
        if (openPaths.has(routePath(request.url))) return yield* app
        const client = limiter.clientOf(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"])
        const token = bearerToken(request.headers["authorization"])
        const outcome = yield* Effect.either(limiter.authenticate(
          client,
          token,
          token === undefined ? Effect.succeedNone : verify(keys, Redacted.make(token))
        ))
        if (outcome._tag === "Left") return json(503, "Unavailable", unavailableMessage)
        switch (outcome.right._tag) {
          case "Verified":
            return yield* Effect.locally(app, verified, Option.some(outcome.right.value))
          case "Refused":
            return json(401, "Unauthorized", unauthorizedMessage)
          case "Throttled": {
            const seconds = AuthLimiter.retryAfterSeconds(outcome.right.retryAfterMs)
            return json(429, "TooManyRequests", `too many failed authentications; retry in ${seconds} s`, { "retry-after": String(seconds) })
          }
        }
      })
  })

/**
 * The routes an operator's key may reach on the API listener although they are the admin listener's (pausing
 * and resuming a stage): an admin key is served; an org's key gets the 404 every admin path answers there (it
 * learns nothing); no key, or a bad one, the API's 401 (429 once throttled), counted like any other attempt.
 */
export const adminKeyGate = Effect.gen(function*() {
  const keys = yield* ApiKeys.ApiKeys
  const limiter = yield* AuthLimiter.AuthLimiter
  return <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const client = limiter.clientOf(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"])
      const token = bearerToken(request.headers["authorization"])
      const outcome = yield* Effect.either(limiter.authenticate(
        client,
        token,
        token === undefined ? Effect.succeedNone : keys.verifyViewer(Redacted.make(token))
      ))
      if (outcome._tag === "Left") return json(503, "Unavailable", unavailableMessage)
      switch (outcome.right._tag) {
        case "Verified":
          return outcome.right.value.admin ? yield* app : json(404, "NotFound", "no such route")
        case "Refused":
          return json(401, "Unauthorized", unauthorizedMessage)
        case "Throttled": {
          const seconds = AuthLimiter.retryAfterSeconds(outcome.right.retryAfterMs)
          return json(429, "TooManyRequests", `too many failed authentications; retry in ${seconds} s`, { "retry-after": String(seconds) })
        }
      }
    })
})
