/** `keys create|list|revoke`: API keys for the HTTP API and the dashboard, each bound to one org or an operator's (`--admin`). */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Option, Redacted } from "effect"
import * as ApiKeys from "../auth/ApiKeys.js"
import { NotFound } from "./Failure.js"
import { operator } from "./Jobs.js"
import * as Output from "./Output.js"

const create = Command.make(
  "create",
  {
    org: Options.text("org").pipe(Options.optional, Options.withDescription("The org the key acts for (required unless --admin)")),
    admin: Options.boolean("admin").pipe(
      Options.withDescription("An operator's key: the dashboard shows it every org (with --org, it acts for that org on the HTTP API)")
    ),
    name: Options.text("name").pipe(Options.optional, Options.withDescription("A label, e.g. the client's name")),
    json: Options.boolean("json").pipe(Options.withDescription("Print JSON: id, prefix, org and the key"))
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const keys = yield* ApiKeys.ApiKeys
        const { key, token } = yield* keys.create({ orgId: Option.getOrUndefined(o.org), name: Option.getOrUndefined(o.name), admin: o.admin })
        yield* Effect.logInfo("API key created").pipe(Effect.annotateLogs({ keyId: key.id, prefix: key.prefix, org: key.orgId, scope: key.scope }))
        if (o.json) {
          return yield* Output.json({ id: key.id, prefix: key.prefix, orgId: key.orgId, scope: key.scope, name: key.name, key: Redacted.value(token) })
        }
        const whose = key.scope === "admin" ? `an operator (admin) key${key.orgId === null ? "" : ` acting for org ${key.orgId} on the API`}` : `for org ${key.orgId}`
        yield* Output.note(`key ${key.id} (prefix ${key.prefix}) ${whose}; it is shown once, store it now:`)
        yield* Output.line(Redacted.value(token))
      })
    )
).pipe(Command.withDescription("Create an API key for an org (or an operator's, --admin) and print it (once: only its hash is stored)"))

const list = Command.make(
  "list",
  {
    org: Options.text("org").pipe(Options.optional, Options.withDescription("Only this org's keys")),
    json: Options.boolean("json").pipe(Options.withDescription("Print JSON instead of a table"))
  },
  (o) =>
    operator(() =>
      Effect.gen(function*() {
        const keys = yield* ApiKeys.ApiKeys
        const all = yield* keys.list({ orgId: Option.getOrUndefined(o.org) })
        if (o.json) return yield* Output.json(all)
        yield* Output.line(Output.table(
          [{ header: "ID", align: "right" }, { header: "PREFIX" }, { header: "ORG" }, { header: "SCOPE" }, { header: "NAME" }, { header: "CREATED" }, { header: "REVOKED" }],
          all.map((k) => [k.id, k.prefix, k.orgId ?? "", k.scope, k.name ?? "", k.createdAt.toISOString(), k.revokedAt?.toISOString() ?? ""])
        ))
      })
    )
).pipe(Command.withDescription("List API keys (never the secrets)"))

const revoke = Command.make(
  "revoke",
  { key: Args.text({ name: "id-or-prefix" }).pipe(Args.withDescription("The key's id or its prefix (pgf_<prefix>_…)")) },
  ({ key }) =>
    operator(() =>
      Effect.gen(function*() {
        const keys = yield* ApiKeys.ApiKeys
        if (!(yield* keys.revoke(key))) return yield* new NotFound({ message: `no live key ${key}` })
        yield* Effect.logInfo("API key revoked").pipe(Effect.annotateLogs({ key }))
        yield* Output.line("revoked")
      })
    )
).pipe(Command.withDescription("Revoke an API key; requests with it get 401 from then on"))

export const keys = Command.make("keys").pipe(
  Command.withDescription("API keys for the HTTP API"),
  Command.withSubcommands([create, list, revoke])
)
