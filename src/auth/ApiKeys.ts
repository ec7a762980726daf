/**
 * API keys: bearer tokens for the HTTP API, each bound to one org. A key is `pgf_<prefix>_<secret>`: the
 * prefix (6 random bytes, hex) finds the row, the secret (32 random bytes, base64url) is stored only as its
 * SHA-256. The token is shown once, at creation. Lookups run as the service's own role, before a request
 * switches to the tenant role, which has no access to the table at all (migrations/0002_api_keys.sql).
 */
import { Context, Data, Effect, Layer, Option, Redacted } from "effect"
import * as Crypto from "node:crypto"
import * as Db from "../layers/Db.js"

export interface ApiKey {
  readonly id: string
  readonly orgId: string
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

export class InvalidKeyRequest extends Data.TaggedError("InvalidKeyRequest")<{ readonly message: string }> {}

const tokenPattern = /^pgf_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$/

/** The org ids the pipelines accept (their storage paths are built from them). */
export const orgIdPattern = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/

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
  orgId: String(r.org_id),
  prefix: String(r.prefix),
  name: r.name === null || r.name === undefined ? null : String(r.name),
  createdAt: date(r.created_at),
  revokedAt: r.revoked_at ? date(r.revoked_at) : null
})

/** Writes a new key. Locking: a new row only; the unique prefix index refuses a (2^-48) collision. */
const insertKey = (sql: Db.Sql, orgId: string, prefix: string, hash: Buffer, name: string | null) =>
  sql<Array<Record<string, unknown>>>`
    insert into api_keys (org_id, prefix, key_hash, name) values (${orgId}, ${prefix}, ${hash}, ${name})
    returning id, org_id, prefix, name, created_at, revoked_at`

/** The live key with this prefix. Locking: none, a read by the unique index. */
const selectLiveKey = (sql: Db.Sql, prefix: string) =>
  sql<Array<{ id: string; org_id: string; key_hash: Buffer }>>`
    select id, org_id, key_hash from api_keys where prefix = ${prefix} and revoked_at is null`

const listKeys = (sql: Db.Sql, orgId: string | null) =>
  sql<Array<Record<string, unknown>>>`
    select id, org_id, prefix, name, created_at, revoked_at from api_keys
    where (${orgId}::text is null or org_id = ${orgId}::text) order by id`

/**
 * Revokes by prefix (12 hex characters, which may happen to be all digits) or by id. Locking: the one key row.
 */
const revokeKey = (sql: Db.Sql, idOrPrefix: string) =>
  !/^[0-9a-f]{12}$/.test(idOrPrefix) && /^\d{1,19}$/.test(idOrPrefix)
    ? sql<Array<{ id: string }>>`update api_keys set revoked_at = now() where id = ${idOrPrefix} and revoked_at is null returning id`
    : sql<Array<{ id: string }>>`update api_keys set revoked_at = now() where prefix = ${idOrPrefix} and revoked_at is null returning id`

export class ApiKeys extends Context.Tag("pgfiber/ApiKeys")<ApiKeys, {
  /** A new key for the org; the token is in the result and nowhere else. */
  readonly create: (options: { readonly orgId: string; readonly name?: string | undefined }) => Effect.Effect<
    { readonly key: ApiKey; readonly token: Redacted.Redacted<string> },
    InvalidKeyRequest | Db.DbError
  >
  /** The org a presented token acts for; None when it is malformed, unknown or revoked. */
  readonly verify: (token: Redacted.Redacted<string>) => Effect.Effect<Option.Option<Principal>, Db.DbError>
  readonly list: (options?: { readonly orgId?: string | undefined }) => Effect.Effect<ReadonlyArray<ApiKey>, Db.DbError>
  /** By id or prefix; false when no live key matched. */
  readonly revoke: (idOrPrefix: string) => Effect.Effect<boolean, Db.DbError>
}>() {}

export const make = Effect.gen(function*() {
  const db = yield* Db.Db

  const create = Effect.fn("ApiKeys.create")(function*(options: { readonly orgId: string; readonly name?: string | undefined }) {
    const orgId = options.orgId.trim()
    if (!orgIdPattern.test(orgId)) {
      return yield* new InvalidKeyRequest({ message: `org "${orgId}" must match ${orgIdPattern.source}` })
    }
    if (options.name !== undefined && options.name.length > 200) {
      return yield* new InvalidKeyRequest({ message: "name must be at most 200 characters" })
    }
    const { hash, prefix, token } = newToken()
    const [row] = yield* db.run((sql) => insertKey(sql, orgId, prefix, hash, options.name ?? null))
    return { key: rowToKey(row!), token: Redacted.make(token) }
  })

  const verify = (token: Redacted.Redacted<string>) =>
    Option.match(parseToken(Redacted.value(token)), {
      onNone: () => Effect.succeedNone,
      onSome: ({ hash, prefix }) =>
        db.run((sql) => selectLiveKey(sql, prefix)).pipe(
          Effect.map(([row]) =>
            row !== undefined && Crypto.timingSafeEqual(Buffer.from(row.key_hash), hash)
              ? Option.some({ keyId: String(row.id), orgId: row.org_id })
              : Option.none()
          )
        )
    }).pipe(Effect.withSpan("ApiKeys.verify"))

  const list = (options: { readonly orgId?: string | undefined } = {}) =>
    db.run((sql) => listKeys(sql, options.orgId ?? null)).pipe(Effect.map((rows) => rows.map(rowToKey)))

  const revoke = (idOrPrefix: string) => db.run((sql) => revokeKey(sql, idOrPrefix.trim())).pipe(Effect.map((rows) => rows.length > 0))

  return ApiKeys.of({ create, verify, list, revoke })
})

export const layer = Layer.effect(ApiKeys, make)
