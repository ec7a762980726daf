/**
 * API keys: bearer tokens for the HTTP API and the dashboard's sign-in. An `org` key is bound to one org; an
 * `admin` key (an operator's, `keys create --admin`) lets the dashboard show every org, and acts on the HTTP
 * API only for the org it names, if any. A key is `pgf_<prefix>_<secret>`: the
 * prefix (6 random bytes, hex) finds the row, the secret (32 random bytes, base64url) is stored only as its
 * SHA-256. The token is shown once, at creation. Lookups run as the service's own role, before a request
 * switches to the tenant role, which has no access to the table at all (migrations/0002_api_keys.sql).
 */
import { Context, Data, Effect, Layer, Option, Redacted } from "effect"
import * as Crypto from "node:crypto"
import * as Db from "pgfiber/internal/layers/Db.js"

export type KeyScope = "org" | "admin"

export interface ApiKey {
  readonly id: string
  /** Null only for an admin key made without an org. */
  readonly orgId: string | null
  readonly scope: KeyScope
  readonly prefix: string
  readonly name: string | null
  readonly createdAt: Date
  readonly revokedAt: Date | null
}

/** Who a verified request acts for. */
export interface Principal {
  readonly keyId: string
  readonly orgId: string
}

/** Who signed in to the dashboard: an operator (every org) or one org. */
export interface Viewer {
  readonly keyId: string
  readonly orgId: string | null
  readonly admin: boolean
}

export class InvalidKeyRequest extends Data.TaggedError("InvalidKeyRequest")<{ readonly message: string }> {}

const tokenPattern = /^pgf_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$/

/** The org ids the pipelines accept (their storage paths are built from them). */
export const orgIdPattern = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/

/** A presented token's prefix when it is shaped like one of ours (its secret unchecked); undefined otherwise. */
export const prefixOf = (token: string): string | undefined => /^pgf_([0-9a-f]{12})_/.exec(token.trim())?.[1]

const hashSecret = (secret: Buffer) => Crypto.createHash("sha256").update(secret).digest()

/** Splits a presented token; None for anything that is not shaped like one of ours. */
export const parseToken = (token: string): Option.Option<{ readonly prefix: string; readonly hash: Buffer }> => {
  const match = tokenPattern.exec(token.trim())
  if (match === null) return Option.none()
  const secret = Buffer.from(match[2]!, "base64url")
  return secret.length === 32 ? Option.some({ prefix: match[1]!, hash: hashSecret(secret) }) : Option.none()
}

export const newToken = () => {
  const prefix = Crypto.randomBytes(6).toString("hex")
  const secret = Crypto.randomBytes(32)
  return { prefix, hash: hashSecret(secret), token: `pgf_${prefix}_${secret.toString("base64url")}` }
}

const date = (v: unknown) => (v instanceof Date ? v : new Date(String(v)))

const rowToKey = (r: Record<string, unknown>): ApiKey => ({
  id: String(r.id),
  orgId: r.org_id === null || r.org_id === undefined ? null : String(r.org_id),
  scope: r.scope === "admin" ? "admin" : "org",
  prefix: String(r.prefix),
  name: r.name === null || r.name === undefined ? null : String(r.name),
  createdAt: date(r.created_at),
  revokedAt: r.revoked_at ? date(r.revoked_at) : null
})

/** Writes a new key. Locking: a new row only; the unique prefix index refuses a (2^-48) collision. */
const insertKey = (sql: Db.Sql, orgId: string | null, scope: KeyScope, prefix: string, hash: Buffer, name: string | null) =>
  sql<Array<Record<string, unknown>>>`
    insert into api_keys (org_id, scope, prefix, key_hash, name) values (${orgId}, ${scope}, ${prefix}, ${hash}, ${name})
    returning id, org_id, scope, prefix, name, created_at, revoked_at`

/** The live key with this prefix. Locking: none, a read by the unique index. */
const selectLiveKey = (sql: Db.Sql, prefix: string) =>
  sql<Array<{ id: string; org_id: string | null; scope: string; key_hash: Buffer }>>`
    select id, org_id, scope, key_hash from api_keys where prefix = ${prefix} and revoked_at is null`

const listKeys = (sql: Db.Sql, orgId: string | null) =>
  sql<Array<Record<string, unknown>>>`
    select id, org_id, scope, prefix, name, created_at, revoked_at from api_keys
    where (${orgId}::text is null or org_id = ${orgId}::text) order by id`

/**
 * Revokes by prefix (12 hex characters, which may happen to be all digits) or by id. Locking: the one key row.
 */
const revokeKey = (sql: Db.Sql, idOrPrefix: string) =>
  !/^[0-9a-f]{12}$/.test(idOrPrefix) && /^\d{1,19}$/.test(idOrPrefix)
    ? sql<Array<{ id: string }>>`update api_keys set revoked_at = now() where id = ${idOrPrefix} and revoked_at is null returning id`
    : sql<Array<{ id: string }>>`update api_keys set revoked_at = now() where prefix = ${idOrPrefix} and revoked_at is null returning id`

export class ApiKeys extends Context.Tag("pgfiber/ApiKeys")<ApiKeys, {
  /** A new key for the org (or an operator's with `admin`); the token is in the result and nowhere else. */
  readonly create: (options: CreateOptions) => Effect.Effect<
    { readonly key: ApiKey; readonly token: Redacted.Redacted<string> },
    InvalidKeyRequest | Db.DbError
  >
  /**
   * The org a presented token acts for on the HTTP API; None when it is malformed, unknown or revoked (or an
   * admin key that names no org).
   */
  readonly verify: (token: Redacted.Redacted<string>) => Effect.Effect<Option.Option<Principal>, Db.DbError>
  /** Who a presented token signs in to the dashboard as; None when it is malformed, unknown or revoked. */
  readonly verifyViewer: (token: Redacted.Redacted<string>) => Effect.Effect<Option.Option<Viewer>, Db.DbError>
  readonly list: (options?: { readonly orgId?: string | undefined }) => Effect.Effect<ReadonlyArray<ApiKey>, Db.DbError>
  /** The key with this id exists and is not revoked (a dashboard session ends with its key). */
  readonly isLive: (keyId: string) => Effect.Effect<boolean, Db.DbError>
  /** By id or prefix; false when no live key matched. */
  readonly revoke: (idOrPrefix: string) => Effect.Effect<boolean, Db.DbError>
}>() {}

export interface CreateOptions {
  /** Required for an org key; optional for an admin key (the org it acts for on the HTTP API). */
  readonly orgId?: string | undefined
  readonly name?: string | undefined
  readonly admin?: boolean | undefined
}

export const make = Effect.gen(function*() {
  const db = yield* Db.Db

  const create = Effect.fn("ApiKeys.create")(function*(options: CreateOptions) {
    const orgId = options.orgId?.trim()
    const scope: KeyScope = options.admin === true ? "admin" : "org"
    if (orgId === undefined && scope === "org") {
      return yield* new InvalidKeyRequest({ message: "an org key needs an org (or make an operator's key with --admin)" })
    }
    if (orgId !== undefined && !orgIdPattern.test(orgId)) {
      return yield* new InvalidKeyRequest({ message: `org "${orgId}" must match ${orgIdPattern.source}` })
    }
    if (options.name !== undefined && options.name.length > 200) {
      return yield* new InvalidKeyRequest({ message: "name must be at most 200 characters" })
    }
    const { hash, prefix, token } = newToken()
    const [row] = yield* db.run((sql) => insertKey(sql, orgId ?? null, scope, prefix, hash, options.name ?? null))
    return { key: rowToKey(row!), token: Redacted.make(token) }
  })

  const verifyViewer = (token: Redacted.Redacted<string>): Effect.Effect<Option.Option<Viewer>, Db.DbError> =>
    Option.match(parseToken(Redacted.value(token)), {
      onNone: () => Effect.succeedNone,
      onSome: ({ hash, prefix }) =>
        db.run((sql) => selectLiveKey(sql, prefix)).pipe(
          Effect.map(([row]) =>
            row !== undefined && Crypto.timingSafeEqual(Buffer.from(row.key_hash), hash)
              ? Option.some({ keyId: String(row.id), orgId: row.org_id, admin: row.scope === "admin" })
              : Option.none()
          )
        )
    }).pipe(Effect.withSpan("ApiKeys.verify"))

  const verify = (token: Redacted.Redacted<string>) =>
    verifyViewer(token).pipe(
      Effect.map(Option.flatMap((v) => (v.orgId === null ? Option.none() : Option.some({ keyId: v.keyId, orgId: v.orgId }))))
    )

  const list = (options: { readonly orgId?: string | undefined } = {}) =>
    db.run((sql) => listKeys(sql, options.orgId ?? null)).pipe(Effect.map((rows) => rows.map(rowToKey)))

  const isLive = (keyId: string) =>
    /^\d{1,19}$/.test(keyId)
      ? db.run((sql) => sql<Array<{ id: string }>>`select id from api_keys where id = ${keyId} and revoked_at is null`).pipe(
        Effect.map((rows) => rows.length === 1)
      )
      : Effect.succeed(false)

  const revoke = (idOrPrefix: string) => db.run((sql) => revokeKey(sql, idOrPrefix.trim())).pipe(Effect.map((rows) => rows.length > 0))

  return ApiKeys.of({ create, verify, verifyViewer, list, isLive, revoke })
})

export const layer = Layer.effect(ApiKeys, make)
