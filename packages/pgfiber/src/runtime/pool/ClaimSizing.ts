/**
 * How many jobs a pool claims ahead of its slots under a backlog: a buffer sized in *time*, not by what the
 * claimer happens to see when it runs.
 *
 * The rule. While the last claim came back full (a backlog), the pool keeps `concurrency + ahead` jobs in hand,
 * where `ahead` is the work its slots can finish in one horizon:
 *
 *     rate    = concurrency / (mean run time of a job)         jobs per ms the slots can finish
 *     horizon = max(25 ms, 4 × mean claim round trip)          how long the buffer must last
 *     ahead   = clamp(ceil(rate × horizon), 1, maxAhead)
 *
 * and it refills once the waiting jobs fall to half of `ahead` (two claim round trips of work still in hand at
 * the least), so a claim asks for at least half a buffer: for fast jobs (a no-op: ahead = maxAhead = 500 at
 * concurrency 10) that is a claim per 250–500 jobs; for jobs of 20 ms on 100 slots (5 jobs/ms) 125 ahead; for
 * jobs of a second ahead is 1, so a long job waits in this process for at most one slot and others stay
 * claimable by other processes.
 *
 * Run time and round trip are measured the same way whatever the handler's shape (a synchronous one, or one that
 * awaits a Promise and so lets the claimer run between jobs), so the claims are too; docs/benchmarks.md has the
 * measurements.
 *
 * Bounds. `maxAhead` (`maxAheadFor`: 50 × concurrency, at most 500, graphile-worker's documented local queue)
 * is the fairness bound (claimed-ahead jobs of one org are run before another org's newer ones) and the crash
 * bound: a process that dies holds at most `concurrency + maxAhead` leased jobs (those not started are not run
 * twice: they are claimed again once their leases expire, with no handler having run), and at most
 * `concurrency + maxUnsettled` handlers' work is repeated (`maxUnsettledFor`, Core.ts).
 * Before any job has run, `ahead` is the concurrency.
 */

/** The shortest time a claimed-ahead buffer is sized to last. */
export const minHorizonMs = 25

/** Weight of a new sample in the running means (an exponentially weighted moving average). */
const weight = 0.2

/** A pool's measurements; `ran` and `claimed` update them in place (one value per pool, read by `ahead`). */
export interface Sizing {
  readonly concurrency: number
  readonly maxAhead: number
  /** Mean handler run time (ms); null until a job has run. */
  readonly meanRunMs: number | null
  /** Mean claim round trip (ms); null until a claim has returned. */
  readonly meanClaimMs: number | null
}

export const initial = (concurrency: number, maxAhead: number): Sizing => ({ concurrency, maxAhead, meanRunMs: null, meanClaimMs: null })

const mean = (previous: number | null, sample: number) => previous === null ? sample : previous + weight * (sample - previous)

/** A job ran for `ms` (the pool's own value, updated in place: this runs once per job). */
export const ran = (s: Sizing, ms: number): Sizing => {
  ;(s as { meanRunMs: number | null }).meanRunMs = mean(s.meanRunMs, Math.max(0, ms))
  return s
}

/** A claim took `ms` from sending to its jobs in hand. */
export const claimed = (s: Sizing, ms: number): Sizing => {
  ;(s as { meanClaimMs: number | null }).meanClaimMs = mean(s.meanClaimMs, Math.max(0, ms))
  return s
}

/** How long the buffer must last: several claim round trips, and never less than `minHorizonMs`. */
export const horizonMs = (s: Sizing) => Math.max(minHorizonMs, 4 * (s.meanClaimMs ?? 0))

/** Jobs to hold ahead of the slots under a backlog. */
export const ahead = (s: Sizing): number => {
  if (s.meanRunMs === null) return Math.min(s.concurrency, s.maxAhead)
  // a run measured as 0 ms (the clock's resolution) is a job of a few µs at most
  const rate = s.concurrency / Math.max(s.meanRunMs, 0.01)
  return Math.max(1, Math.min(s.maxAhead, Math.ceil(rate * horizonMs(s))))
}

/** Under a backlog, refill once the jobs waiting for a slot fall to this many: half of `ahead(s)`, given. */
export const refillAt = (buffer: number): number => Math.floor(buffer / 2)
