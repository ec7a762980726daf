/**
 * The failed-authentication limit: as a value (per client and key prefix, per client, per window, forgetting the
 * oldest windows first), the client's address (X-Forwarded-For believed from trusted proxies only), and over a
 * real server: a valid key is always served, clients behind a configured proxy are told apart, a client that is
 * not a configured proxy cannot choose its address, and the API and the dashboard's sign-in share one budget.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Layer } from "effect"
import * as ApiKeys from "../../packages/service/src/auth/ApiKeys.js"
import * as AuthLimiter from "../../packages/service/src/auth/AuthLimiter.js"
import * as ClientAddress from "../../packages/service/src/auth/ClientAddress.js"
import { describeConfigError } from "../../packages/service/src/cli/Failure.js"
import * as Db from "../../packages/pgfiber/src/layers/Db.js"
import * as PgQueue from "../../packages/pgfiber/src/queue/PgQueue.js"
import * as Submit from "../../packages/pgfiber/src/runtime/Submit.js"
import * as Server from "../../packages/service/src/http/Server.js"
import { layerDb } from "../support/pg.js"
import { baseUrl, call, echo, layerTempStorage, newKey, pgfiber } from "./support.js"

const bogus = (prefix: string, i: number) => `pgf_${prefix}_${"A".repeat(42)}${i % 10}`

describe("AuthLimiter counts", () => {
  const counts = () => AuthLimiter.makeCounts({ maxFailures: 3, maxFailuresPerAddress: 5, windowMs: 1000, maxClients: 100 })

  it("blocks a client's key prefix after maxFailures in its window, until the window ends; other clients are not affected", () => {
    const limiter = counts()
    for (let i = 0; i < 3; i++) {
      expect(limiter.blockedForMs("10.0.0.1", "aaaaaaaaaaaa", 100 + i)).toBe(0)
      limiter.recordFailure("10.0.0.1", "aaaaaaaaaaaa", 100 + i)
    }
    expect(limiter.blockedForMs("10.0.0.1", "aaaaaaaaaaaa", 500)).toBe(600)
    expect(limiter.blockedForMs("10.0.0.1", "bbbbbbbbbbbb", 500)).toBe(0)
    expect(limiter.blockedForMs("10.0.0.2", "aaaaaaaaaaaa", 500)).toBe(0)
    expect(limiter.blockedForMs("10.0.0.1", "aaaaaaaaaaaa", 1100)).toBe(0)
    // a new window starts from scratch
    limiter.recordFailure("10.0.0.1", "aaaaaaaaaaaa", 1100)
    expect(limiter.blockedForMs("10.0.0.1", "aaaaaaaaaaaa", 1101)).toBe(0)
  })

  it("blocks every failing attempt of a client past maxFailuresPerAddress, whatever the prefixes", () => {
    const limiter = counts()
    for (let i = 0; i < 5; i++) limiter.recordFailure("10.0.0.1", `${i}`.repeat(12), 100)
    expect(limiter.blockedForMs("10.0.0.1", "fresh0000000", 200)).toBe(900)
    expect(limiter.blockedForMs("10.0.0.1", undefined, 200)).toBe(900)
    expect(limiter.blockedForMs("10.0.0.9", undefined, 200)).toBe(0)
  })

  it("remembers at most maxClients windows, forgetting the oldest first", () => {
    const limiter = AuthLimiter.makeCounts({ maxFailures: 1, maxFailuresPerAddress: 1, windowMs: 60_000, maxClients: 2 })
    limiter.recordFailure("a", undefined, 1)
    limiter.recordFailure("b", undefined, 2)
    limiter.recordFailure("c", undefined, 3)
    expect(["a", "b", "c"].map((address) => limiter.blockedForMs(address, undefined, 4) > 0)).toEqual([false, true, true])
  })
})

describe("the client's address", () => {
  const trusted = (text: string) => Either.getOrThrow(ClientAddress.parseTrustedProxies(text))

  it("is the peer's unless the peer is a trusted proxy; then X-Forwarded-For read from the right, past trusted proxies", () => {
    const proxies = trusted("10.0.0.0/8, 192.168.1.10 fd00::/8")
    expect(ClientAddress.resolve(proxies, "203.0.113.5", "198.51.100.1")).toBe("203.0.113.5")
    expect(ClientAddress.resolve(proxies, "::ffff:203.0.113.5", undefined)).toBe("203.0.113.5")
    expect(ClientAddress.resolve(proxies, "10.1.2.3", "198.51.100.1")).toBe("198.51.100.1")
    expect(ClientAddress.resolve(proxies, "::ffff:10.1.2.3", "198.51.100.1")).toBe("198.51.100.1")
    // what the client wrote itself is left of what the proxy appended
    expect(ClientAddress.resolve(proxies, "10.1.2.3", "1.1.1.1, 198.51.100.1")).toBe("198.51.100.1")
    // a chain of trusted proxies, with ports and brackets as some proxies write them
    expect(ClientAddress.resolve(proxies, "fd00::1", "198.51.100.1:4711, 192.168.1.10")).toBe("198.51.100.1")
    expect(ClientAddress.resolve(proxies, "10.1.2.3", "[2001:DB8::7]:443")).toBe("2001:db8::7")
    // every hop a proxy: the left-most; garbage: the proxy that wrote it
    expect(ClientAddress.resolve(proxies, "10.1.2.3", "10.9.9.9, 10.8.8.8")).toBe("10.9.9.9")
    expect(ClientAddress.resolve(proxies, "10.1.2.3", "not-an-address")).toBe("10.1.2.3")
    expect(ClientAddress.resolve(ClientAddress.none, "10.1.2.3", "198.51.100.1")).toBe("10.1.2.3")
  })

  it("PGFIBER_TRUSTED_PROXIES: a list of addresses and CIDRs; a bad entry fails, naming the variable", () =>
    Effect.gen(function*() {
      const read = (value: string) =>
        Effect.either(Effect.withConfigProvider(AuthLimiter.config, ConfigProvider.fromMap(new Map([["PGFIBER_TRUSTED_PROXIES", value]]))))
      const good = yield* read("10.0.0.0/8,127.0.0.1 ::1")
      expect(Either.isRight(good) && good.right.trustedProxies.entries).toEqual(["10.0.0.0/8", "127.0.0.1", "::1"])
      expect(Either.isRight(good) && good.right.trustedProxies.contains("10.200.0.1")).toBe(true)
      expect(Either.isRight(good) && good.right.trustedProxies.contains("11.0.0.1")).toBe(false)
      for (const bad of ["10.0.0.0/33", "proxy.internal", "10.0.0.0/8,,fe80::/129", "1.2.3.4/8/8", "10.0.0.0/-1", "10.0.0.1:80", "[::1]"]) {
        const result = yield* read(bad)
        expect(Either.isLeft(result), bad).toBe(true)
        if (Either.isLeft(result)) expect(describeConfigError(result.left)).toMatch(/^PGFIBER_TRUSTED_PROXIES: .* is not an IP address or CIDR/)
      }
    }).pipe(Effect.runPromise))
})

// ---------------------------------------------------------------------------------------------
// over a real server

const stages = [echo]

/** The API and the dashboard (default), no worker: what is under test is the guard in front of them. */
const world = (authFailures: Partial<AuthLimiter.AuthLimiterOptions>) =>
  Server.layer({
    host: "127.0.0.1",
    port: 0,
    admin: { host: "127.0.0.1", port: 0 },
    maxBodyBytes: 64 * 1024,
    maxUploadBytes: 64 * 1024,
    devTick: false,
    workerId: "limiter-test",
    authFailures
  }).pipe(
    Layer.provideMerge(layerTempStorage("pgfiber-limiter-storage-")),
    Layer.provideMerge(Layer.succeed(Submit.KnownStages, stages)),
    Layer.provideMerge(ApiKeys.layer),
    Layer.provideMerge(PgQueue.layer({ knownStages: stages.map((s) => s.name) })),
    Layer.provideMerge(layerDb())
  )

const acmeKey = newKey({ orgId: "acme" })

/** The dashboard's sign-in form, posted; its 303 (signed in) is not followed. */
const signIn = (base: string, key: string, headers: Record<string, string> = {}) =>
  Effect.promise(async () => {
    const response = await fetch(`${base}/dashboard/login`, {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": "application/x-www-form-urlencoded", ...headers },
      body: new URLSearchParams({ key }).toString()
    })
    await response.text()
    return { status: response.status, headers: response.headers }
  })

describe("the limit over HTTP, no proxy configured", () => {
  layer(world({}), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("100 failed attempts from one address, then a valid key from it is served; a header it sends changes nothing", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const key = yield* acmeKey
        const statuses: Array<number> = []
        for (let i = 0; i < 100; i++) {
          // spread over many prefixes, malformed tokens and no token at all, each claiming another address
          const headers = { "x-forwarded-for": `198.51.100.${i}` }
          const reply = i % 3 === 0
            ? yield* call(base, "GET", "/jobs", { key: bogus("000000000000", i), headers })
            : i % 3 === 1
            ? yield* call(base, "GET", "/jobs", { key: bogus(i.toString(16).padStart(12, "0"), i), headers })
            : yield* call(base, "GET", "/jobs", { headers })
          statuses.push(reply.status)
          expect([401, 429], reply.text).toContain(reply.status)
          expect(reply.json._tag).toBe(reply.status === 401 ? "Unauthorized" : "TooManyRequests")
        }
        // the spoofed headers did not spread the failures over many clients
        const limited = yield* call(base, "GET", "/jobs", { key: bogus("000000000000", 1), headers: { "x-forwarded-for": "192.0.2.1" } })
        expect(limited.status).toBe(429)
        expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0)
        // one client (the peer) by the defaults: 20 failures each for the 34 bogus keys of one prefix and the 33
        // requests without a key, then 429s; the 33 other prefixes once each (73 failures, under the 100 per client)
        expect(statuses.filter((s) => s === 429).length).toBe(14 + 13)
        // a valid key is served, on the API and at the dashboard's sign-in
        const served = yield* call(base, "GET", "/jobs", { key })
        expect(served.status, served.text).toBe(200)
        expect((yield* call(base, "POST", "/jobs", { key, body: { stage: "echo", payload: { n: 1 } } })).status).toBe(201)
        const session = yield* signIn(base, key)
        expect(session.status).toBe(303)
        expect(session.headers.get("set-cookie")).toMatch(/^pgfiber_dashboard=/)
        // while a bad key still waits, at the sign-in too: one budget
        const refused = yield* signIn(base, bogus("000000000000", 0))
        expect(refused.status).toBe(429)
        expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0)
      }))
  })
})

describe("the limit over HTTP, behind a configured proxy", () => {
  // the test's requests come from 127.0.0.1: that is the proxy here, and X-Forwarded-For names the client
  const options = { maxFailures: 5, maxFailuresPerAddress: 8, trustedProxies: Either.getOrThrow(ClientAddress.parseTrustedProxies("127.0.0.1, ::1")) }
  layer(world(options), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("clients are told apart by X-Forwarded-For: one locked out, another still gets its 401s, a valid key gets in", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const key = yield* acmeKey
        const from = (client: string) => ({ "x-forwarded-for": client })
        const guesser: Array<number> = []
        for (let i = 0; i < 7; i++) guesser.push((yield* call(base, "GET", "/jobs", { key: bogus("000000000000", i), headers: from("203.0.113.7") })).status)
        expect(guesser).toEqual([401, 401, 401, 401, 401, 429, 429])
        // another key prefix from the same client still has the client's budget (8) left: 3 more
        const other: Array<number> = []
        for (let i = 0; i < 4; i++) other.push((yield* call(base, "GET", "/jobs", { key: bogus("111111111111", i), headers: from("203.0.113.7") })).status)
        expect(other).toEqual([401, 401, 401, 429])
        // another client behind the same proxy: its own 401s, not 429s
        for (let i = 0; i < 5; i++) {
          const reply = yield* call(base, "GET", "/jobs", { key: bogus("000000000000", i), headers: from("203.0.113.8") })
          expect(reply.status).toBe(401)
          expect(reply.json._tag).toBe("Unauthorized")
        }
        // and the locked-out client's valid key is served
        expect((yield* call(base, "GET", "/jobs", { key, headers: from("203.0.113.7") })).status).toBe(200)
      }))

    it.effect("what a client prepends to X-Forwarded-For is not believed: the proxy's own entry names it", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        // the client claims a new address each time; the proxy appended the real one last
        for (let i = 0; i < 5; i++) {
          expect((yield* call(base, "GET", "/jobs", { key: bogus("000000000000", i), headers: { "x-forwarded-for": `192.0.2.${i}, 203.0.113.20` } })).status).toBe(401)
        }
        expect((yield* call(base, "GET", "/jobs", { key: bogus("000000000000", 0), headers: { "x-forwarded-for": "192.0.2.99, 203.0.113.20" } })).status).toBe(429)
        expect((yield* call(base, "GET", "/jobs", { key: bogus("000000000000", 0), headers: { "x-forwarded-for": "192.0.2.99" } })).status).toBe(401)
      }))

    it.effect("the dashboard's sign-in and the API share one budget per client", () =>
      Effect.gen(function*() {
        const base = yield* baseUrl
        const key = yield* acmeKey
        const from = { "x-forwarded-for": "203.0.113.30" }
        for (let i = 0; i < 3; i++) expect((yield* call(base, "GET", "/jobs", { key: bogus("222222222222", i), headers: from })).status).toBe(401)
        for (let i = 0; i < 2; i++) expect((yield* signIn(base, bogus("222222222222", i), from)).status).toBe(401)
        expect((yield* signIn(base, bogus("222222222222", 9), from)).status).toBe(429)
        expect((yield* call(base, "GET", "/jobs", { key: bogus("222222222222", 9), headers: from })).status).toBe(429)
        expect((yield* signIn(base, key, from)).status).toBe(303)
      }))
  })
})

describe("PGFIBER_TRUSTED_PROXIES at start-up", () => {
  layer(layerDb(), { excludeTestServices: true, timeout: 120_000 })((it) => {
    it.effect("a bad value stops `pgfiber start` before it serves, naming the variable", () =>
      Effect.gen(function*() {
        const { schema } = yield* Db.Db
        const run = yield* pgfiber(schema, ["start"], { PGFIBER_TRUSTED_PROXIES: "10.0.0.0/8, proxy.internal", HTTP_PORT: "0", ADMIN_PORT: "0" })
        expect(run.code).toBe(78)
        expect(run.stderr).toContain("PGFIBER_TRUSTED_PROXIES")
        expect(run.stderr).toContain("proxy.internal")
      }))
  })
})
