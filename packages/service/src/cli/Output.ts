/**
 * What operator commands print. Results go to stdout (an id, a table, JSON) so scripts can capture them;
 * log lines go to stderr while an operator command runs (`logsToStderr`), through the same logger and secret
 * redaction as the service, so `id=$(pgfiber enqueue …)` captures the id and nothing else.
 */
import { Effect } from "effect"
import { Console as NodeConsole } from "node:console"

/** Writes a line to stdout and waits until it is handed to the OS (the process may exit right after). */
export const line = (text: string) =>
  Effect.async<void>((resume) => {
    process.stdout.write(`${text}\n`, () => resume(Effect.void))
  })

export const json = (value: unknown) => line(JSON.stringify(value, null, 2))

/** A note for the human at the terminal, on stderr (never mixed into a result). */
export const note = (text: string) =>
  Effect.async<void>((resume) => {
    process.stderr.write(`${text}\n`, () => resume(Effect.void))
  })

const stderrConsole = new NodeConsole({ stdout: process.stderr, stderr: process.stderr })

/** Runs the effect with the logger's output on stderr (the logger writes through the Console service). */
export const logsToStderr = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.flatMap(Effect.console, (console) => Effect.withConsole(effect, { ...console, unsafe: stderrConsole }))

export interface Column {
  readonly header: string
  readonly align?: "left" | "right"
}

/** A plain aligned table: a header row, then one row per item; no colours, so it survives a pipe. */
export const table = (columns: ReadonlyArray<Column>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = columns.map((c, i) => Math.max(c.header.length, ...rows.map((r) => (r[i] ?? "").length)))
  const render = (cells: ReadonlyArray<string>) =>
    cells
      .map((cell, i) => (columns[i]!.align === "right" ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd()
  return [render(columns.map((c) => c.header)), ...rows.map(render)].join("\n")
}

/** A list command's result: `list` as JSON (`--json`), else as a table of `cells` per item. */
export const items = <A>(
  asJson: boolean,
  list: ReadonlyArray<A>,
  columns: ReadonlyArray<Column>,
  cells: (item: A) => ReadonlyArray<string>
) => (asJson ? json(list) : line(table(columns, list.map(cells))))

/** 0s, 850ms, 12.3s, 5m12s, 3h4m, 2d3h: short enough for a table column. */
export const age = (ms: number): string => {
  if (ms <= 0) return "-"
  if (ms < 1000) return `${Math.round(ms)}ms`
  const s = ms / 1000
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m}m${Math.floor(s % 60)}s`
  const h = Math.floor(m / 60)
  if (h < 48) return `${h}h${m % 60}m`
  return `${Math.floor(h / 24)}d${h % 24}h`
}

export const truncate = (text: string | null, max = 60): string => {
  if (text === null) return ""
  const flat = text.replace(/\s+/g, " ")
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat
}
