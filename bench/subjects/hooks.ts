/**
 * The handler every subject's worker runs, and how it reports to the harness: `start` per job in the latency
 * workload (handler-start time on the shared monotonic clock), `drained` once in the bulk workload.
 */
import { nowNs, tell } from "../lib.js"
import type { WorkerConfig } from "./types.js"

export const makeHandler = (config: WorkerConfig) => {
  let handled = 0
  return (seq: number): void => {
    // a scheduled job (pgfiber's idle-with-a-schedule row): its tick, not a measured job
    if (seq < 0) return tell({ t: "tick", at: nowNs() })
    if (config.mode === "latency") tell({ t: "start", seq, at: nowNs() })
    handled++
    if (config.mode === "bulk" && handled === 1) tell({ t: "first", at: nowNs() })
    if (config.mode === "bulk" && handled === config.expect) tell({ t: "drained", at: nowNs(), handled })
  }
}

export const readConfig = (): WorkerConfig => JSON.parse(process.argv[2] ?? "{}") as WorkerConfig
