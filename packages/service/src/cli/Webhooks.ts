/**
 * `webhooks add|list|remove`: an operator manages an org's webhook subscriptions (the HTTP API's
 * `/webhooks` is the tenant's own way). `add` prints the signing secret once.
 */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Option, Redacted } from "effect"
import * as Subscriptions from "../stages/webhooks/Subscriptions.js"
import * as Env from "./Env.js"
import { NotFound, UsageError } from "./Failure.js"
import { operator } from "./Jobs.js"
import * as Output from "./Output.js"

const add = Command.make(
  "add",
  {
    url: Args.text({ name: "url" }).pipe(Args.withDescription("Where to POST the events (http or https)")),
    org: Options.text("org").pipe(Options.withDescription("The org whose job events it receives")),
    kind: Options.text("kind").pipe(Options.optional, Options.withDescription("Event kinds, comma-separated (default completed,dead,cancelled)")),
    stage: Options.text("stage").pipe(Options.optional, Options.withDescription("Only these stages, comma-separated (default every stage)")),
    json: Options.boolean("json").pipe(Options.withDescription("Print JSON, the secret included"))
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const webhooks = yield* Subscriptions.make
        const { secret, webhook } = yield* webhooks.create({
          orgId: o.org,
          url: o.url,
          kinds: Option.getOrUndefined(Option.map(o.kind, Env.parseList)),
          stages: Option.getOrUndefined(Option.map(o.stage, Env.parseList))
        }).pipe(Effect.catchTag("InvalidWebhook", (e) => Effect.fail(new UsageError({ message: e.message }))))
        yield* Effect.logInfo("webhook created").pipe(Effect.annotateLogs({ webhook: webhook.id, org: webhook.orgId }))
        if (o.json) return yield* Output.json({ ...webhook, secret: Redacted.value(secret) })
        yield* Output.note(`webhook ${webhook.id} for org ${webhook.orgId} (${webhook.kinds.join(",")}); its signing secret is shown once, store it now:`)
        yield* Output.line(Redacted.value(secret))
      })
    )
).pipe(Command.withDescription("Subscribe a URL to an org's job events (signed per Standard Webhooks; the secret is printed once)"))

const list = Command.make(
  "list",
  {
    org: Options.text("org").pipe(Options.optional, Options.withDescription("Only this org's webhooks")),
    json: Options.boolean("json").pipe(Options.withDescription("Print JSON instead of a table"))
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const all = yield* (yield* Subscriptions.make).list(Option.getOrNull(o.org))
        if (o.json) return yield* Output.json(all)
        yield* Output.line(Output.table(
          [{ header: "ID", align: "right" }, { header: "ORG" }, { header: "URL" }, { header: "KINDS" }, { header: "STAGES" }, { header: "CREATED" }],
          all.map((w) => [w.id, w.orgId, w.url, w.kinds.join(","), w.stages?.join(",") ?? "(all)", w.createdAt.toISOString()])
        ))
      })
    )
).pipe(Command.withDescription("List webhooks (never their secrets)"))

const remove = Command.make(
  "remove",
  { id: Args.text({ name: "id" }).pipe(Args.withDescription("The webhook's id")) },
  ({ id }) =>
    operator(() =>
      Effect.gen(function*() {
        if (!(yield* (yield* Subscriptions.make).remove(id, null))) return yield* new NotFound({ message: `no webhook ${id}` })
        yield* Output.line("removed")
      })
    )
).pipe(Command.withDescription("Remove a webhook; deliveries already queued for it are skipped"))

export const webhooks = Command.make("webhooks").pipe(
  Command.withDescription("Webhooks: an org's job events POSTed to a URL, signed, retried as jobs"),
  Command.withSubcommands([add, list, remove])
)
