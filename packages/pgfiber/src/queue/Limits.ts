/**
 * A stage's share of the system: fair claiming across orgs, global caps on running jobs (per stage and per
 * org within it) and a token bucket. Three layers decide them, each over the one before: the stage's code
 * (`Stage.make`), configuration (`PGFIBER_MAX_RUNNING` and friends) and run-time overrides kept in the
 * database (`pgfiber limits set`, `PUT /limits/:stage`), which every process's claims read within a second.
 */
import { Duration, Either } from "effect"

/** A token bucket: `limit` claims every `per`, at most `burst` at once; per org when `perOrg`. */
export interface RateLimit {
  readonly limit: number
  readonly perMs: number
  readonly burst: number
  readonly perOrg: boolean
}

/** What one claim of a stage obeys. */
export interface Shares {
  /** Round-robin across orgs within a priority (default on). */
  readonly fair: boolean
  /** Running jobs of the stage across every process; null: no cap. */
  readonly maxRunning: number | null
  /** Running jobs of one org in the stage across every process; null: no cap. */
  readonly maxRunningPerOrg: number | null
  readonly rate: RateLimit | null
}

export const defaultShares: Shares = { fair: true, maxRunning: null, maxRunningPerOrg: null, rate: null }

/** True when the claim must count and spend under the stage's lock. */
export const isLimited = (s: Shares) => s.maxRunning !== null || s.maxRunningPerOrg !== null || s.rate !== null

/**
 * A run-time override; an absent (null) field keeps what code and configuration say, 0 lifts a cap or a rate
 * limit.
 */
export interface Override {
  readonly fair: boolean | null
  readonly maxRunning: number | null
  readonly maxRunningPerOrg: number | null
  readonly rateLimit: number | null
  readonly ratePerMs: number | null
  readonly rateBurst: number | null
  readonly ratePerOrg: boolean | null
}

export const emptyOverride: Override = {
  fair: null, maxRunning: null, maxRunningPerOrg: null, rateLimit: null, ratePerMs: null, rateBurst: null, ratePerOrg: null
}

/** Shares with an override applied. */
export const applyOverride = (base: Shares, o: Override | null | undefined): Shares => {
  if (!o) return base
  const cap = (over: number | null, was: number | null) => (over === null ? was : over === 0 ? null : over)
  let rate = base.rate
  if (o.rateLimit === 0) rate = null
  else if (o.rateLimit !== null || rate !== null) {
    const limit = o.rateLimit ?? rate!.limit
    rate = {
      limit,
      perMs: o.ratePerMs ?? rate?.perMs ?? 1000,
      burst: o.rateBurst ?? (rate && o.ratePerMs === null && o.rateLimit === null ? rate.burst : defaultBurst({ limit, perMs: o.ratePerMs ?? rate?.perMs ?? 1000 })),
      perOrg: o.ratePerOrg ?? rate?.perOrg ?? false
    }
  }
  return {
    fair: o.fair ?? base.fair,
    maxRunning: cap(o.maxRunning, base.maxRunning),
    maxRunningPerOrg: cap(o.maxRunningPerOrg, base.maxRunningPerOrg),
    rate
  }
}

/**
 * What a stage declares in code: `rate: "500/1h"` or an object. `burst` defaults to a second's worth of tokens
 * (at least 1): slow rates stay evenly spaced, fast ones do not lose tokens to a wake-up a few ms late.
 */
export interface StageLimits {
  readonly fair?: boolean
  readonly maxRunning?: number
  readonly maxRunningPerOrg?: number
  readonly rate?: string | { readonly limit: number; readonly per: Duration.DurationInput; readonly burst?: number; readonly perOrg?: boolean }
}

/** `500/1h`, `20/s`, `5/1s`, `100/10m` (optionally `,burst=…` is not part of this syntax; see `parseRate`). */
export const parseRate = (text: string): Either.Either<{ limit: number; perMs: number }, string> => {
  const m = /^\s*(\d+)\s*\/\s*(\d*(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$/.exec(text)
  if (!m) return Either.left(`"${text}" is not a rate like 20/s or 500/1h`)
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[3] as "ms" | "s" | "m" | "h" | "d"]
  const limit = Number(m[1])
  const perMs = Math.round((m[2] === "" ? 1 : Number(m[2])) * unit)
  if (!(limit >= 1) || !(perMs >= 1)) return Either.left(`"${text}" needs at least 1 per at least 1ms`)
  // what the columns hold (integer tokens, a bigint period): larger is a typo, not a limit
  if (limit > 2_147_483_647) return Either.left(`"${text}": at most 2147483647 per period`)
  if (perMs > 10 * 365 * 86_400_000) return Either.left(`"${text}": the period can be at most 10 years`)
  return Either.right({ limit, perMs })
}

export const formatRate = (r: RateLimit) => {
  const units: ReadonlyArray<readonly [string, number]> = [["d", 86_400_000], ["h", 3_600_000], ["m", 60_000], ["s", 1000]]
  const unit = units.find(([, ms]) => r.perMs % ms === 0)
  const per = unit ? `${r.perMs / unit[1] === 1 ? "" : r.perMs / unit[1]}${unit[0]}` : `${r.perMs}ms`
  return `${r.limit}/${per}${r.burst !== 1 ? ` burst ${r.burst}` : ""}${r.perOrg ? " per org" : ""}`
}

/** A second's worth of tokens, at least 1. */
export const defaultBurst = (r: { readonly limit: number; readonly perMs: number }) => Math.max(1, Math.floor(r.limit * 1000 / r.perMs))

/** A stage's code declaration as Shares. */
export const fromStage = (l: StageLimits | undefined): Shares => {
  if (!l) return defaultShares
  let rate: RateLimit | null = null
  if (typeof l.rate === "string") {
    const parsed = parseRate(l.rate)
    if (Either.isLeft(parsed)) throw new Error(parsed.left)
    rate = { ...parsed.right, burst: defaultBurst(parsed.right), perOrg: false }
  } else if (l.rate) {
    const r = { limit: l.rate.limit, perMs: Duration.toMillis(Duration.decode(l.rate.per)) }
    rate = { ...r, burst: l.rate.burst ?? defaultBurst(r), perOrg: l.rate.perOrg ?? false }
  }
  return { fair: l.fair ?? true, maxRunning: l.maxRunning ?? null, maxRunningPerOrg: l.maxRunningPerOrg ?? null, rate }
}

/** What a claim found about the stage's limits. */
export interface ClaimResult<J> {
  readonly jobs: ReadonlyArray<J>
  /**
   * Rows the claim took, `jobs` and any it dead-lettered because they did not decode (absent: `jobs.length`).
   * A claim that took all it asked for says a backlog is left, even when one of them could not run.
   */
  readonly taken?: number
  /** The bucket ran dry with jobs ready: ms until its next token. */
  readonly rateLimitedForMs: number | null
  /** The claim came back short with jobs ready under a cap: wait for a slot to free. */
  readonly capped: boolean
}

/** A stage's limits as an operator sees them: each layer, and what claims obey. */
export interface View {
  readonly stage: string
  readonly effective: Shares
  /** The run-time override in force, if any. */
  readonly override: Override | null
  /** Where the effective limits come from: the code alone, configuration over it, or a run-time override. */
  readonly source: "code" | "config" | "override"
}

export const view = (stage: string, code: Shares, config: Partial<Override> | undefined, override: Override | null): View => {
  const configured = config && Object.keys(config).length > 0 ? applyOverride(code, { ...emptyOverride, ...config }) : code
  return {
    stage,
    effective: applyOverride(configured, override),
    override,
    source: override ? "override" : configured !== code ? "config" : "code"
  }
}

/** A plain-text line of a stage's limits, for tables. */
export const describe = (s: Shares) => ({
  fair: s.fair ? "yes" : "no",
  maxRunning: s.maxRunning === null ? "-" : String(s.maxRunning),
  maxRunningPerOrg: s.maxRunningPerOrg === null ? "-" : String(s.maxRunningPerOrg),
  rate: s.rate === null ? "-" : formatRate(s.rate)
})
