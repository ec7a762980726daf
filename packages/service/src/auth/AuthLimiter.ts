/**
 * The failed-authentication limit, one budget shared by the HTTP API's bearer keys and the dashboard's sign-in.
 * Failures are counted per (client, key prefix) and per client in fixed windows: once a client has failed
 * `maxFailures` times with one key prefix, or `maxFailuresPerAddress` times in all, its failing attempts are
 * answered 429 with `Retry-After` instead of 401 until the window that started the count ends. A valid key is
 * never refused: the key is checked first and only a failing attempt is throttled, so a client that shares an
 * address with a guesser (everyone behind one proxy) still gets in. A key's secret is 256 random bits, so the
 * limit is about telling a misbehaving client to back off and keeping memory bounded, not about guessing; a
 * failure costs what a success does (one index probe, none for a token that is not shaped like a key).
 *
 * The client is the peer's address, or what a trusted proxy says it is (ClientAddress.ts). At most `maxClients`
 * windows are remembered in each count (the oldest forgotten first), so a flood from many addresses costs
 * bounded memory. In memory, per process: several replicas each keep their own count.
 */
import { Clock, Config, Context, Duration, Effect, Layer, Option } from "effect"
import * as Millis from "pgfiber/internal/layers/Millis.js"
import * as ApiKeys from "./ApiKeys.js"
import * as ClientAddress from "./ClientAddress.js"

export interface AuthLimiterOptions {
  /** Failed attempts one client may make with one key prefix (or with no well-formed key) per window. */
  readonly maxFailures: number
  /** Failed attempts one client may make per window, whatever the keys. */
  readonly maxFailuresPerAddress: number
  readonly windowMs: number
  /** Windows remembered per count. */
  readonly maxClients: number
  /** Proxies whose `X-Forwarded-For` names the client. */
  readonly trustedProxies: ClientAddress.TrustedProxies
}

export const defaults: AuthLimiterOptions = {
  maxFailures: 20,
  maxFailuresPerAddress: 100,
  windowMs: 60_000,
  maxClients: 10_000,
  trustedProxies: ClientAddress.none
}

// validate before the default: a validation after `withDefault` loses the variable's name in the error
export const config = Config.all({
  maxFailures: Config.integer("HTTP_AUTH_FAILURES_MAX").pipe(
    Config.validate({ message: "must be a whole number from 1 to 1000000", validation: (n) => n >= 1 && n <= 1_000_000 }),
    Config.withDefault(defaults.maxFailures)
  ),
  maxFailuresPerAddress: Config.integer("HTTP_AUTH_FAILURES_MAX_PER_ADDRESS").pipe(
    Config.validate({ message: "must be a whole number from 1 to 1000000", validation: (n) => n >= 1 && n <= 1_000_000 }),
    Config.withDefault(defaults.maxFailuresPerAddress)
  ),
  windowMs: Millis.config("HTTP_AUTH_FAILURES_WINDOW_MS", { min: 1000, max: 86_400_000, fallback: defaults.windowMs }).pipe(
    Config.map(Duration.toMillis)
  ),
  trustedProxies: ClientAddress.config
})

/** Failures per key in fixed windows; insertion order is window-start order (a window is re-inserted when it restarts). */
const makeWindows = (max: number, windowMs: number, maxKeys: number) => {
  const windows = new Map<string, { start: number; failures: number }>()
  const current = (key: string, now: number) => {
    const w = windows.get(key)
    if (w === undefined || now - w.start >= windowMs) {
      if (w !== undefined) windows.delete(key)
      return undefined
    }
    return w
  }
  return {
    blockedForMs: (key: string, now: number) => {
      const w = current(key, now)
      return w !== undefined && w.failures >= max ? w.start + windowMs - now : 0
    },
    record: (key: string, now: number) => {
      const w = current(key, now)
      if (w !== undefined) {
        w.failures += 1
        return
      }
      windows.set(key, { start: now, failures: 1 })
      while (windows.size > maxKeys) {
        const oldest = windows.keys().next()
        if (oldest.done) break
        windows.delete(oldest.value)
      }
    }
  }
}

/** The counts as a value; `prefix` is a presented key's prefix, or undefined for a token that is not shaped like one. */
export interface FailureCounts {
  /** Milliseconds until a failing attempt of `client` with `prefix` is answered 401 again; 0 when it is now. */
  readonly blockedForMs: (client: string, prefix: string | undefined, now: number) => number
  readonly recordFailure: (client: string, prefix: string | undefined, now: number) => void
}

export const makeCounts = (options: Omit<AuthLimiterOptions, "trustedProxies">): FailureCounts => {
  const perKey = makeWindows(options.maxFailures, options.windowMs, options.maxClients)
  const perAddress = makeWindows(options.maxFailuresPerAddress, options.windowMs, options.maxClients)
  // a space cannot occur in an address or a prefix
  const pair = (client: string, prefix: string | undefined) => `${client} ${prefix ?? "-"}`
  return {
    blockedForMs: (client, prefix, now) => Math.max(perKey.blockedForMs(pair(client, prefix), now), perAddress.blockedForMs(client, now)),
    recordFailure: (client, prefix, now) => {
      perKey.record(pair(client, prefix), now)
      perAddress.record(client, now)
    }
  }
}

/** What an attempt to authenticate comes to: the verified identity, a 401, or a 429 after `retryAfterMs`. */
export type Outcome<A> =
  | { readonly _tag: "Verified"; readonly value: A }
  | { readonly _tag: "Refused" }
  | { readonly _tag: "Throttled"; readonly retryAfterMs: number }

/** A throttled attempt's wait as a `Retry-After` value: whole seconds, rounded up, at least 1. */
export const retryAfterSeconds = (retryAfterMs: number) => Math.max(1, Math.ceil(retryAfterMs / 1000))

export class AuthLimiter extends Context.Tag("pgfiber/AuthLimiter")<AuthLimiter, {
  /** The client a request comes from: its peer's address, or the one trusted proxies give in `X-Forwarded-For`. */
  readonly clientOf: (peer: string | undefined, forwardedFor: string | undefined) => string
  /**
   * Runs `verify` for `token` presented by `client`: Verified whenever it finds the key, whatever the counts;
   * otherwise the failure is counted, and answered Throttled once the client is over a budget.
   */
  readonly authenticate: <A, E, R>(
    client: string,
    token: string | undefined,
    verify: Effect.Effect<Option.Option<A>, E, R>
  ) => Effect.Effect<Outcome<A>, E, R>
}>() {}

export const make = (options: AuthLimiterOptions) => {
  const counts = makeCounts(options)
  return AuthLimiter.of({
    clientOf: (peer, forwardedFor) => ClientAddress.resolve(options.trustedProxies, peer, forwardedFor),
    authenticate: (client, token, verify) =>
      Effect.gen(function*() {
        const found = yield* verify
        if (Option.isSome(found)) return { _tag: "Verified", value: found.value } as const
        const prefix = token === undefined ? undefined : ApiKeys.prefixOf(token)
        const now = yield* Clock.currentTimeMillis
        const wait = counts.blockedForMs(client, prefix, now)
        if (wait > 0) return { _tag: "Throttled", retryAfterMs: wait } as const
        counts.recordFailure(client, prefix, now)
        return { _tag: "Refused" } as const
      })
  })
}

export const layer = (options: Partial<AuthLimiterOptions> = {}) => Layer.sync(AuthLimiter, () => make({ ...defaults, ...options }))
