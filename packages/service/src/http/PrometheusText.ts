/**
 * Prometheus text exposition (format 0.0.4) of Effect's metric registry, plus gauges computed at scrape time
 * (queue depth, lag). Counters tagged `stage` become `name{stage="…"}`; histograms get cumulative `_bucket`
 * series with `le`, `_sum` and `_count`.
 */
import { MetricKeyType, MetricState } from "effect"
import type * as MetricPair from "effect/MetricPair"

export interface Sample {
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

/** A family computed at scrape time (not held in Effect's registry). */
export interface Family {
  readonly name: string
  readonly help: string
  readonly type: "gauge" | "counter"
  readonly samples: ReadonlyArray<Sample>
}

export const contentType = "text/plain; version=0.0.4; charset=utf-8"

const metricName = (name: string) => {
  const clean = name.replace(/[^a-zA-Z0-9_:]/g, "_")
  return /^[a-zA-Z_:]/.test(clean) ? clean : `_${clean}`
}
const labelName = (name: string) => {
  const clean = name.replace(/[^a-zA-Z0-9_]/g, "_")
  return /^[a-zA-Z_]/.test(clean) && !clean.startsWith("__") ? clean : `_${clean.replace(/^_+/, "")}`
}
const escapeLabel = (value: string) => value.replace(/\\/g, "\\\\").replace(/"/g, "\\\"").replace(/\n/g, "\\n")
const escapeHelp = (text: string) => text.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")

export const formatValue = (n: number): string =>
  Number.isNaN(n) ? "NaN" : n === Infinity ? "+Inf" : n === -Infinity ? "-Inf" : String(n)

const labelText = (labels: Readonly<Record<string, string>>) => {
  const entries = Object.entries(labels)
  return entries.length === 0 ? "" : `{${entries.map(([k, v]) => `${labelName(k)}="${escapeLabel(v)}"`).join(",")}}`
}

interface Rendered {
  help: string
  type: string
  lines: Array<string>
}

/** The whole exposition: Effect's registry first, then the scrape-time families. */
export const render = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>, extra: ReadonlyArray<Family> = []): string => {
  const families = new Map<string, Rendered>()
  const family = (name: string, help: string, type: string) => {
    let f = families.get(name)
    if (f === undefined) {
      f = { help, type, lines: [] }
      families.set(name, f)
    }
    return f
  }
  const sorted = [...pairs].sort((a, b) => a.metricKey.name.localeCompare(b.metricKey.name))
  for (const { metricKey: key, metricState: state } of sorted) {
    const name = metricName(key.name)
    const help = key.description._tag === "Some" ? key.description.value : key.name
    const labels: Record<string, string> = {}
    for (const tag of key.tags) labels[tag.key] = tag.value
    if (MetricState.isCounterState(state)) {
      const incremental = MetricKeyType.isCounterKey(key.keyType) && key.keyType.incremental
      family(name, help, incremental ? "counter" : "gauge").lines.push(`${name}${labelText(labels)} ${formatValue(Number(state.count))}`)
    } else if (MetricState.isGaugeState(state)) {
      family(name, help, "gauge").lines.push(`${name}${labelText(labels)} ${formatValue(Number(state.value))}`)
    } else if (MetricState.isHistogramState(state)) {
      const f = family(name, help, "histogram")
      let sawInf = false
      for (const [bound, cumulative] of state.buckets) {
        if (bound === Infinity) sawInf = true
        f.lines.push(`${name}_bucket${labelText({ ...labels, le: formatValue(bound) })} ${formatValue(cumulative)}`)
      }
      if (!sawInf) f.lines.push(`${name}_bucket${labelText({ ...labels, le: "+Inf" })} ${formatValue(state.count)}`)
      f.lines.push(`${name}_sum${labelText(labels)} ${formatValue(state.sum)}`)
      f.lines.push(`${name}_count${labelText(labels)} ${formatValue(state.count)}`)
    } else if (MetricState.isSummaryState(state)) {
      const f = family(name, help, "summary")
      for (const [quantile, value] of state.quantiles) {
        if (value._tag === "Some") f.lines.push(`${name}${labelText({ ...labels, quantile: formatValue(quantile) })} ${formatValue(value.value)}`)
      }
      f.lines.push(`${name}_sum${labelText(labels)} ${formatValue(state.sum)}`)
      f.lines.push(`${name}_count${labelText(labels)} ${formatValue(state.count)}`)
    } else if (MetricState.isFrequencyState(state)) {
      const f = family(name, help, "counter")
      for (const [occurrence, count] of state.occurrences) {
        f.lines.push(`${name}${labelText({ ...labels, value: occurrence })} ${formatValue(count)}`)
      }
    }
  }
  for (const extraFamily of extra) {
    const name = metricName(extraFamily.name)
    const f = family(name, extraFamily.help, extraFamily.type)
    for (const sample of extraFamily.samples) f.lines.push(`${name}${labelText(sample.labels)} ${formatValue(sample.value)}`)
  }
  const out: Array<string> = []
  for (const [name, f] of families) {
    out.push(`# HELP ${name} ${escapeHelp(f.help)}`, `# TYPE ${name} ${f.type}`, ...f.lines)
  }
  return `${out.join("\n")}\n`
}
