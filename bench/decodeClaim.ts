/**
 * What decoding a claimed job costs the worker, per job, by the ways it could be done: the claims return each job
 * as an array of its fields (`JobsSql.claimedJobs`), thousands a second under a backlog, so the decode is on the
 * worker's hot path. No database: the arrays are made here, shaped as a claim's (a small payload, most with no
 * error history, some retried), and the same rows go through every variant. Variants take turns within each
 * round; the figures are medians over rounds.
 *
 * - `cast`: the hand mapper the claim used before the job model was in Schema (fields cast by position, no check);
 * - `schema`: `Schema.decodeUnknownSync(Rows.JobFromClaimed)`: the array's Tuple decoded, then the Job it makes
 *   checked again as the transformation's other side;
 * - `tuple`: `Schema.decodeUnknownSync(Rows.ClaimedRow)` (the Tuple only), then `Rows.jobFromClaimed`;
 * - `is`: the Tuple's guard (`Schema.is`), then `Rows.jobFromClaimed`;
 * - `kinds`: a hand-written check of each field's kind (`Rows.decodeClaimed`, what the claim uses), then
 *   `Rows.jobFromClaimed`.
 *
 *   node --import tsx bench/decodeClaim.ts [--rows 200000] [--rounds 7]
 *
 * The share of the worker's CPU is against 55–60 ms per 1,000 jobs (docs/benchmarks.md: the drain's worker CPU).
 */
import { Either, Schema } from "effect"
import type { ErrorEntry, Job, JobStatus } from "../packages/pgfiber/src/queue/Job.js"
import * as Rows from "../packages/pgfiber/src/queue/Rows.js"
import { option } from "./lib.js"

const count = Number(option("rows") ?? 200_000)
const rounds = Number(option("rounds") ?? 7)
// the drain's worker CPU per job, in µs (docs/benchmarks.md, the last quiet run: 54–62 ms per 1,000 jobs)
const workerUsPerJob = { low: 55, high: 60 }

const epochDate = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(Number(v)))

/** The claim's mapper before this change (PgQueue.claimedToJob), kept here as the baseline. */
const cast = (a: ReadonlyArray<unknown>): Job => ({
  id: a[0] as string,
  stage: a[1] as string,
  orgId: a[2] as string | null,
  subjectId: a[3] as string | null,
  payload: a[4],
  priority: a[5] as number,
  status: a[6] as JobStatus,
  attempts: a[7] as number,
  maxAttempts: a[8] as number,
  polls: a[9] as number,
  availableAt: epochDate(a[10])!,
  lockedBy: a[11] as string | null,
  lockedUntil: epochDate(a[12]),
  lease: a[13] as number,
  dedupeKey: a[14] as string | null,
  errors: (a[15] as ReadonlyArray<ErrorEntry> | null) ?? [],
  lastError: a[16] as string | null,
  createdAt: epochDate(a[17])!,
  updatedAt: epochDate(a[18])!,
  startedAt: epochDate(a[19]),
  finishedAt: null,
  lastRunMs: a[20] as number | null,
  output: null,
  progress: a[21] as number | null,
  progressMessage: a[22] as string | null,
  timeoutMs: a[23] as number | null,
  waitingOn: null,
  batchId: null
})

const decodeSchema = Schema.decodeUnknownSync(Rows.JobFromClaimed)
const decodeTuple = Schema.decodeUnknownSync(Rows.ClaimedRow)
const isClaimed = Schema.is(Rows.ClaimedRow)

const variants: ReadonlyArray<readonly [string, (a: ReadonlyArray<unknown>) => Job]> = [
  ["cast", cast],
  ["schema", (a) => decodeSchema(a)],
  ["tuple", (a) => Rows.jobFromClaimed(decodeTuple(a))],
  ["is", (a) => {
    if (!isClaimed(a)) throw new Error("not a claimed job")
    return Rows.jobFromClaimed(a)
  }],
  ["kinds", (a) => {
    const decoded = Rows.decodeClaimed(a)
    if (Either.isLeft(decoded)) throw new Error(decoded.left)
    return Rows.jobFromClaimed(decoded.right)
  }]
]

// rows as the server's JSON.parse hands them over: fresh arrays, each with its own strings and payload
const now = Date.now()
const text = JSON.stringify(Array.from({ length: count }, (_, i) => {
  const retried = i % 10 === 0
  return [
    String(1_000_000 + i), "calls.transcribe", i % 3 === 0 ? null : `org-${i % 50}`, `call-${i}`,
    { callId: `call-${i}`, language: "ru", attempt: i % 4 }, 50, "running", retried ? 1 : 0, 5, 0,
    now - 1000, "worker-1", now + 30_000, retried ? 2 : 1, null,
    retried ? [{ attempt: 1, at: new Date(now - 5000).toISOString(), tag: "Transient", message: "timeout", worker: "worker-1" }] : [],
    retried ? "timeout" : null, now - 60_000, now, now, retried ? 812.5 : null, null, null, null
  ]
}))
const rows: ReadonlyArray<ReadonlyArray<unknown>> = JSON.parse(text)

for (const [name, decode] of variants) {
  const job = decode(rows[10]!)
  if (job.id !== "1000010" || job.errors.length !== 1 || job.availableAt.getTime() !== now - 1000) {
    throw new Error(`${name} decodes wrongly`)
  }
}

const median = (xs: ReadonlyArray<number>) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

const timings = new Map<string, Array<number>>(variants.map(([name]) => [name, []]))
let sink = 0
for (let round = 0; round < rounds + 1; round++) {
  // each round in another order, so no variant always runs after the same one
  const order = variants.map((_, i) => variants[(i + round) % variants.length]!)
  for (const [name, decode] of order) {
    const start = process.hrtime.bigint()
    for (let i = 0; i < rows.length; i++) sink += decode(rows[i]!).attempts
    const ns = Number(process.hrtime.bigint() - start) / rows.length
    // the first round warms the JIT and is not counted
    if (round > 0) timings.get(name)!.push(ns)
  }
}

console.log(`${count} claimed jobs, ${rounds} rounds (median ns per job; share of the worker's ${workerUsPerJob.low}–${workerUsPerJob.high} µs per job)`)
const base = median(timings.get("cast")!)
for (const [name] of variants) {
  const ns = median(timings.get(name)!)
  const extra = ns - base
  const share = (x: number, us: number) => (100 * x / 1000 / us).toFixed(2)
  console.log(
    `${name.padEnd(7)} ${ns.toFixed(0).padStart(6)} ns/job: ${share(ns, workerUsPerJob.high)}–${share(ns, workerUsPerJob.low)} % ` +
      `of the worker's CPU per job; +${extra.toFixed(0)} ns over cast: +${share(extra, workerUsPerJob.high)}–${share(extra, workerUsPerJob.low)} %  ` +
      `rounds: ${timings.get(name)!.map((t) => t.toFixed(0)).join(" ")}`
  )
}
if (sink < 0) console.log(sink)
