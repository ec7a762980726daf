/**
 * What only Postgres can show: row-level security by org, one NOTIFY per statement per stage, and the
 * migration runner's lock and refusal to run against a newer schema.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Duration, Effect, Either, Layer, Redacted } from "effect"
import postgres from "postgres"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as JobsSql from "../../packages/pgfiber/src/queue/JobsSql.js"
import * as Migrations from "../../packages/pgfiber/src/queue/Migrations.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Queue from "../../packages/pgfiber/src/queue/Queue.js"
import { databaseUrl, dropSchema, freshSchemaName, layerDb, rawSql } from "../support/pg.js"

const worker = { workerId: "w", leaseFor: Duration.seconds(30) }

describe("PgQueue (Postgres only)", () => {
  // each stage's retention given to the queue (`retention.stages`) reaches every statement that finishes a job
  // outside a stage's own settle: a cancel, a purge, a bulk cancel. (A string bound as `$1::jsonb` is JSON-encoded
  // again by the driver and read back as a JSON string, whose `->> stage` is null: the default was used instead.)
  layer(PgQueue.layer({ retention: { default: Duration.days(7), stages: { unkept: Duration.zero } } }).pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("a stage's own retention holds for cancelled, purged and bulk-cancelled jobs", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const jobs = yield* q.enqueue([
          { stage: "unkept" }, { stage: "unkept" }, { stage: "unkept", payload: { bulk: true } }, { stage: "kept" }
        ])
        const [one, purged, bulked, kept] = jobs.map((j) => j.id)
        expect(yield* q.cancel(one!)).toBe("cancelled")
        expect(yield* q.cancel(kept!)).toBe("cancelled")
        yield* q.bulk.apply({ stage: "unkept", payload: { bulk: true } }, { kind: "cancel" }, { actor: "test" })
        expect(yield* q.stageControls.purge("unkept", "test")).toBe(1)
        // retention zero: gone at once; the other stage keeps the default
        for (const id of [one, purged, bulked]) expect(yield* q.get(id!)).toBeNull()
        expect((yield* q.get(kept!))?.status).toBe("cancelled")
      }))
  })

  layer(PgQueue.layer().pipe(Layer.provideMerge(layerDb())), { excludeTestServices: true })((it) => {
    it.effect("a session scoped to org A cannot see, change or add org B's jobs (RLS)", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const [a] = yield* q.enqueue([{ stage: "rls", orgId: "org-a", payload: { secret: "a" } }])
        const [b] = yield* q.enqueue([{ stage: "rls", orgId: "org-b", payload: { secret: "b" } }])
        const seenByA = yield* db.withOrg("org-a", q.list({ stage: "rls" }))
        expect(seenByA.map((j) => j.id)).toEqual([a!.id])
        expect(yield* db.withOrg("org-a", q.get(b!.id))).toBeNull()
        expect(yield* db.withOrg("org-a", q.cancel(b!.id))).toBe("not-found")
        expect(yield* q.get(b!.id)).not.toBeNull()
        const forged = yield* Effect.either(db.withOrg("org-a", q.enqueue([{ stage: "rls", orgId: "org-b" }])))
        // the refusal is the Queue's own error, named by the operation, with PostgreSQL's message and SQLSTATE
        expect(Either.isLeft(forged) && forged.left._tag === "QueueError" && forged.left.message).toContain("row-level security")
        expect(Either.isLeft(forged) && forged.left._tag === "QueueError" && [forged.left.operation, forged.left.code, forged.left.unavailable])
          .toEqual(["Queue.enqueue", "42501", false])
        const own = yield* db.withOrg("org-a", q.enqueue([{ stage: "rls", orgId: "org-a" }]))
        expect(own.length).toBe(1)
        // the worker (the owner role) still sees every org
        expect((yield* q.list({ stage: "rls" })).length).toBe(3)
      }))

    it.effect("a transaction's own failure (its COMMIT) is a QueueError; the body's failures come out as they failed", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        // a deferred unique constraint is checked at COMMIT: the body succeeds, the transaction's end fails
        const atCommit = yield* Effect.either(q.transaction(Effect.gen(function*() {
          yield* db.run((sql) => sql`create temp table deferred_check (x int unique deferrable initially deferred) on commit drop`)
          yield* db.run((sql) => sql`insert into deferred_check values (1), (1)`)
        })))
        expect(Either.isLeft(atCommit) && atCommit.left._tag === "QueueError" && [atCommit.left.operation, atCommit.left.code])
          .toEqual(["Queue.transaction", "23505"])
        // a Db failure of the caller's own statement is the caller's: not renamed by the Queue
        const ownStatement = yield* Effect.either(q.transaction(db.run((sql) => sql`select 1 / 0`)))
        expect(Either.isLeft(ownStatement) && ownStatement.left._tag).toBe("DbError")
        // a savepoint outside a transaction is one: the same
        const inSavepoint = yield* Effect.either(q.savepoint(db.run((sql) => sql`select 1 / 0`)))
        expect(Either.isLeft(inSavepoint) && inSavepoint.left._tag).toBe("DbError")
      }))

    it.effect("the kept history has the same row-level security: a tenant reads only its org's finished jobs", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const [a, b, c] = yield* q.enqueue([{ stage: "rls_hist", orgId: "org-a" }, { stage: "rls_hist", orgId: "org-b" }, { stage: "rls_hist", orgId: "org-a" }])
        const jobs = yield* q.claim("rls_hist", 3, worker)
        expect(yield* q.settle(jobs.map((j) => Queue.Outcome.complete(j, [], { org: j.orgId })))).toEqual(["completed", "completed", "completed"])
        expect((yield* db.withOrg("org-a", q.get(a!.id)))?.output).toEqual({ org: "org-a" })
        expect(yield* db.withOrg("org-a", q.get(b!.id))).toBeNull()
        expect((yield* db.withOrg("org-a", q.history.list({ stage: "rls_hist" }))).map((j) => j.id)).toEqual([c!.id, a!.id])
        // a tenant cancelling its own queued job writes its history row under the same policy
        const [d] = yield* q.enqueue([{ stage: "rls_hist", orgId: "org-a" }])
        expect(yield* db.withOrg("org-a", q.cancel(d!.id))).toBe("cancelled")
        expect((yield* db.withOrg("org-a", q.get(d!.id)))?.status).toBe("cancelled")
        expect(yield* db.withOrg("org-b", q.get(d!.id))).toBeNull()
        // a tenant cannot pause a stage: stage_controls is read-only for the tenant role
        const paused = yield* Effect.either(db.withOrg("org-a", q.stageControls.setPaused("rls_hist", true)))
        expect(Either.isLeft(paused) && paused.left.message).toContain("permission denied")
      }))

    it.effect("a claimed row that does not decode is dead-lettered with its reason, and the batch's other jobs are claimed", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        // the error history is jsonb with no constraint on its shape: the one column whose value the job model can
        // refuse. Each of the three claim statements: the plain claim, the fair stage's plain try, fair shares
        const plain = { ...worker, shares: { ...Queue.Limits.defaultShares, fair: false } }
        const cases = [
          { stage: "undecodable_plain", orgs: [null], options: plain },
          { stage: "undecodable_fits", orgs: [null], options: worker },
          { stage: "undecodable_fair", orgs: ["org-a", "org-b"], options: worker }
        ] as const
        for (const { stage, orgs, options } of cases) {
          const created = yield* q.enqueue(orgs.flatMap((orgId) => Array.from({ length: 3 }, () => ({ stage, orgId }))))
          const bad = created[0]!.id
          yield* db.run((sql) => sql`update jobs set errors = '[{"oops": true}]'::jsonb where id = ${bad}`)
          const limit = orgs.length === 1 ? 3 : 4
          const claimed = yield* q.claimBatch(stage, limit, options)
          const jobs = claimed.jobs
          expect(jobs.length, stage).toBe(limit - 1)
          // the claim took all it asked for: the pool reads a backlog, not a queue run dry
          expect(claimed.taken, stage).toBe(limit)
          expect(jobs.map((j) => j.id), stage).not.toContain(bad)
          const letters = yield* q.deadLetters.list({ stage })
          expect(letters.map((d) => [d.jobId, d.errorHistory.map((e) => e.tag)]), stage).toEqual([[bad, ["UndecodableRow"]]])
          expect(letters[0]!.reason, stage).toContain(`did not decode: claimed job ${bad}: an error history entry is not one`)
          expect(letters[0]!.reason, stage).toContain(`[{"oops": true}]`)
          expect((yield* q.get(bad))?.status, stage).toBe("dead")
        }
      }))

    it.effect("pruning takes every stage's expired history, in batches, and leaves what is still kept (mixed retentions)", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        // two stages, each with expired rows and kept ones; the kept ones have the smaller ids (a retention
        // shortened after they finished), so a walk in id order would have to step over them. Both retentions are
        // shorter than the archive's daily partitions (0022): rows kept longer go with their partition's drop.
        yield* db.run((sql) => sql`
          insert into jobs_archive (id, stage, payload, priority, status, attempts, max_attempts, created_at, keep_until)
          select -1000 - g, case when g % 2 = 0 then 'prune_a' else 'prune_b' end, '{}', 50, 'completed', 0, 5, now(),
                 case when g >= 22 then now() + interval '1 hour' else now() - interval '1 minute' end
          from generate_series(1, 25) g`)
        expect(yield* q.history.prune({ batch: 4 })).toBe(21)
        const left = yield* db.run((sql) => sql<Array<{ id: string }>>`
          select id::text from jobs_archive where stage in ('prune_a', 'prune_b') order by jobs_archive.id desc`)
        expect(left.map((r) => r.id)).toEqual(["-1022", "-1023", "-1024", "-1025"])
        expect((yield* q.history.list({ stage: "prune_a" })).map((j) => j.id)).toEqual(["-1022", "-1024"])
        expect(yield* q.history.prune({ batch: 4 })).toBe(0)
      }))

    it.effect("a tenant's session touches only the stage's shared token bucket and its own org's (RLS)", () =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        yield* db.run((sql) => sql`
          insert into rate_buckets (stage, org_key, tokens, refilled_at)
          values ('metered', '', 5, now()), ('metered', 'org-a', 5, now()), ('metered', 'org-b', 5, now())`)
        const touched = yield* db.withOrg("org-a", db.run((sql) => sql<Array<{ org_key: string }>>`
          update rate_buckets set tokens = 0 where stage = 'metered' returning org_key`))
        expect(touched.map((r) => r.org_key).sort()).toEqual(["", "org-a"])
        const forged = yield* Effect.either(db.withOrg("org-a", db.run((sql) => sql`
          insert into rate_buckets (stage, org_key, tokens, refilled_at) values ('other', 'org-b', 1, now())`)))
        expect(Either.isLeft(forged)).toBe(true)
        const [b] = yield* db.run((sql) => sql<Array<{ tokens: number }>>`select tokens from rate_buckets where org_key = 'org-b'`)
        expect(b!.tokens).toBe(5)
      }))

    it.effect("an org's work inside an owner's transaction runs as the tenant, and the transaction is the owner's again after", () =>
      Effect.gen(function*() {
        const db = yield* Db.Db
        const who = db.run((sql) => sql<Array<{ role: string; org: string | null }>>`
          select current_user as role, nullif(current_setting('pgfiber.org_id', true), '') as org`)
        const [before, inside, after] = yield* db.transaction(Effect.all([who, db.withOrg("org-a", who), who]))
        expect(inside![0]).toEqual({ role: "pgfiber_tenant", org: "org-a" })
        expect(after![0]).toEqual(before![0])
        expect(after![0]!.org).toBeNull()
        // and one org's work nested in another org's transaction goes back to the outer org
        const [outer, nested, back] = yield* db.withOrg("org-a", Effect.all([who, db.withOrg("org-b", who), who]))
        expect([outer![0]!.org, nested![0]!.org, back![0]!.org]).toEqual(["org-a", "org-b", "org-a"])
      }))

    it.effect("one NOTIFY per stage per statement, sent at commit", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const woken: Array<string> = []
        yield* Effect.scoped(
          Effect.gen(function*() {
            let listening = false
            yield* q.listen({ onWake: (s) => woken.push(s), onListening: () => (listening = true) })
            expect(listening).toBe(true)
            yield* q.enqueue([
              ...Array.from({ length: 5000 }, (_, n) => ({ stage: "burst_a", payload: { n } })),
              ...Array.from({ length: 5000 }, (_, n) => ({ stage: "burst_b", payload: { n } }))
            ])
            yield* Effect.sleep("300 millis")
          })
        )
        expect(woken.filter((s) => s.startsWith("burst_")).sort()).toEqual(["burst_a", "burst_b"])
      }))

    it.effect("a job inserted with plain SQL (a producer without pgfiber) wakes workers and is claimable", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const woken: Array<string> = []
        yield* Effect.scoped(
          Effect.gen(function*() {
            yield* q.listen({ onWake: (s) => woken.push(s), onListening: () => undefined })
            const sql = rawSql(db.schema)
            yield* Effect.promise(() => sql`insert into jobs (stage, payload) values ('plain_sql', '{"from":"psql"}')`)
            yield* Effect.promise(() => sql.end())
            yield* Effect.sleep("200 millis")
          })
        )
        expect(woken).toContain("plain_sql")
        const [job] = yield* q.claim("plain_sql", 1, worker)
        expect(job!.payload).toEqual({ from: "psql" })
      }))

    it.effect("fair claims take orgs in turn across the cursor's wrap, as one cached plan per statement", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const stage = "fair_wrap"
        for (const org of ["a", "b", "c"]) yield* q.enqueue(Array.from({ length: 3 }, () => ({ stage, orgId: org })))
        const turns: Array<Array<string | null>> = []
        while (true) {
          const jobs = yield* q.claim(stage, 2, worker)
          if (jobs.length === 0) break
          turns.push(jobs.map((j) => j.orgId).sort())
        }
        // the first claim has no cursor; each later one starts after the last org the one before visited
        expect(turns).toEqual([["a", "b"], ["a", "c"], ["b", "c"], ["a", "b"], ["c"]])
      }))

    it.effect("fair claims of one job at a time still take orgs in turn (the walk that stops at one org is no proof of one org)", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const stage = "fair_single_slot"
        for (const org of ["a", "b", "c"]) yield* q.enqueue(Array.from({ length: 2 }, () => ({ stage, orgId: org })))
        const turns: Array<string | null> = []
        while (true) {
          const jobs = yield* q.claim(stage, 1, worker)
          if (jobs.length === 0) break
          turns.push(jobs[0]!.orgId)
        }
        expect(turns).toEqual(["a", "b", "c", "a", "b", "c"])
      }))

    it.effect("the fair claim skips a job another transaction holds, and claims a job rewritten since it was queued", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const stage = "fair_locked"
        const [held, other] = yield* q.enqueue([{ stage, orgId: "a" }, { stage, orgId: "b" }])
        // rewritten while queued (a new row version): the claim takes the row as it is now
        yield* q.enqueue([{ stage, orgId: "b", payload: { v: 1 }, dedupeKey: "k" }])
        yield* q.enqueue([{ stage, orgId: "b", payload: { v: 2 }, dedupeKey: "k", dedupeMode: "replace" }])
        const sql = rawSql(db.schema)
        const claimedWhileHeld = yield* Effect.acquireUseRelease(
          Effect.succeed(sql),
          (sql) =>
            Effect.promise(() =>
              sql.begin(async (tx) => {
                await tx`select id from jobs where id = ${held!.id} for update`
                // on another connection, while this transaction holds the row
                return await Effect.runPromise(q.claim(stage, 10, worker))
              })
            ),
          (sql) => Effect.promise(() => sql.end())
        )
        expect(claimedWhileHeld.map((j) => j.id)).not.toContain(held!.id)
        expect(claimedWhileHeld.map((j) => j.id)).toContain(other!.id)
        expect(claimedWhileHeld.find((j) => j.dedupeKey === "k")?.payload).toEqual({ v: 2 })
        expect((yield* q.claim(stage, 10, worker)).map((j) => j.id)).toEqual([held!.id])
      }))

    it.effect("a fair claim beside another claim in flight takes each org's next jobs, not a short claim of what is left", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const db = yield* Db.Db
        const stage = "fair_contended"
        const byOrg = new Map<string, Array<string>>()
        for (const org of ["a", "b", "c"]) {
          byOrg.set(org, (yield* q.enqueue(Array.from({ length: 6 }, () => ({ stage, orgId: org })))).map((r) => r.id))
        }
        // another process's claim in flight holds each org's two oldest jobs, the ones this claim would pick first
        const heldIds = [...byOrg.values()].flatMap((ids) => ids.slice(0, 2))
        const sql = rawSql(db.schema)
        const claimed = yield* Effect.acquireUseRelease(
          Effect.succeed(sql),
          (sql) =>
            Effect.promise(() =>
              sql.begin(async (tx) => {
                await tx`select id from jobs where id = any(${heldIds}::bigint[]) for update`
                return await Effect.runPromise(q.claim(stage, 6, worker))
              })
            ),
          (sql) => Effect.promise(() => sql.end())
        )
        // a full claim, still two jobs per org: each org's third and fourth
        expect(claimed.map((j) => j.id).sort()).toEqual([...byOrg.values()].flatMap((ids) => ids.slice(2, 4)).sort())
      }))

    it.effect("a fair stage's claim that ran dry takes every ready job at once when they fit, and takes turns when they do not", () =>
      Effect.gen(function*() {
        const q = yield* Queue.Queue
        const stage = "dry_fair"
        // the queue ran dry (a short claim), then a few jobs of two orgs: the next claim takes all of them
        expect(yield* q.claim(stage, 10, worker)).toEqual([])
        yield* q.enqueue([{ stage, orgId: "a" }, { stage, orgId: "a" }, { stage, orgId: "b" }])
        expect((yield* q.claim(stage, 10, worker)).map((j) => j.orgId).sort()).toEqual(["a", "a", "b"])
        // ran dry again; now more are ready than one claim takes: org b's one job is not left behind a's eight
        yield* q.enqueue(Array.from({ length: 8 }, () => ({ stage, orgId: "a" })))
        yield* q.enqueue([{ stage, orgId: "b" }])
        const turn = yield* q.claim(stage, 4, worker)
        expect(turn.map((j) => j.orgId).sort()).toEqual(["a", "a", "a", "b"])
      }))
  })

  it.live("a claim on a direct connection is one statement (sessions with the claim's settings); behind a pooler (a listen URL) a transaction that sets them", () =>
    Effect.gen(function*() {
      const claimsOf = (pooled: boolean) =>
        Effect.scoped(Effect.gen(function*() {
          const schema = freshSchemaName("claim1")
          yield* Effect.addFinalizer(() => dropSchema(schema))
          const statements: Array<string> = []
          const db = yield* Db.make({
            url: Redacted.make(databaseUrl()),
            schema,
            poolMax: 2,
            onStatement: (q) => statements.push(q.trim().split(/\s+/).slice(0, 2).join(" ").toLowerCase()),
            ...(pooled ? { listenUrl: Redacted.make(databaseUrl()) } : {})
          })
          yield* Migrations.migrate().pipe(Effect.provideService(Db.Db, db), Effect.orDie)
          const q = yield* PgQueue.make().pipe(Effect.provideService(Db.Db, db))
          // the first claim checks the settings pool beside it; the claims after it show which path they take
          const shapes: Array<ReadonlyArray<string>> = []
          for (let i = 0; i < 6; i++) {
            yield* q.enqueue([{ stage: "one_trip", payload: { i } }])
            statements.length = 0
            const jobs = yield* q.claim("one_trip", 10, worker)
            expect(jobs.length).toBe(1)
            shapes.push([...statements])
            yield* Effect.sleep("20 millis")
          }
          return shapes
        }))
      const direct = yield* claimsOf(false)
      expect(direct.at(-1)).toEqual(["with next"])
      const pooled = yield* claimsOf(true)
      // (the first claim also reads the run-time limit overrides)
      for (const shape of pooled.slice(1)) expect(shape).toEqual(["begin", "select set_config(name,", "with next", "commit"])
    }))

  it.live("behind a pooler the settings and the statement go out together, the settings first: every statement runs under them", () =>
    Effect.scoped(Effect.gen(function*() {
      const db = yield* Db.make({
        url: Redacted.make(databaseUrl()),
        schema: "public",
        poolMax: 1,
        listenUrl: Redacted.make(databaseUrl())
      })
      const names = Object.keys(JobsSql.claimSettings)
      // one connection, so from the second run on the statement is prepared there and sent beside the settings
      for (let i = 0; i < 4; i++) {
        const [row] = yield* db.runWithSettings(JobsSql.claimSettings, (sql) =>
          sql<Array<{ kept: boolean }>>`select bool_and(current_setting(name) = value) as kept from unnest(${names}::text[], ${Object.values(JobsSql.claimSettings)}::text[]) as s(name, value)`)
        expect(row!.kept, `run ${i}`).toBe(true)
      }
      // and they were the transaction's own: the connection's session is back to its defaults
      const [after] = yield* db.run((sql) => sql<Array<{ v: string }>>`select current_setting('enable_seqscan') as v`)
      expect(after!.v).toBe("on")
    })))

  /**
   * Runs each claim statement on `fill`'s table (past the first executions, so whatever plan the claim's session
   * caches is the one measured) and returns the rows each read from `jobs` (every index or table scan), by
   * auto_explain's JSON.
   */
  const rowsReadByClaims = (prefix: string, fill: ReadonlyArray<string>, claimSize: number) =>
    Effect.scoped(Effect.gen(function*() {
      const schema = freshSchemaName(prefix)
      yield* Effect.addFinalizer(() => dropSchema(schema))
      yield* Migrations.migrate().pipe(Effect.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 }))))
      const admin = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => admin.end()))
      // each its own transaction (its own now())
      for (const statement of fill) yield* Effect.promise(() => admin.unsafe(statement))
      const notices: Array<string> = []
      // a session as the claims get them: the claim's settings given at connect
      const claimer = postgres(databaseUrl(), {
        max: 1,
        onnotice: (n) => notices.push(String(n.message)),
        connection: { ...JobsSql.claimSettings, search_path: schema } as Record<string, string>
      })
      yield* Effect.addFinalizer(() => Effect.promise(() => claimer.end()))
      const shares = { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null }
      const statements: Record<string, () => PromiseLike<unknown>> = {
        plain: () => JobsSql.claimReady(claimer as never, null, "claimed", claimSize, "w", 30_000),
        ifAll: () => JobsSql.claimReadyIfAll(claimer as never, null, "claimed", claimSize, "w", 30_000),
        fair: () => JobsSql.claimShares(claimer as never, null, "claimed", claimSize, "w", 30_000, shares, null)
      }
      const rowsRead = (plan: { [k: string]: unknown }): number =>
        (plan["Relation Name"] === "jobs" ? Number(plan["Actual Rows"]) * Number(plan["Actual Loops"]) : 0) +
        ((plan.Plans as Array<{ [k: string]: unknown }> | undefined) ?? []).reduce((n, p) => n + rowsRead(p), 0)
      const read: Record<string, number> = {}
      for (const [name, run] of Object.entries(statements)) {
        for (let i = 0; i < 6; i++) yield* Effect.promise(() => run())
        yield* Effect.promise(() => claimer.unsafe("load 'auto_explain'"))
        yield* Effect.promise(() => claimer.unsafe("set auto_explain.log_min_duration = 0; set auto_explain.log_analyze = on; set auto_explain.log_format = json; set auto_explain.log_level = notice"))
        notices.length = 0
        yield* Effect.promise(() => run())
        yield* Effect.promise(() => claimer.unsafe("set auto_explain.log_min_duration = -1"))
        const explained = notices.find((n) => n.includes("\"Plan\""))
        expect(explained, name).toBeDefined()
        read[name] = rowsRead((JSON.parse(explained!.slice(explained!.indexOf("{"))) as { Plan: { [k: string]: unknown } }).Plan)
      }
      return read
    }))

  it.live("one org's backlog is claimed by the plain claim; another org's job at the claim's priority sends it to fair shares", () =>
    Effect.scoped(Effect.gen(function*() {
      const schema = freshSchemaName("oneorg")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      yield* Migrations.migrate().pipe(Effect.provide(Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 2 }))))
      const admin = rawSql(schema)
      yield* Effect.addFinalizer(() => Effect.promise(() => admin.end()))
      const claimer = postgres(databaseUrl(), {
        max: 1,
        onnotice: () => undefined,
        connection: { ...JobsSql.claimSettings, search_path: schema } as Record<string, string>
      })
      yield* Effect.addFinalizer(() => Effect.promise(() => claimer.end()))
      const ifFair = () => Effect.promise(() => JobsSql.claimReadyIfAll(claimer as never, null, "s", 10, "w", 30_000)).pipe(
        Effect.map(([row]) => ({ fits: row!.fits, orgs: row!.jobs.map((j) => j[2] ?? "none") }))
      )
      // 40 jobs of no org, and a job of org "b" of a less urgent priority (fair shares order priorities first)
      yield* Effect.promise(() => admin.unsafe(`
        insert into jobs (stage, payload) select 's', '{}' from generate_series(1, 40);
        insert into jobs (stage, org_id, payload, priority) values ('s', 'b', '{}', 90)`))
      const first = yield* ifFair()
      expect(first.fits).toBe(true)
      expect(first.orgs).toEqual(Array(10).fill("none"))
      // org "b" now has a queued job (not yet due) at the claim's priority: fair shares would walk both orgs
      yield* Effect.promise(() => admin.unsafe(`insert into jobs (stage, org_id, payload, available_at) values ('s', 'b', '{}', now() + interval '1 hour')`))
      const second = yield* ifFair()
      expect(second).toEqual({ fits: false, orgs: [] })
      const [fair] = yield* Effect.promise(() =>
        JobsSql.claimShares(claimer as never, null, "s", 10, "w", 30_000, { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null }, null))
      expect(fair!.orgs).toBe(2)
      // and once b's jobs are gone from that priority, one org again
      yield* Effect.promise(() => admin.unsafe(`delete from jobs where org_id = 'b' and priority = 50`))
      const [alone] = yield* Effect.promise(() =>
        JobsSql.claimShares(claimer as never, null, "s", 10, "w", 30_000, { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null }, null))
      expect(alone!.orgs).toBe(1)
      // the last 10 of no org (11 ready: one org at the claim's priority, so the plain claim takes the first 10)
      expect(yield* ifFair()).toEqual({ fits: true, orgs: Array(10).fill("none") })
      // then b's less urgent job
      expect(yield* ifFair()).toEqual({ fits: true, orgs: ["b"] })
    })))

  it.live("a claim reads about as many rows as it claims, however many other jobs the table holds (the claim's sessions plan generically)", () =>
    Effect.gen(function*() {
      // 50,000 jobs of other stages (delayed and ready), 300 ready over 3 orgs in the stage claimed
      const read = yield* rowsReadByClaims("claimrows", [`
        insert into jobs (stage, org_id, payload, available_at)
        select case when g % 2 = 0 then 'elsewhere' else 'later' end, 'org' || (g % 100), '{}',
               case when g % 2 = 0 then now() else now() + interval '1 day' end
        from generate_series(1, 50000) g;
        insert into jobs (stage, org_id, payload) select 'claimed', 'org' || (g % 3), '{}' from generate_series(1, 300) g;
        analyze jobs`], 10)
      for (const [name, n] of Object.entries(read)) expect(n, name).toBeLessThan(500)
    }))

  it.live("a claim from a backlog enqueued in bulk reads about as many rows as it claims (jobs sharing one available_at)", () =>
    Effect.gen(function*() {
      // three bulk enqueues of 20,000 (each statement's jobs share its now()); claims of 100 take from the first.
      // The fair claim once read and sorted every job of the head's instant through jobs_due: 19,002 rows here
      const read = yield* rowsReadByClaims("bulkrows", [
        ...Array.from({ length: 3 }, () => "insert into jobs (stage, payload) select 'claimed', '{}' from generate_series(1, 20000)"),
        "analyze jobs"
      ], 100)
      for (const [name, n] of Object.entries(read)) expect(n, name).toBeLessThan(1_000)
    }))

  it.live("migrations run once under concurrency and refuse a database that is ahead", () =>
    Effect.gen(function*() {
      const schema = freshSchemaName("mig")
      yield* Effect.addFinalizer(() => dropSchema(schema))
      const dbLayer = Layer.scoped(Db.Db, Db.make({ url: Redacted.make(databaseUrl()), schema, poolMax: 4 }))
      const results = yield* Effect.all(
        Array.from({ length: 3 }, () => Migrations.migrate().pipe(Effect.provide(dbLayer))),
        { concurrency: "unbounded" }
      )
      const appliedCount = results.reduce((n, r) => n + r.applied.length, 0)
      expect(appliedCount).toBe(Migrations.load().length)
      const sql = rawSql(schema)
      yield* Effect.promise(() => sql`insert into migrations (id, name) values (9999, 'from_the_future')`)
      yield* Effect.promise(() => sql.end())
      const refused = yield* Effect.either(Migrations.migrate().pipe(Effect.provide(dbLayer)))
      expect(Either.isLeft(refused) && refused.left.message).toContain("newer than this build knows")
    }).pipe(Effect.scoped))
})
