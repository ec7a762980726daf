/**
 * An org's webhook subscriptions: made, listed and removed by the HTTP API (the key's org) and the CLI (an
 * operator names the org). Making one checks its URL (Target.ts) and its event kinds, and makes its signing
 * secret, which is returned once and never listed. The deliveries are jobs the event log's trigger enqueues
 * (migration 0020) and `Delivery.ts` runs.
 */
import { Context, Data, Effect, Layer, Redacted, Schema } from "effect"
import { randomBytes } from "node:crypto"
import * as Db from "pgfiber/internal/layers/Db.js"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import * as Target from "./Target.js"
import * as WebhooksSql from "./WebhooksSql.js"

export const WebhookView = Schema.Struct({
  id: Schema.String,
  orgId: Schema.String,
  url: Schema.String,
  kinds: Schema.Array(EventLog.Kind),
  /** Only these stages' events; null: every stage. */
  stages: Schema.NullOr(Schema.Array(Schema.String)),
  createdAt: Schema.Date
})
export type WebhookView = typeof WebhookView.Type

const decodeRow = Schema.decodeUnknown(Schema.Struct({
  id: Schema.String,
  org_id: Schema.String,
  url: Schema.String,
  kinds: Schema.Array(EventLog.Kind),
  stages: Schema.NullOr(Schema.Array(Schema.String)),
  created_at: Schema.DateFromSelf
}))
const toView = (row: Record<string, unknown>) =>
  Effect.map(Effect.orDie(decodeRow(row)), (r): WebhookView => ({
    id: r.id, orgId: r.org_id, url: r.url, kinds: r.kinds, stages: r.stages, createdAt: r.created_at
  }))

export class InvalidWebhook extends Data.TaggedError("InvalidWebhook")<{ readonly message: string; readonly field: string }> {}

/** By default a webhook hears how jobs end. */
export const defaultKinds: ReadonlyArray<EventLog.Kind> = ["completed", "dead", "cancelled"]

export class Webhooks extends Context.Tag("pgfiber/Webhooks")<Webhooks, {
  /** A new subscription for the org; the secret (Standard Webhooks `whsec_…`) is in the result and nowhere else. */
  readonly create: (w: {
    readonly orgId: string
    readonly url: string
    readonly kinds?: ReadonlyArray<string> | undefined
    readonly stages?: ReadonlyArray<string> | undefined
  }) => Effect.Effect<{ readonly webhook: WebhookView; readonly secret: Redacted.Redacted<string> }, InvalidWebhook | Db.DbError>
  /** The org's subscriptions; every org's with null (operators). */
  readonly list: (orgId: string | null) => Effect.Effect<ReadonlyArray<WebhookView>, Db.DbError>
  /** False when there is no such subscription (in that org). */
  readonly remove: (id: string, orgId: string | null) => Effect.Effect<boolean, Db.DbError>
}>() {}

export const make = Effect.gen(function*() {
  const db = yield* Db.Db
  const create = (w: Parameters<Context.Tag.Service<Webhooks>["create"]>[0]) =>
    Effect.gen(function*() {
      // read at each call, as each delivery reads it: an operator's change needs no restart of the API
      const allowPrivate = yield* Effect.orDie(Target.allowPrivateConfig)
      if (w.url.length > 2000) return yield* new InvalidWebhook({ message: "url is longer than 2000 characters", field: "url" })
      const url = yield* Target.check(w.url, allowPrivate).pipe(
        Effect.mapError((e) => new InvalidWebhook({ message: e.message, field: "url" }))
      )
      const kinds = w.kinds === undefined || w.kinds.length === 0 ? defaultKinds : w.kinds
      const unknown = kinds.filter((k) => !(EventLog.kinds as ReadonlyArray<string>).includes(k))
      if (unknown.length > 0) {
        return yield* new InvalidWebhook({ message: `unknown event kind(s): ${unknown.join(", ")}; known: ${EventLog.kinds.join(", ")}`, field: "kinds" })
      }
      const stages = w.stages === undefined || w.stages.length === 0 ? null : w.stages
      if (stages !== null && (stages.length > 100 || stages.some((s) => s.length === 0 || s.length > 200))) {
        return yield* new InvalidWebhook({ message: "stages must be 1 to 100 stage names", field: "stages" })
      }
      const secret = `whsec_${randomBytes(32).toString("base64")}`
      const [row] = yield* db.run((sql) => WebhooksSql.insertWebhook(sql, { orgId: w.orgId, url: url.toString(), kinds, stages, secret }))
      return { webhook: yield* toView(row!), secret: Redacted.make(secret) }
    })
  const list = (orgId: string | null) => Effect.flatMap(db.run((sql) => WebhooksSql.listWebhooks(sql, orgId)), Effect.forEach(toView))
  const remove = (id: string, orgId: string | null) =>
    /^[0-9]{1,18}$/.test(id)
      ? Effect.map(db.run((sql) => WebhooksSql.deleteWebhook(sql, id, orgId)), (rows) => rows.length > 0)
      : Effect.succeed(false)
  return Webhooks.of({ create, list, remove })
})

export const layer = Layer.effect(Webhooks, make)
