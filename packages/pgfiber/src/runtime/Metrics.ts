/**
 * The runtime's metrics, as module-level constants tagged per stage. `/metrics` renders them in Prometheus
 * text; tests and `stats` read them through `Metric.value`.
 */
import { Metric, MetricBoundaries, MetricKey, type MetricKeyType } from "effect"
import { enqueuedTotal } from "../queue/Job.js"

/** The keys of the metrics defined here, for `forStage`. */
const keys = new WeakMap<object, MetricKey.MetricKey<MetricKeyType.MetricKeyType<any, any>>>()

/** A metric from its key (as `Metric.counter` and `Metric.histogram` make them), its key kept for `forStage`. */
const keyed = <Type extends MetricKeyType.MetricKeyType<any, any>>(key: MetricKey.MetricKey<Type>) => {
  const metric = Metric.fromMetricKey(key)
  keys.set(metric, key)
  return metric
}

const counter = (name: string, description: string) => keyed(MetricKey.counter(name, { description, incremental: true }))

/** Counted by the queue itself, so follow-ups and every producer are included. */
export const enqueued = enqueuedTotal
export const claimed = counter("pgfiber_jobs_claimed_total", "Jobs leased by this process")
/** Claim statements, whatever they found: with `claimed`, what a wake-up costs (many processes woken for one job claim for nothing). */
export const claims = counter("pgfiber_claims_total", "Claim statements sent by this process")
export const completed = counter("pgfiber_jobs_completed_total", "Jobs completed")
export const retried = counter("pgfiber_jobs_retried_total", "Failed runs put back with a backoff")
export const rescheduled = counter("pgfiber_jobs_rescheduled_total", "Polls rescheduled (NotReady)")
export const deadLettered = counter("pgfiber_jobs_dead_lettered_total", "Jobs moved to the dead-letter table")
export const released = counter("pgfiber_jobs_released_total", "Jobs handed back without an attempt (shutdown)")
export const fenced = counter("pgfiber_jobs_fenced_total", "Outcomes refused because the lease had been lost")
export const listenerReconnects = counter("pgfiber_listener_reconnects_total", "LISTEN connection (re)established")

export const duration = keyed(MetricKey.histogram(
  "pgfiber_job_duration_seconds",
  MetricBoundaries.fromIterable([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800]),
  "Handler run time"
))

const tagged = new WeakMap<object, Map<string, unknown>>()

/**
 * The metric tagged with the stage; memoised, since it is asked for on every job. A metric defined here is
 * made from its tagged key, the same key `Metric.tagged` reaches: an update then goes straight to its value,
 * where `Metric.tagged`'s builds that key anew on each (the job duration is updated once per job).
 */
export const forStage = <T extends Metric.Metric<any, any, any>>(metric: T, stage: string): T => {
  let byStage = tagged.get(metric)
  if (!byStage) tagged.set(metric, (byStage = new Map()))
  let m = byStage.get(stage) as T | undefined
  if (!m) {
    const key = keys.get(metric)
    m = (key === undefined ? Metric.tagged(metric, "stage", stage) : Metric.fromMetricKey(MetricKey.tagged(key, "stage", stage))) as T
    byStage.set(stage, m)
  }
  return m
}
