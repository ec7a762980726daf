/**
 * The steady workload's producer, in a process of its own as an application's would be: one subject's
 * `enqueueOne` (its single-job API) called every 1/rate s on a fixed schedule for `durationMs`, never waiting
 * for an earlier call to return (open loop), so a slow call shows as latency, not as a lower rate. Tells the
 * harness when each call started (batched), on the monotonic clock every process shares.
 */
import { nowNs, percentile, sleep, tell } from "./lib.js"
import { all } from "./subjects/index.js"
import type { SteadyProducerConfig } from "./workloads.js"

const config = JSON.parse(process.argv[2] ?? "{}") as SteadyProducerConfig
const subject = all.find((s) => s.key === config.subject)
if (subject === undefined) throw new Error(`no subject ${config.subject}`)
const producer = await subject.producer(config.url, config.connections)

const seqs: Array<number> = []
const ats: Array<number> = []
const flush = () => {
  if (seqs.length > 0) tell({ t: "enqueued", seqs: seqs.splice(0), ats: ats.splice(0) })
}
const flusher = setInterval(flush, 200)

const periodNs = 1e9 / config.ratePerSec
const t0 = nowNs()
const endNs = t0 + config.durationMs * 1e6
tell({ t: "ready", at: t0 })
const calls: Array<Promise<void>> = []
const callMs: Array<number> = []
let failed = 0
let lateMs = 0
for (let seq = 0; ; seq++) {
  const due = t0 + seq * periodNs
  if (due >= endNs) break
  const waitMs = (due - nowNs()) / 1e6
  if (waitMs > 0) await sleep(waitMs)
  const at = nowNs()
  lateMs = Math.max(lateMs, (at - due) / 1e6)
  seqs.push(seq)
  ats.push(at)
  calls.push(producer.enqueueOne(seq).then(() => void callMs.push((nowNs() - at) / 1e6), (e: unknown) => {
    failed++
    process.stderr.write(`enqueue ${seq}: ${e instanceof Error ? e.message : String(e)}\n`)
  }))
}
await Promise.all(calls)
clearInterval(flusher)
flush()
tell({ t: "produced", calls: calls.length, failed, lateMs, callP50Ms: percentile(callMs, 50), callP99Ms: percentile(callMs, 99) })
await producer.close()
process.exit(0)
