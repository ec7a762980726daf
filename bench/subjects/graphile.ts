/**
 * graphile-worker 0.18 as a subject, twice: with its defaults, and with the configuration its performance page
 * documents (`localQueue.size` 500, `completeJobBatchDelay` 0, `failJobBatchDelay` 0). Enqueue uses
 * `addJobs` (one `add_jobs` call per batch) and `addJob`; the worker is `run()` with concurrency 10.
 */
import { makeWorkerUtils, type WorkerUtils } from "graphile-worker"
import pg from "pg"
import { connect } from "../lib.js"
import { type Producer, queueName, type Subject } from "./types.js"

export const batchedPreset = {
  worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
}

/** The harness owns the pool (and ends it), so dropping the database later cannot crash it with an unhandled error. */
const utilsFor = async (url: string, max: number) => {
  const pool = new pg.Pool({ connectionString: url, max })
  pool.on("error", () => undefined)
  pool.on("connect", (client) => client.on("error", () => undefined))
  const utils: WorkerUtils = await makeWorkerUtils({ pgPool: pool })
  return { utils, release: async () => {
    await utils.release()
    await pool.end()
  } }
}

/** get_job(s) (its src/sql/getJobs.ts, with or without the local queue), complete_job(s), add_job(s). */
const statements = {
  claim: /attempts = jobs\.attempts \+ (\$\d+|1),\s*locked_by = /,
  settle: /delete from \S*_private_jobs/,
  enqueue: /add_jobs?\(/
}

const install = async (url: string) => {
  const { utils, release } = await utilsFor(url, 1)
  try {
    await utils.migrate()
  } finally {
    await release()
  }
}

const producer = async (url: string, connections = 4): Promise<Producer> => {
  const { utils, release } = await utilsFor(url, connections)
  const sql = connect(url, { max: 1 })
  return {
    enqueueBatch: async (seqs) => void (await utils.addJobs(seqs.map((seq) => ({ identifier: queueName, payload: { seq } })))),
    enqueueOne: async (seq) => void (await utils.addJob(queueName, { seq })),
    pending: async () =>
      Number((await sql<Array<{ n: string }>>`select count(*)::text as n from graphile_worker._private_jobs`)[0]!.n),
    close: async () => {
      await sql.end({ timeout: 5 })
      await release()
    }
  }
}

export const defaults: Subject = {
  key: "graphile",
  label: "graphile-worker",
  variant: "defaults",
  workerScript: "subjects/graphileWorker.ts",
  notes: "run() with the workload's concurrency (10; 100 for I/O-bound jobs), everything else default (LISTEN/NOTIFY on, pollInterval 2 s, no batching, a pool of 10 connections)",
  drainCapMs: 60_000,
  statements,
  install,
  producer
}

export const batched: Subject = {
  key: "graphile-batched",
  label: "graphile-worker (batched)",
  variant: "batched",
  workerScript: "subjects/graphileWorker.ts",
  notes: "the workload's concurrency with the documented batching: localQueue.size 500, completeJobBatchDelay 0, failJobBatchDelay 0",
  drainCapMs: 60_000,
  statements,
  install,
  producer
}
