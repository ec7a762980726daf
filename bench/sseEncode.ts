/**
 * What the service's `GET /events` spends per event to turn the log's rows into the bytes it writes, CPU time in
 * this process, no database: rows shaped as `EventsSql.readEvents` returns them for a bulk drain (an `enqueued`
 * row per 1,000 jobs, then `started` rows sharing a claim's worker and `completed` rows with each job's own data,
 * `--row` jobs each), made into events as the shared reader makes them (`EventLog.unnestRow`), then written in
 * batches of `--batch` events (what the feed hands the stream at once) by the stream's writer (SseWriter.ts), and
 * those bytes sent over a local TCP socket whose other end drops them. Prints µs per event for each step, per
 * round and as medians.
 *
 *   node --import tsx bench/sseEncode.ts [--jobs 20000] [--row 200] [--batch 5000] [--rounds 9] [--writer PATH]
 *
 * `--writer PATH`: a module exporting `sseWriter` with the same signature, to measure another version of it
 * against this one (the same rows, the same process).
 */
import * as Net from "node:net"
import * as Path from "node:path"
import { pathToFileURL } from "node:url"
import * as EventLog from "../packages/pgfiber/src/queue/EventLog.js"
import * as EventsSql from "../packages/pgfiber/src/queue/EventsSql.js"
import type { sseWriter as SseWriter } from "../packages/service/src/http/SseWriter.js"
import { log, median, option } from "./lib.js"

const jobs = Number(option("jobs") ?? 20_000)
const perRow = Number(option("row") ?? 200)
const batch = Number(option("batch") ?? 5000)
const rounds = Number(option("rounds") ?? 9)
const writerPath = option("writer")

/** A drain's rows, each an array of `EventsSql.rowFields` as the reader's JSON parse returns them. */
const drainRows = (): Array<ReadonlyArray<unknown>> => {
  const rows: Array<ReadonlyArray<unknown>> = []
  const at = Date.parse("2026-11-28T01:00:00.000Z")
  let rowId = 41_000
  const firstJob = 7_340_001
  const add = (kind: EventLog.Kind, from: number, n: number, data: (i: number) => ReadonlyArray<unknown> | null) => {
    const ids = Array.from({ length: n }, (_, i) => firstJob + from + i)
    rows.push([
      String(rowId++), String(900_000 + rows.length), kind, "bench_follow", "bench-org", at + rows.length * 7,
      ids, null, ids.map(() => (kind === "enqueued" ? 0 : 1)), data(n)
    ])
  }
  for (let j = 0; j < jobs; j += EventsSql.jobsPerRow) add("enqueued", j, Math.min(EventsSql.jobsPerRow, jobs - j), () => null)
  for (let j = 0; j < jobs; j += perRow) {
    const n = Math.min(perRow, jobs - j)
    add("started", j, n, () => [{ worker: "bench-0-5f3c9a1e" }])
    add("completed", j, n, (k) => Array.from({ length: k }, (_, i) => ({ outputBytes: 0, runMs: 0.184 + (i % 97) / 1000 })))
  }
  return rows
}

const cpuMs = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1000
}

/** A local socket whose other end reads and drops everything; resolves once `bytes` have arrived. */
const sink = async () => {
  let received = 0
  let waiting: { bytes: number; resolve: () => void } | null = null
  const server = Net.createServer((s) =>
    s.on("data", (d) => {
      received += d.length
      if (waiting !== null && received >= waiting.bytes) {
        waiting.resolve()
        waiting = null
      }
    }))
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as Net.AddressInfo).port
  const socket = Net.connect(port, "127.0.0.1")
  await new Promise<void>((resolve) => socket.once("connect", resolve))
  return {
    socket,
    arrived: (bytes: number) => new Promise<void>((resolve) => (received >= bytes ? resolve() : (waiting = { bytes, resolve }))),
    received: () => received,
    close: () => {
      socket.destroy()
      server.close()
    }
  }
}

const main = async () => {
  const { sseWriter } = (await import(
    writerPath === undefined ? "../packages/service/src/http/SseWriter.js" : pathToFileURL(Path.resolve(writerPath)).href
  )) as { sseWriter: typeof SseWriter }
  const rows = drainRows()
  const out = await sink()
  const results = { unnest: [] as Array<number>, write: [] as Array<number>, send: [] as Array<number> }
  let bytesPerEvent = 0
  for (let r = 0; r < rounds; r++) {
    let t = cpuMs()
    const events: Array<EventLog.LoggedEvent> = []
    for (const row of rows) EventLog.unnestRow(row, 0, null, events, Number.MAX_SAFE_INTEGER)
    const unnest = cpuMs() - t
    t = cpuMs()
    const write = sseWriter()
    const pages: Array<Uint8Array> = []
    for (let i = 0; i < events.length; i += batch) pages.push(write(events.slice(i, i + batch)))
    const written = cpuMs() - t
    const bytes = pages.reduce((n, p) => n + p.length, 0)
    const target = out.received() + bytes
    t = cpuMs()
    for (const p of pages) out.socket.write(p)
    await out.arrived(target)
    const sent = cpuMs() - t
    const us = (ms: number) => (ms * 1000) / events.length
    results.unnest.push(us(unnest))
    results.write.push(us(written))
    results.send.push(us(sent))
    bytesPerEvent = bytes / events.length
    log(`round ${r + 1}: ${events.length} events in ${rows.length} rows, ${bytesPerEvent.toFixed(0)} bytes each; µs per event: unnest ${us(unnest).toFixed(3)}, write ${us(written).toFixed(3)}, send (both ends) ${us(sent).toFixed(3)}`)
  }
  out.close()
  log(`median of ${rounds} (${writerPath ?? "this checkout's writer"}): µs per event: unnest ${median(results.unnest).toFixed(3)}, write ${median(results.write).toFixed(3)}, send (both ends) ${median(results.send).toFixed(3)}`)
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
