/**
 * Generated bad requests against a real server over Postgres: random JSON, text with NUL and lone surrogates,
 * raw bytes that are not UTF-8, bodies labelled with other charsets, huge numbers, deep nesting, wrong types,
 * dates that do not exist, random ids and cursors, stray keys, NUL in paths and queries, at every endpoint and
 * every path parameter of both listeners. Whatever arrives, the server never answers 5xx, every error is a JSON
 * `{ "_tag", "message" }`, a refused request (4xx) leaves every table exactly as it was, and the refusals that
 * do not depend on the route come as they must: a NUL in the path or query is 400, a keyed body in another
 * charset is 415, one that is not UTF-8 is 400 naming the byte offset. No worker runs here, so nothing else
 * writes between the before and after of each request. The issues' own reproductions run first, as fixed
 * examples.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import fc from "fast-check"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Submit from "../../packages/pgfiber/src/runtime/Submit.js"
import * as Server from "../../packages/service/src/http/Server.js"
import { makeCallStages } from "../../packages/media/src/stages/calls/index.js"
import { layerDb, rawSql } from "../support/pg.js"
import * as StrictInput from "../../packages/service/src/http/StrictInput.js"
import { adminUrl, baseUrl, echo, layerTempStorage, manual, newKey } from "./support.js"

const stages = [echo, manual, ...makeCallStages()]

/** The API alone: no worker, so the only writes are the requests' own. */
const world = Server.layer({
  host: "127.0.0.1",
  port: 0,
  admin: { host: "127.0.0.1", port: 0 },
  maxBodyBytes: 256 * 1024,
  maxUploadBytes: 256 * 1024,
  devTick: true,
  workerId: "property-test",
  // a generous limit: the generated keys fail often, and a 429 is checked like any other refusal
  authFailures: { maxFailures: 1_000_000, maxFailuresPerAddress: 1_000_000 }
}).pipe(
  Layer.provideMerge(layerTempStorage("pgfiber-property-storage-")),
  Layer.provideMerge(Layer.succeed(Submit.KnownStages, stages)),
  Layer.provideMerge(ApiKeys.layer),
  Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name) })),
  Layer.provideMerge(layerDb())
)

// ---------------------------------------------------------------------------------------------
// generators

const nasty = ["\u0000", "a\u0000b", "\ud800", "x\udfffy", "\udbff\u0000", "🎉\ud83d", "%00", "\\u0000", "'; drop table jobs; --", "../../etc/passwd", ""]

const hostileString = fc.oneof(
  fc.constantFrom(...nasty),
  fc.string({ maxLength: 30 }),
  fc.string({ unit: "binary", maxLength: 30 }),
  fc.tuple(fc.string({ maxLength: 5 }), fc.constantFrom("\u0000", "\ud800", "\udc00"), fc.string({ maxLength: 5 })).map(([a, b, c]) => a + b + c)
)

const hugeNumber = fc.oneof(
  fc.constantFrom(1e308, -1e308, 2 ** 53 + 1, -0, 1e-320, 9223372036854775807, 18446744073709552000),
  fc.double(),
  fc.integer()
)

/** Deep nesting as JSON text, alternating arrays and objects; kept as text so a report can print it. */
const nestedText = (depth: number, leaf: string) => {
  let open = ""
  let close = ""
  for (let i = 0; i < depth; i++) {
    open += i % 2 === 0 ? "[" : "{\"k\":"
    close = (i % 2 === 0 ? "]" : "}") + close
  }
  return open + leaf + close
}

const hostileJson: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    hostileString,
    hugeNumber,
    fc.boolean(),
    fc.constant(null),
    fc.array(tie("value"), { maxLength: 4 }),
    fc.dictionary(hostileString, tie("value"), { maxKeys: 4 })
  )
})).value

/** Calendar fields near and past their ends: Feb 29 and 30, April 31, month 13, hour 24, minute 60, offset +25:00. */
const edgeOfCalendar = fc.record({
  year: fc.constantFrom(1, 1900, 2000, 2024, 2026, 2100, 9999),
  month: fc.integer({ min: 0, max: 13 }),
  day: fc.constantFrom(0, 1, 28, 29, 30, 31, 32),
  hour: fc.constantFrom(0, 23, 24),
  minute: fc.constantFrom(0, 59, 60),
  zone: fc.constantFrom("Z", "+01:00", "-14:00", "+25:00", "+01:60", "")
}).map(({ day, hour, minute, month, year, zone }) => {
  const two = (n: number) => String(n).padStart(2, "0")
  return `${String(year).padStart(4, "0")}-${two(month)}-${two(day)}T${two(hour)}:${two(minute)}:00${zone}`
})

const hostileDate = fc.oneof(
  fc.constantFrom(
    "+275760-09-13T00:00:00Z", "-271821-04-20T00:00:00Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:60Z", "2024-02-30", "not a date", "1e12", "",
    "2026-02-30T10:00:00Z", "2026-02-29", "2026-04-31T00:00:00Z", "March 7, 2026", "2026-03-01T24:00:00Z"
  ),
  edgeOfCalendar,
  fc.date({ noInvalidDate: false }).map((d) => (Number.isNaN(d.getTime()) ? "Invalid Date" : d.toISOString())),
  hugeNumber
)

const enqueueBody = fc.record(
  {
    stage: fc.oneof(fc.constantFrom("echo", "manual", "extract_audio", "analyze", "nope", "ECHO"), hostileString),
    payload: fc.oneof(fc.constant({ n: 1 }), fc.record({ n: hugeNumber, fail: fc.boolean() }), hostileJson),
    priority: fc.oneof(fc.constantFrom("fast", "bulk", "urgent"), hugeNumber),
    delayMs: hugeNumber,
    runAt: hostileDate,
    maxAttempts: hugeNumber,
    dedupeKey: hostileString,
    dedupeMode: fc.oneof(fc.constantFrom("first", "replace", "debounce", "FIRST", "merge", ""), hostileString, hugeNumber, hostileJson),
    subjectId: hostileString,
    extra: hostileJson
  },
  { requiredKeys: [] }
)

/** Cron expressions: valid, out of range, never firing (Feb 31), too many fields, macros, hostile text. */
const hostileCron = fc.oneof(
  fc.constantFrom(
    "* * * * *", "0 3 * * *", "*/15 * * * * *", "0 0 31 2 *", "0 0 30 2 *", "61 * * * *", "* 25 * * *", "*/0 * * * *",
    "* * * * * * *", "@yearly", "@reboot", "0 0 L * *", "0 0 ? * MON#5", "1-0 * * * *", "", " ", "x".repeat(200), "9".repeat(40) + " * * * *"
  ),
  hostileString,
  fc.tuple(fc.constantFrom("*", "0", "59", "*/5", "1-3"), hostileString).map(([a, b]) => `${a} ${b} * * *`)
)

const hostileTimeZone = fc.oneof(
  fc.constantFrom("UTC", "Europe/Berlin", "America/St_Johns", "Mars/Olympus", "Etc/GMT+14", "Etc/GMT+15", "+05:00", "../../etc/localtime", "", "utc", "x".repeat(100), "x".repeat(101)),
  hostileString
)

/** A payload a client might send a schedule: NUL and surrogates, huge numbers, big text (some over the limit). */
const schedulePayload = fc.oneof(
  fc.constant({ n: 1 }),
  fc.record({ n: hugeNumber, fail: fc.boolean() }),
  hostileString.map((text) => ({ n: 1, text })),
  fc.integer({ min: 1, max: 400 }).map((kb) => ({ n: 1, pad: "x".repeat(kb * 1024) })),
  hostileJson
)

const scheduleBody = fc.record(
  {
    stage: fc.oneof(fc.constantFrom("echo", "manual", "extract_audio", "analyze", "pgfiber.housekeeping", "nope"), hostileString),
    payload: schedulePayload,
    cron: hostileCron,
    everyMs: hugeNumber,
    timeZone: hostileTimeZone,
    enabled: fc.oneof(fc.boolean(), hostileJson),
    catchUp: fc.oneof(fc.constantFrom("skip", "backfill", "all"), hostileString),
    backfillLimit: hugeNumber,
    priority: fc.oneof(fc.constantFrom("fast", "bulk", "urgent"), hugeNumber),
    maxAttempts: hugeNumber,
    extra: hostileJson
  },
  { requiredKeys: [] }
)

type Body =
  | { readonly kind: "json"; readonly value: unknown }
  | { readonly kind: "raw"; readonly text: string }
  /** Bytes as sent: JSON text with byte sequences that are not UTF-8 inside a string, or any bytes at all. */
  | { readonly kind: "bytes"; readonly bytes: Uint8Array }
  /** An enqueue whose payload (or the whole body) is nested `depth` levels deep. */
  | { readonly kind: "deep"; readonly depth: number; readonly where: "payload" | "body" }

/** Not UTF-8: a stray continuation, FF/FE, overlong forms, an encoded surrogate, past U+10FFFF, a cut-off sequence. */
const notUtf8 = fc.constantFrom([0x80], [0xff, 0xfe], [0xfe], [0xc0, 0xaf], [0xe0, 0x80, 0x80], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80], [0xf0, 0x9f, 0x8e], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc3])

const badBytes: fc.Arbitrary<Body> = fc.oneof(
  fc.tuple(enqueueBody, fc.string({ maxLength: 8 }), notUtf8).map(([value, text, bytes]) => {
    // the bad bytes inside the subjectId string, wherever the rest of the body puts it
    const json = JSON.stringify({ ...value, subjectId: `${text}\u0001` })
    const at = json.lastIndexOf("\\u0001")
    return { kind: "bytes" as const, bytes: Buffer.concat([Buffer.from(json.slice(0, at)), Buffer.from(bytes), Buffer.from(json.slice(at + 6))]) }
  }),
  fc.uint8Array({ maxLength: 40 }).map((bytes) => ({ kind: "bytes" as const, bytes }))
)

const body: fc.Arbitrary<Body> = fc.oneof(
  enqueueBody.map((value) => ({ kind: "json" as const, value })),
  badBytes,
  hostileJson.map((value) => ({ kind: "json" as const, value })),
  fc.record({ notes: hostileString, max: hugeNumber, uri: hostileString }, { requiredKeys: [] }).map((value) => ({ kind: "json" as const, value })),
  fc.string({ maxLength: 40 }).map((text) => ({ kind: "raw" as const, text })),
  fc.record({ depth: fc.integer({ min: 60, max: 6000 }), where: fc.constantFrom("payload" as const, "body" as const) }).map((d) => ({ kind: "deep" as const, ...d }))
)

/** What `PUT /schedules/:name` gets: mostly schedule-shaped bodies, and anything `body` makes. */
const scheduleRequest: fc.Arbitrary<Body> = fc.oneof(
  { weight: 3, arbitrary: scheduleBody.map((value) => ({ kind: "json" as const, value })) },
  // exactly one of cron and everyMs, otherwise well-formed: the timing and zone are what is under test
  { weight: 2, arbitrary: fc.record({ cron: hostileCron, timeZone: hostileTimeZone }).map((t) => ({ kind: "json" as const, value: { stage: "echo", payload: { n: 1 }, ...t } })) },
  { weight: 1, arbitrary: fc.record({ everyMs: hugeNumber, payload: schedulePayload }).map((t) => ({ kind: "json" as const, value: { stage: "echo", ...t } })) },
  { weight: 1, arbitrary: body }
)

/**
 * What `POST /jobs/bulk` gets: filters of hostile text and JSON (payload searches well-formed and not), real and
 * unknown actions and priorities; a dry run or a bad `dryRun`, so nothing it accepts changes a job.
 */
const bulkRequest: fc.Arbitrary<Body> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      filter: fc.oneof(
        fc.record({
          stage: fc.oneof(fc.constantFrom("echo", "manual", "extract_audio", "nope", "probe.work"), hostileString),
          status: fc.oneof(fc.constantFrom("queued", "delayed", "running", "dead"), hostileString),
          subject: hostileString,
          payload: fc.oneof(fc.constantFrom("customer=42", "{\"n\":1}", "=", "a.=1", "a=1,a.b=2", "{oops", "[1]", "{}"), hostileString, hostileJson),
          error: hostileString,
          olderThan: fc.oneof(fc.constantFrom("2h", "30m", "0s", "1.5d", `${"9".repeat(30)}d`, "-1h"), hostileString),
          newerThan: hostileString
        }, { requiredKeys: [] }),
        hostileJson
      ),
      action: fc.oneof(fc.constantFrom("cancel", "retry", "run-now", "priority"), hostileString),
      priority: fc.oneof(hugeNumber, fc.constantFrom("fast", "urgent")),
      dryRun: fc.oneof(fc.constant(true), hostileJson.filter((v) => v !== false))
    }, { requiredKeys: ["filter", "action"] }).map((value) => ({ kind: "json" as const, value }))
  },
  { weight: 1, arbitrary: body }
)

/** A path segment as a client could send it, encoded or (for byte-level oddities) already escaped. */
const segment = (known: ReadonlyArray<string>) =>
  fc.oneof(
    fc.constantFrom(...known),
    // a NUL where a name or id goes, alone or inside one
    fc.tuple(fc.constantFrom(...known), fc.constantFrom("%00", "%00%00", "%2500")).map(([name, nul]) => `${name.slice(0, 3)}${nul}${name.slice(3)}`),
    fc.bigInt({ min: 0n, max: 10n ** 25n }).map(String),
    fc.constantFrom("9223372036854775807", "9223372036854775808", "-1", "0x10", "1e3", "%00", "%ED%A0%80", "%C0%80", "00000000-0000-4000-8000-000000000000"),
    hostileString.map((s) => {
      try {
        return encodeURIComponent(s)
      } catch {
        return encodeURIComponent(s.replace(/[\ud800-\udfff]/g, "?")) + "%ED%A0%80"
      }
    })
  )

const query = fc.oneof(
  fc.dictionary(fc.constantFrom("stage", "status", "limit", "after", "all", "x"), hostileString, { maxKeys: 4 }).map((params) => {
    const search = new URLSearchParams()
    for (const [k, v] of Object.entries(params)) search.set(k, v.replace(/[\ud800-\udfff]/g, "\ufffd"))
    return search.toString()
  }),
  fc.constantFrom("after=abc", "after=99999999999999999999", "after=-5", "limit=0", "limit=1e9", "stage=%00", "after=%00", "all=maybe", "status=dead", "after=%ED%A0%80", "%00=1", "stage=echo%00", "limit=1%00")
)

/** What the body says it is: JSON in UTF-8 mostly, sometimes in another charset or something else entirely. */
const contentType = fc.oneof(
  { weight: 6, arbitrary: fc.constant("application/json") },
  {
    weight: 3,
    arbitrary: fc.constantFrom(
      "application/json; charset=utf-8", "application/json; charset=UTF-8", "application/json;charset=\"utf-8\"", "application/json; charset=utf-16",
      "application/json; charset=utf-16le", "application/json; charset=latin1", "application/json; charset=iso-8859-1", "application/json; charset=",
      "application/json; charset=\"\"", "text/plain", "text/plain; charset=us-ascii", "application/x-www-form-urlencoded", "application/octet-stream"
    )
  }
)

/** Stages the admin routes aim at: ones the service knows, one it does not, and the housekeeping one. */
const stageNames = ["echo", "manual", "extract_audio", "nope", "pgfiber.housekeeping"]

interface Request {
  readonly method: string
  readonly path: string
  readonly body?: Body
  /** The body's Content-Type; application/json when there is a body and none is given. */
  readonly contentType?: string
  /** The admin listener's routes (no key there); the API listener's otherwise. */
  readonly listener?: "admin"
}

const endpoint = (ids: ReadonlyArray<string>, names: ReadonlyArray<string>): fc.Arbitrary<Request> =>
  fc.oneof<Array<fc.Arbitrary<Request>>>(
    fc.record({ method: fc.constant("POST"), path: fc.constant("/jobs"), body }),
    fc.record({ method: fc.constant("GET"), path: query.map((q) => `/jobs?${q}`) }),
    fc.record({ method: fc.constant("GET"), path: segment(ids).map((id) => `/jobs/${id}`) }),
    fc.record({ method: fc.constant("POST"), path: segment(ids).map((id) => `/jobs/${id}/cancel`) }),
    fc.record({ method: fc.constant("POST"), path: fc.constant("/jobs/bulk"), body: bulkRequest }),
    fc.record({ method: fc.constant("GET"), path: query.map((q) => `/jobs/actions?${q}`) }),
    fc.record({ method: fc.constant("GET"), path: query.map((q) => `/dlq?${q}`) }),
    fc.record({ method: fc.constant("GET"), path: segment(ids).map((id) => `/dlq/${id}`) }),
    fc.record({ method: fc.constant("POST"), path: segment(ids).map((id) => `/dlq/${id}/retry`) }),
    fc.record({ method: fc.constant("POST"), path: segment(ids).map((id) => `/dlq/${id}/resolve`), body }),
    fc.record({ method: fc.constant("POST"), path: fc.constant("/api/jobs/tick"), body }),
    fc.record({ method: fc.constant("POST"), path: fc.constant("/calls"), body }),
    fc.record({ method: fc.constant("GET"), path: segment(ids).map((id) => `/calls/${id}`) }),
    fc.record({ method: fc.constant("GET"), path: query.map((q) => `/schedules?${q}`) }),
    fc.record({ method: fc.constant("GET"), path: segment(names).map((name) => `/schedules/${name}`) }),
    fc.record({ method: fc.constant("PUT"), path: segment(names).map((name) => `/schedules/${name}`), body: scheduleRequest }),
    fc.record({ method: fc.constant("PUT"), path: fc.constantFrom(...names.map((n) => `/schedules/${n}`)), body: scheduleRequest }),
    fc.record({ method: fc.constant("DELETE"), path: segment(names).map((name) => `/schedules/${name}`) }),
    fc.record({
      method: fc.constant("POST"),
      path: fc.tuple(segment(names), fc.constantFrom("enable", "disable", "run-now")).map(([name, verb]) => `/schedules/${name}/${verb}`),
      body: fc.option(body, { nil: undefined })
    }),
    fc.record({ method: fc.constantFrom("PUT", "DELETE", "PATCH"), path: fc.constantFrom("/jobs", "/calls", "/dlq/1", "/schedules", "/schedules/a/run-now") }),
    // any body, in any charset, at the routes that read one
    fc.record({ method: fc.constantFrom("POST", "PUT"), path: fc.constantFrom("/jobs", "/schedules/prop-nightly", "/dlq/1/resolve"), body, contentType }),
    // the admin listener's path parameters
    fc.record({ method: fc.constant("POST"), path: fc.tuple(segment(stageNames), fc.constantFrom("pause", "resume")).map(([stage, verb]) => `/stages/${stage}/${verb}`), listener: fc.constant("admin" as const) }),
    fc.record({ method: fc.constant("PUT"), path: segment(stageNames).map((stage) => `/limits/${stage}`), body: limitsRequest, contentType, listener: fc.constant("admin" as const) }),
    fc.record({ method: fc.constantFrom("DELETE", "GET"), path: segment(stageNames).map((stage) => `/limits/${stage}`), listener: fc.constant("admin" as const) }),
    fc.record({ method: fc.constant("GET"), path: query.map((q) => `/limits?${q}`), listener: fc.constant("admin" as const) })
  )

/** What `PUT /limits/:stage` gets: caps, rates (some malformed), and anything `body` makes. */
const limitsRequest: fc.Arbitrary<Body> = fc.oneof(
  fc.record(
    {
      maxRunning: hugeNumber,
      maxRunningPerOrg: hugeNumber,
      rate: fc.oneof(fc.constantFrom("20/s", "500/1h", "none", "0/s", "1/0s", "x/y", "9".repeat(30) + "/s"), hostileString),
      ratePerOrg: fc.oneof(fc.constantFrom("5/s", "none"), hostileString),
      burst: hugeNumber,
      fair: fc.oneof(fc.boolean(), hostileJson)
    },
    { requiredKeys: [] }
  ).map((value) => ({ kind: "json" as const, value })),
  body
)

const authorization = (key: string) =>
  fc.oneof(
    { weight: 8, arbitrary: fc.constant(`Bearer ${key}`) },
    { weight: 1, arbitrary: fc.constantFrom("", "Bearer", "Bearer pgf_000000000000_" + "A".repeat(43), "Basic abc", `Bearer ${key}x`) },
    { weight: 1, arbitrary: hostileString.map((s) => `Bearer ${s.replace(/[^\x20-\x7e]/g, "")}`) }
  )

// ---------------------------------------------------------------------------------------------

/** Every table's rows, fingerprinted: a refused request must leave it unchanged. */
const fingerprint = (schema: string, sql: ReturnType<typeof rawSql>) =>
  sql.unsafe(`
    select
      (select md5(coalesce(string_agg(j::text, ',' order by id), '')) from ${schema}.jobs j) as jobs,
      (select md5(coalesce(string_agg(d::text, ',' order by id), '')) from ${schema}.dead_letters d) as dead_letters,
      (select md5(coalesce(string_agg(c::text, ',' order by id), '')) from ${schema}.calls c) as calls,
      (select count(*) from ${schema}.call_artifacts) as artifacts,
      (select count(*) from ${schema}.api_keys) as keys,
      (select md5(coalesce(string_agg(s::text, ',' order by org_key, name), '')) from ${schema}.schedules s) as schedules,
      (select md5(coalesce(string_agg(a::text, ',' order by id), '')) from ${schema}.jobs_archive a) as archive,
      (select md5(coalesce(string_agg(c::text, ',' order by stage), '')) from ${schema}.stage_controls c) as stage_controls,
      (select md5(coalesce(string_agg(l::text, ',' order by stage), '')) from ${schema}.stage_limits l) as stage_limits`).then((rows) => JSON.stringify(rows[0]))

interface Sent extends Request {
  readonly authorization: string
}

const bodyBytes = (b: Body): string | Uint8Array =>
  b.kind === "json"
    ? JSON.stringify(b.value) ?? "null"
    : b.kind === "raw"
    ? b.text
    : b.kind === "bytes"
    ? b.bytes
    : b.where === "body"
    ? nestedText(b.depth, "1")
    : `{"stage":"echo","payload":{"n":${nestedText(b.depth, "1")}}}`

const send = async (listeners: { readonly api: string; readonly admin: string }, request: Sent) => {
  const headers: Record<string, string> = {}
  if (request.authorization !== "") headers.authorization = request.authorization
  const payload = request.body === undefined ? undefined : bodyBytes(request.body)
  if (payload !== undefined) headers["content-type"] = request.contentType ?? "application/json"
  const base = request.listener === "admin" ? listeners.admin : listeners.api
  const response = await fetch(`${base}${request.path}`, { method: request.method, headers, ...(payload !== undefined ? { body: payload } : {}) })
  const text = await response.text()
  return { status: response.status, text }
}

const utf8 = new TextDecoder("utf-8", { fatal: true })

/**
 * The answer a request must get whichever route it names: a NUL in its path or query is 400 before anything
 * else; past the key, a small body in another charset is 415, and one whose bytes are not UTF-8 is 400 naming
 * where. Undefined when the route decides.
 */
const mustBe = (request: Sent, key: string): { readonly status: number; readonly message: RegExp } | undefined => {
  if (/%00/i.test(request.path)) return { status: 400, message: /NUL/ }
  const keyed = request.listener === "admin" || request.authorization === `Bearer ${key}`
  if (!keyed || request.body === undefined || request.method === "GET") return undefined
  const bytes = Buffer.from(bodyBytes(request.body))
  if (bytes.length > 64 * 1024) return undefined
  const charset = /;\s*charset=("?)([^";]*)\1/i.exec(request.contentType ?? "")?.[2]
  if (charset !== undefined && charset.toLowerCase() !== "utf-8") return { status: 415, message: /UnsupportedMediaType/ }
  try {
    utf8.decode(bytes)
    return undefined
  } catch {
    return { status: 400, message: /not valid UTF-8: invalid byte sequence at byte offset \d+/ }
  }
}

describe("the UTF-8 check", () => {
  it("agrees with a fatal TextDecoder on any bytes, and names where a replacing decoder would put its first U+FFFD", () => {
    const replacing = new TextDecoder("utf-8")
    const bytes = fc.oneof(
      fc.uint8Array({ maxLength: 24 }),
      fc.tuple(fc.string({ maxLength: 6 }), notUtf8, fc.string({ maxLength: 6 })).map(([a, bad, b]) => Buffer.concat([Buffer.from(a), Buffer.from(bad), Buffer.from(b)]))
    )
    fc.assert(fc.property(bytes, (input) => {
      const at = StrictInput.invalidUtf8Offset(input)
      let valid = true
      try {
        utf8.decode(input)
      } catch {
        valid = false
      }
      expect(at === undefined).toBe(valid)
      if (at !== undefined) {
        const before = replacing.decode(input.subarray(0, at))
        expect(utf8.decode(input.subarray(0, at))).toBe(before)
        expect(replacing.decode(input).slice(0, before.length + 1)).toBe(`${before}\ufffd`)
      }
    }), { numRuns: 2000 })
  })
})

describe("bad requests, generated", () => {
  layer(world, { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.scoped("never a 5xx, always a JSON error body, and nothing written on a 4xx", () =>
      Effect.gen(function*() {
        const base = { api: yield* baseUrl, admin: yield* adminUrl }
        const db = yield* Db.Db
        const key = yield* newKey({ orgId: "prop" })
        // something to aim at: a live job and a dead letter of the key's org
        const live = yield* Effect.promise(() => send(base, { method: "POST", path: "/jobs", authorization: `Bearer ${key}`, body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, delayMs: 3_600_000 } } }))
        yield* Effect.promise(() => send(base, { method: "POST", path: "/jobs", authorization: `Bearer ${key}`, body: { kind: "json", value: { stage: "manual", payload: {} } } }))
        const doomed = yield* Effect.promise(() => send(base, { method: "POST", path: "/jobs", authorization: `Bearer ${key}`, body: { kind: "json", value: { stage: "echo", payload: { n: 2, fail: true } } } }))
        yield* Effect.promise(() => send(base, { method: "POST", path: "/api/jobs/tick", authorization: `Bearer ${key}`, body: { kind: "json", value: { max: 10 } } }))
        const ids = [JSON.parse(live.text).id as string, JSON.parse(doomed.text).id as string, "1", "2"]
        // and a schedule of the key's org, whose name the generated requests aim at
        const scheduled = yield* Effect.promise(() => send(base, { method: "PUT", path: "/schedules/prop-nightly", authorization: `Bearer ${key}`, body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *", timeZone: "Europe/Berlin" } } }))
        expect(scheduled.status).toBe(200)
        const names = ["prop-nightly", "nobody-has-this", "pgfiber.reap-expired", "a".repeat(128), "a".repeat(129), "-leading-dash", "x y", "x/y"]
        const sql = rawSql()
        yield* Effect.addFinalizer(() => Effect.promise(() => sql.end({ timeout: 5 })))
        const failures: Array<string> = []

        const property = fc.asyncProperty(endpoint(ids, names), authorization(key), async (request, auth) => {
          const sent: Sent = { ...request, authorization: auth }
          const before = await fingerprint(db.schema, sql)
          const reply = await send(base, sent)
          const after = await fingerprint(db.schema, sql)
          const described = `${sent.method} ${sent.path} → ${reply.status} ${reply.text.slice(0, 200)}`
          if (reply.status >= 500) failures.push(described)
          expect(reply.status, described).toBeLessThan(500)
          if (reply.status >= 400) {
            let parsed: any
            try {
              parsed = JSON.parse(reply.text)
            } catch {
              parsed = undefined
            }
            expect(parsed, described).toMatchObject({ _tag: expect.any(String), message: expect.any(String) })
            expect(after, `${described}: a refused request wrote to the database`).toBe(before)
          }
          const must = mustBe(sent, key)
          if (must !== undefined) {
            expect(reply.status, described).toBe(must.status)
            expect(reply.text, described).toMatch(must.message)
          }
        })

        // the reproductions first, then generated ones; the seed is printed should one fail
        const examples: Array<[Request, string]> = [
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1, s: "\u0000" } } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1, s: "\ud800" } } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, dedupeKey: "a\u0000" } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, subjectId: "\ud800" } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, runAt: "+275760-09-13T00:00:00Z" } } }, `Bearer ${key}`],
          [{ method: "GET", path: "/jobs/9999999999999999999" }, `Bearer ${key}`],
          [{ method: "GET", path: "/dlq/9999999999999999999" }, `Bearer ${key}`],
          [{ method: "GET", path: "/jobs?after=9999999999999999999" }, `Bearer ${key}`],
          [{ method: "GET", path: "/jobs?after=abc" }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "deep", depth: 5000, where: "payload" } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "deep", depth: 5000, where: "body" } }, `Bearer ${key}`],
          // schedules and dedupe modes, which the generators above reach too
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, dedupeKey: "k", dedupeMode: "merge" } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, dedupeMode: "replace" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *\u0000" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *", timeZone: "Europe/Berlin\u0000" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *", timeZone: "Mars/Olympus" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1, s: "a\u0000\ud800" }, cron: "0 3 * * *" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1e308 }, cron: "0 3 * * *" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1, pad: "x".repeat(300 * 1024) }, cron: "0 3 * * *" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 0 31 2 *" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *", everyMs: 60_000 } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/prop-nightly", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, everyMs: 1e300 } } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/schedules/a%00b", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *" } } }, `Bearer ${key}`],
          [{ method: "PUT", path: `/schedules/${"a".repeat(129)}`, body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, cron: "0 3 * * *" } } }, `Bearer ${key}`],
          [{ method: "POST", path: "/schedules/%ED%A0%80/run-now" }, `Bearer ${key}`],
          // a NUL in a schedule's name reached the database (500) until the service answered it as not found
          [{ method: "POST", path: "/schedules/%00/run-now" }, `Bearer ${key}`],
          [{ method: "POST", path: "/schedules/a%00/disable" }, `Bearer ${key}`],
          [{ method: "GET", path: "/schedules/prop-nightly%00" }, `Bearer ${key}`],
          [{ method: "DELETE", path: "/schedules/B039-%00" }, `Bearer ${key}`],
          // the last edges: NUL at the admin listener's routes, bytes that are not UTF-8, other charsets, dates that do not exist
          [{ method: "DELETE", path: "/limits/%00", listener: "admin" }, ""],
          [{ method: "PUT", path: "/limits/%00", listener: "admin", body: { kind: "json", value: { maxRunning: 1 } } }, ""],
          [{ method: "POST", path: "/stages/%00/pause", listener: "admin" }, ""],
          [{ method: "GET", path: "/limits?stage=%00", listener: "admin" }, ""],
          [{ method: "GET", path: "/jobs/%00" }, ""],
          [{ method: "POST", path: "/jobs", body: { kind: "bytes", bytes: Buffer.from([...Buffer.from("{\"stage\":\"echo\",\"payload\":{\"n\":1},\"subjectId\":\""), 0xff, 0xfe, 0x22, 0x7d]) } }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "bytes", bytes: Buffer.from([...Buffer.from("{\"stage\":\"echo\",\"payload\":{\"n\":1},\"subjectId\":\""), 0xed, 0xa0, 0x80, 0x22, 0x7d]) } }, `Bearer ${key}`],
          [{ method: "PUT", path: "/limits/echo", listener: "admin", body: { kind: "bytes", bytes: Buffer.from([...Buffer.from("{\"rate\":\""), 0xc0, 0xaf, 0x22, 0x7d]) } }, ""],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 } } }, contentType: "application/json; charset=utf-16" }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 } } }, contentType: "application/json; charset=latin1" }, `Bearer ${key}`],
          [{ method: "POST", path: "/jobs", body: { kind: "json", value: { stage: "echo", payload: { n: 1 }, runAt: "2026-02-30T10:00:00Z" } } }, `Bearer ${key}`]
        ]
        const outcome = yield* Effect.promise(() => fc.check(property, { numRuns: 400, examples, endOnFailure: true }))
        expect(failures).toEqual([])
        expect(outcome.failed ? `seed ${outcome.seed}: ${String(outcome.errorInstance).slice(0, 2000)}` : "passed").toBe("passed")
        // the cursor and id answers the issue asked for, exactly
        const cursor = yield* Effect.promise(() => send(base, { method: "GET", path: "/jobs?after=abc", authorization: `Bearer ${key}` }))
        expect(cursor.status).toBe(400)
        const huge = yield* Effect.promise(() => send(base, { method: "GET", path: "/jobs/9999999999999999999", authorization: `Bearer ${key}` }))
        expect(huge.status).toBe(404)
      }), 120_000)
  })
})
