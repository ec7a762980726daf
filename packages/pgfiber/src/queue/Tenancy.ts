/**
 * Tenancy: how the faces and the runtime say whose data they work on, without touching `Db`. Every tenant's work
 * runs under its org's row-level security; owner-level work (sweeps across orgs, maintenance, operators' actions)
 * is named as such. The scoping is carried by the fiber (Db's `forOrg` / `asOwner`), so every statement of every
 * queue operation inside inherits it; `transaction` adds one transaction under the org, for work that must
 * commit together.
 */
import { Context, Data, Effect, Layer, type Option } from "effect"
import * as Db from "../layers/Db.js"
import { QueueError } from "./Queue.js"

export class Tenancy extends Context.Tag("pgfiber/Tenancy")<Tenancy, {
  /**
   * Runs `effect` in one transaction under `orgId`'s row-level security: every statement inside sees that org's
   * rows only, and its writes commit together or not at all. Joins the caller's transaction when it is the
   * same org's; its own failures (BEGIN, COMMIT, the connection) are a QueueError named "Tenancy.transaction".
   */
  readonly transaction: (orgId: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E | QueueError, R>
}>() {}

/**
 * Runs `effect` with every statement (each in a short transaction of its own, or the transactions begun inside)
 * under `orgId`'s row-level security; no transaction is held across the outside calls between statements.
 */
export const forOrg: (orgId: string) => <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R> = Db.forOrg

/** Owner-level work, named as such: outside row-level security; never joins a tenant's transaction. */
export const asOwner: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R> = Db.asOwner

/** The org the current fiber works for (`forOrg`, `transaction`), if any. */
export const currentOrg: Effect.Effect<Option.Option<string>> = Db.currentOrgId

/** Owner-level work when `orgId` is null, else that org's. */
export const forOrgOrOwner = (orgId: string | null) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  orgId === null ? asOwner(effect) : forOrg(orgId)(effect)

/** The body's own failure, carried through the transaction as it is (only the transaction's become QueueError). */
class BodyFailed<E> extends Data.TaggedClass("BodyFailed")<{ readonly error: E }> {}

/** Tenancy over PostgreSQL: a transaction under the tenant role with the org set (row-level security). */
export const layer: Layer.Layer<Tenancy, never, Db.Db> = Layer.effect(
  Tenancy,
  Effect.map(Db.Db, (db) =>
    Tenancy.of({
      transaction: (orgId) => (effect) =>
        db.withOrg(orgId, Effect.mapError(effect, (e) => new BodyFailed({ error: e }))).pipe(
          Effect.catchAll((e) =>
            Effect.fail(
              e._tag === "BodyFailed"
                ? e.error
                : new QueueError({ operation: "Tenancy.transaction", message: e.message, code: e.code, unavailable: e.unavailable, cause: e })
            )
          )
        )
    }))
)

/** Tenancy for the in-memory queue: the org scopes the fiber; each memory operation is atomic on its own. */
export const layerMemory: Layer.Layer<Tenancy> = Layer.succeed(
  Tenancy,
  Tenancy.of({ transaction: (orgId) => (effect) => forOrg(orgId)(effect) })
)
