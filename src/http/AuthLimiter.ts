/**
 * A bounded, in-memory limit on failed authentications per client address: after `maxFailures` failures within
 * `window`, that address gets 429 (with `Retry-After`) until the window it started ends, without a database
 * lookup. Every failure otherwise costs an index probe, and a key's secret is 256 random bits, so the limit is
 * about load, not guessing. At most `maxClients` addresses are remembered (the oldest window is forgotten first),
 * so a flood from many addresses costs bounded memory. Per process: several replicas each keep their own count.
 */

export interface AuthLimiterOptions {
  readonly maxFailures: number
  readonly windowMs: number
  readonly maxClients: number
}

export const defaults: AuthLimiterOptions = { maxFailures: 20, windowMs: 60_000, maxClients: 10_000 }

export interface AuthLimiter {
  /** Milliseconds until `address` may try again; 0 when it may now. */
  readonly blockedForMs: (address: string, now: number) => number
  readonly recordFailure: (address: string, now: number) => void
}

export const make = (options: AuthLimiterOptions = defaults): AuthLimiter => {
  // insertion order is window-start order: a window is re-inserted when it restarts
  const windows = new Map<string, { start: number; failures: number }>()

  const current = (address: string, now: number) => {
    const w = windows.get(address)
    if (w === undefined || now - w.start >= options.windowMs) {
      if (w !== undefined) windows.delete(address)
      return undefined
    }
    return w
  }

  return {
    blockedForMs: (address, now) => {
      const w = current(address, now)
      return w !== undefined && w.failures >= options.maxFailures ? w.start + options.windowMs - now : 0
    },
    recordFailure: (address, now) => {
      const w = current(address, now)
      if (w !== undefined) {
        w.failures += 1
        return
      }
      windows.set(address, { start: now, failures: 1 })
      while (windows.size > options.maxClients) {
        const oldest = windows.keys().next()
        if (oldest.done) break
        windows.delete(oldest.value)
      }
    }
  }
}
