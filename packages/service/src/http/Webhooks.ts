/**
 * The webhooks group: a tenant manages its own org's subscriptions. Every call runs inside `Db.withOrg` for the
 * key's org and names the org in its query, so another org's webhook is simply not there (404). A URL on a
 * loopback, private or link-local address is refused with 400 unless the operator allows them
 * (`PGFIBER_WEBHOOK_ALLOW_PRIVATE`).
 */
import { HttpApiBuilder } from "@effect/platform"
import { Effect, Redacted } from "effect"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as Subscriptions from "../stages/webhooks/Subscriptions.js"
import { Api, BadRequest, CurrentOrg, NotFound } from "./Api.js"
import { dbFailure } from "./Jobs.js"

export const layer = HttpApiBuilder.group(Api, "webhooks", (handlers) =>
  Effect.gen(function*() {
    const db = yield* Db.Db
    const webhooks = yield* Subscriptions.make
    const asOrg = <A, E>(work: (orgId: string) => Effect.Effect<A, E>) =>
      Effect.flatMap(CurrentOrg, (principal) => db.withOrg(principal.orgId, work(principal.orgId)))
    return handlers
      .handle("createWebhook", ({ payload }) =>
        asOrg((orgId) => webhooks.create({ orgId, url: payload.url, kinds: payload.kinds, stages: payload.stages })).pipe(
          Effect.map(({ secret, webhook }) => ({ ...webhook, secret: Redacted.value(secret) })),
          Effect.tap((w) => Effect.logInfo("webhook created").pipe(Effect.annotateLogs({ webhook: w.id, org: w.orgId }))),
          Effect.catchTags({
            InvalidWebhook: (e) => Effect.fail(new BadRequest({ message: e.message, field: e.field })),
            DbError: dbFailure
          })
        ))
      .handle("listWebhooks", () =>
        asOrg((orgId) => webhooks.list(orgId)).pipe(
          Effect.map((list) => ({ webhooks: list })),
          Effect.catchTag("DbError", dbFailure)
        ))
      .handle("removeWebhook", ({ path }) =>
        asOrg((orgId) => webhooks.remove(path.id, orgId)).pipe(
          Effect.flatMap((removed) =>
            removed
              ? Effect.succeed({ id: path.id, removed: true as const })
              : Effect.fail(new NotFound({ message: `webhook ${path.id} not found` }))),
          Effect.catchTag("DbError", dbFailure)
        ))
  }))
