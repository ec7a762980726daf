/**
 * Claims from several processes at once, with no worker runtime: N connections (each a process's claim session,
 * with the claims' settings) claim from one backlog of jobs spread over orgs until it is empty, each as fast as
 * it can. What it shows is how full the claims come back when they run at the same time: a claim that skips the
 * jobs another claim in flight holds must still fill itself from the jobs behind them, or the pools send many
 * more, smaller claims (and each short claim makes a pool look for the next due time too).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test node --import tsx bench/claimContention.ts \
 *     [--claimers 1,4] [--modes fair,plain] [--jobs 40000] [--orgs 10] [--limit 250] [--rounds 3]
 *
 * `fair`: `JobsSql.claimShares` (a fair stage's claim over several orgs); `plain`: `JobsSql.claimReady`.
 * Without DATABASE_URL it boots an embedded PostgreSQL of its own. The rate is wall-clock (the machine's
 * load moves it); the claims per 1,000 jobs do not depend on the machine.
 */
import postgres from "postgres"
import * as JobsSql from "../packages/pgfiber/src/queue/JobsSql.js"
import * as Migrations from "../packages/pgfiber/src/queue/Migrations.js"
import { connect, log, median, option, type Sql, startCluster } from "./lib.js"

const claimers = (option("claimers") ?? "1,4").split(",").map(Number)
const modes = (option("modes") ?? "fair,plain").split(",") as Array<"fair" | "plain">
const jobs = Number(option("jobs") ?? 40_000)
const orgs = Number(option("orgs") ?? 10)
const limit = Number(option("limit") ?? 250)
const rounds = Number(option("rounds") ?? 3)
const schema = "pgfiber_claim_contention"
const stage = "contended"
const shares = { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null } as const

interface Result {
  readonly claims: number
  readonly short: number
  readonly ms: number
}

const drain = async (url: string, mode: "fair" | "plain", n: number): Promise<Result> => {
  const sessions: Array<Sql> = Array.from({ length: n }, () =>
    postgres(url, {
      max: 1,
      onnotice: () => undefined,
      connection: { ...JobsSql.claimSettings, search_path: schema } as Record<string, string>
    }))
  let claims = 0
  let short = 0
  let claimed = 0
  const t0 = performance.now()
  try {
    await Promise.all(sessions.map(async (sql, k) => {
      let cursor: string | null = null
      for (;;) {
        let got: number
        if (mode === "fair") {
          const [r] = await JobsSql.claimShares(sql, null, stage, limit, `w${k}`, 60_000, shares, cursor)
          cursor = r!.cursor
          got = r!.jobs.length
        } else {
          got = (await JobsSql.claimReady(sql, null, stage, limit, `w${k}`, 60_000))[0]!.jobs.length
        }
        claims++
        claimed += got
        if (got < limit) short++
        if (got === 0 && claimed >= jobs) return
      }
    }))
  } finally {
    await Promise.all(sessions.map((s) => s.end({ timeout: 5 })))
  }
  if (claimed !== jobs) throw new Error(`${mode} × ${n}: ${claimed} claims of ${jobs} jobs (a job claimed twice or missed)`)
  return { claims, short, ms: performance.now() - t0 }
}

const main = async () => {
  const cluster = process.env.DATABASE_URL ? null : await startCluster({})
  const url = process.env.DATABASE_URL ?? cluster!.url
  const admin = connect(url, { max: 1 })
  await admin.unsafe(`drop schema if exists ${schema} cascade`)
  for (const m of Migrations.load()) {
    await admin.unsafe(`create schema if not exists ${schema}; ${m.sql.replaceAll("{{schema}}", schema)}`).simple()
  }
  const sql = connect(url, { max: 1, schema })
  const results = new Map<string, Array<Result>>()
  try {
    for (let round = 1; round <= rounds; round++) {
      for (const mode of modes) {
        for (const n of claimers) {
          await sql`truncate jobs`
          await sql`
            insert into jobs (stage, org_id, payload)
            select ${stage}, 'org-' || (g % ${orgs}), jsonb_build_object('n', g) from generate_series(1, ${jobs}) g`
          await sql`vacuum analyze jobs`
          const r = await drain(url, mode, n)
          const key = `${mode} × ${n}`
          results.set(key, [...(results.get(key) ?? []), r])
        }
      }
      log(`round ${round} of ${rounds} done`)
    }
    console.log(`\n${jobs} jobs over ${orgs} orgs, claims of ${limit}, medians of ${rounds} rounds\n`)
    console.log("| claim × concurrent claimers | claims | per 1,000 jobs | short claims | jobs/s |")
    console.log("| --- | ---: | ---: | ---: | ---: |")
    for (const [key, rs] of results) {
      const claims = median(rs.map((r) => r.claims))
      console.log(`| ${key} | ${claims} | ${(claims / jobs * 1000).toFixed(1)} | ${median(rs.map((r) => r.short))} | ${Math.round(median(rs.map((r) => jobs / (r.ms / 1000))))} |`)
    }
  } finally {
    await admin.unsafe(`drop schema if exists ${schema} cascade`).catch(() => undefined)
    await sql.end({ timeout: 5 })
    await admin.end({ timeout: 5 })
    await cluster?.close()
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
