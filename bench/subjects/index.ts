/** Every subject the bench knows, in the order its tables list them. */
import * as Graphile from "./graphile.js"
import * as PgBoss from "./pgboss.js"
import * as Pgfiber from "./pgfiber.js"
import type { Subject } from "./types.js"

export const all: ReadonlyArray<Subject> = [Pgfiber.subject, Pgfiber.noRetention, Graphile.defaults, Graphile.batched, PgBoss.subject]
