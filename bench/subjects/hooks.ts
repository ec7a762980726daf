/**
 * The handler every subject's worker runs, and how it reports to the harness: `start` per job in the latency
 * workload (handler-start time on the shared monotonic clock), the same batched every 200 ms in the steady
 * workload (one IPC message per job would cost the worker more than some queues spend on the job),
 * `drained` once in the bulk workload.
 */
import { nowNs, tell } from "../lib.js"
import { ioJobMs, type WorkerConfig } from "./types.js"

/** Records that a job's handler started. */
const makeRecorder = (config: WorkerConfig) => {
  let handled = 0
  const startedSeqs: Array<number> = []
  const startedAts: Array<number> = []
  if (config.mode === "steady") {
    setInterval(() => {
      if (startedSeqs.length === 0) return
      tell({ t: "starts", seqs: startedSeqs.splice(0), ats: startedAts.splice(0) })
    }, 200).unref()
  }
  return (seq: number): void => {
    // a scheduled job (pgfiber's idle-with-a-schedule row): its tick, not a measured job
    if (seq < 0) return tell({ t: "tick", at: nowNs() })
    if (config.mode === "latency") tell({ t: "start", seq, at: nowNs() })
    if (config.mode === "steady") {
      startedSeqs.push(seq)
      startedAts.push(nowNs())
    }
    handled++
    if (config.mode === "bulk" && handled === 1) tell({ t: "first", at: nowNs() })
    if (config.mode === "bulk" && handled === config.expect) tell({ t: "drained", at: nowNs(), handled })
  }
}

const ioWait = () => new Promise<void>((resolve) => setTimeout(resolve, ioJobMs))

/**
 * The job as a user writes it, in both shapes a queue can be given: `sync` a plain function, `async` a
 * function returning a Promise (the async no-op, or with `config.handler` "io" the no-op that then awaits a
 * 20 ms timer). A worker hands its queue `sync` when `config.handler` is "sync", else `async`.
 */
export const makeJob = (config: WorkerConfig) => {
  const record = makeRecorder(config)
  const sync = (seq: number): void => record(seq)
  const async = config.handler === "io"
    ? async (seq: number): Promise<void> => {
      record(seq)
      await ioWait()
    }
    : async (seq: number): Promise<void> => {
      record(seq)
    }
  return { sync, async }
}

export const readConfig = (): WorkerConfig => JSON.parse(process.argv[2] ?? "{}") as WorkerConfig
