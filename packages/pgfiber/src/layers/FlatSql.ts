/**
 * The hot statements (the claims, the settles, the plain enqueue), composed from the same fragment builders as every
 * other statement but sent as one flat text with its parameters.
 *
 * porsager makes every `sql\`…\`` a `Query`, a Promise subclass, fragments included: a claim is built from ~25 of
 * them and a settle from ~15, each with two closures and a cached stack lookup, and each fragment gains a
 * property (`fragment = true`) after it is built. At a steady rate of single jobs that construction, its garbage,
 * and V8 trying and failing to optimise `Query`'s constructor again and again ("bailed out due to dependency
 * change", hundreds of times a minute) were a large share of the worker's CPU (docs/benchmarks.md).
 *
 * `flat(sql)` has the same tagged-template interface as `sql` for what the statement builders use (templates,
 * nested fragments, lists of fragments, `sql("identifier")`), but builds plain values. The outermost one, when
 * awaited, renders the text once (`$1`, `$2`, … in order) and sends it as `sql.unsafe(text, parameters,
 * { prepare: true })`: the same text every time for the same shape, so the same prepared statement, and the
 * parameters typed by the server's description of it, as porsager types a tagged template's.
 * Parameters are never spliced into the text.
 */
import type { Sql } from "./Db.js"

/** A fragment or a statement: its template's strings and the values between them. */
class Flat implements PromiseLike<unknown> {
  /** porsager's query, once this statement was sent (it is sent once, however often it is awaited). */
  private query: (PromiseLike<unknown> & { readonly state?: unknown; readonly cancel?: () => unknown }) | undefined

  constructor(
    private readonly sql: Sql,
    readonly strings: ReadonlyArray<string>,
    readonly args: ReadonlyArray<unknown>
  ) {}

  /** Rendered and sent when first awaited: only the outermost template is. */
  then<T1 = unknown, T2 = never>(
    onfulfilled?: ((value: unknown) => T1 | PromiseLike<T1>) | null,
    onrejected?: ((reason: unknown) => T2 | PromiseLike<T2>) | null
  ): PromiseLike<T1 | T2> {
    if (this.query === undefined) {
      const { text, parameters } = render(this)
      this.query = this.sql.unsafe(text, parameters as Array<never>, { prepare: true })
    }
    return this.query.then(onfulfilled, onrejected)
  }

  /** porsager's state of the sent query (null: not on a connection yet), read by `Db.runQuery` when interrupted. */
  get state(): unknown {
    return this.query?.state ?? null
  }

  /** Cancels the sent query on the server, as porsager's `cancel`. */
  cancel(): unknown {
    return this.query?.cancel?.()
  }
}

/** `sql("name")`: an identifier, quoted as porsager quotes one (a dot separates a schema). */
class Identifier {
  constructor(readonly quoted: string) {}
}

const quote = (name: string) => "\"" + name.replace(/"/g, "\"\"").replace(/\./g, "\".\"") + "\""

export class FlatSqlDefect extends Error {
  override readonly name = "FlatSqlDefect"
}

/** The text with `$n` placeholders in order, and the parameters in the same order. */
export const render = (statement: Flat): { readonly text: string; readonly parameters: ReadonlyArray<unknown> } => {
  const parameters: Array<unknown> = []
  const text = renderInto(statement, parameters)
  return { text, parameters }
}

const renderInto = (f: Flat, parameters: Array<unknown>): string => {
  let text = f.strings[0]!
  for (let i = 1; i < f.strings.length; i++) text += valueText(f.args[i - 1], parameters) + f.strings[i]!
  return text
}

const valueText = (value: unknown, parameters: Array<unknown>): string => {
  if (value instanceof Flat) return renderInto(value, parameters)
  if (value instanceof Identifier) return value.quoted
  if (Array.isArray(value) && value.length > 0 && value[0] instanceof Flat) {
    // a list of fragments, as porsager joins one: each after a space
    let text = ""
    for (const f of value as ReadonlyArray<Flat>) text += " " + renderInto(f, parameters)
    return text
  }
  if (value !== null && typeof value === "object" && !Array.isArray(value) && !(value instanceof Date) && !(value instanceof Uint8Array)) {
    // a porsager fragment, identifier or helper built with the real `sql` would be sent as a value here: a defect
    throw new FlatSqlDefect(`a flat statement cannot hold ${value.constructor?.name ?? "an object"}: build its fragments with the flat sql`)
  }
  if (value === undefined) throw new FlatSqlDefect("undefined value in a flat statement")
  parameters.push(value)
  return "$" + parameters.length
}

/**
 * `sql` for a hot statement's builders: their templates become plain values, and the outermost, awaited, goes to
 * `sql` as one prepared statement. Typed as `Sql` so the builders are written once for both; only templates,
 * nested fragments and identifiers are supported (anything else, used by mistake, is a `FlatSqlDefect`).
 */
export const flat = (sql: Sql): Sql => {
  const tag = (first: TemplateStringsArray | string, ...args: ReadonlyArray<unknown>) => {
    if (typeof first === "string" && args.length === 0) return new Identifier(quote(first))
    if (typeof first === "object" && Array.isArray((first as TemplateStringsArray).raw)) return new Flat(sql, first, args)
    throw new FlatSqlDefect("a flat sql supports templates and identifiers only")
  }
  return tag as unknown as Sql
}
