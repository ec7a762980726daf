/**
 * HTML built by a tagged template that escapes every interpolated value unless it is already `Html` (made by
 * this template). Payloads, errors, stage and org names are user data: none of them can become markup.
 */

const htmlBrand: unique symbol = Symbol.for("pgfiber/dashboard/Html")

export interface Html {
  readonly [htmlBrand]: true
  readonly text: string
}

const make = (text: string): Html => ({ [htmlBrand]: true, text })

export const isHtml = (u: unknown): u is Html => typeof u === "object" && u !== null && htmlBrand in u

const entities: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;", "'": "&#39;", "`": "&#96;" }

/** Text as it must appear inside an element or a quoted attribute. */
export const escape = (text: string): string => text.replace(/[&<>"'`]/g, (c) => entities[c]!)

export type Value = Html | string | number | boolean | null | undefined | ReadonlyArray<Value>

const render = (value: Value): string => {
  if (value === null || value === undefined || value === false) return ""
  if (Array.isArray(value)) return value.map(render).join("")
  if (isHtml(value)) return value.text
  return escape(String(value))
}

export const html = (strings: TemplateStringsArray, ...values: ReadonlyArray<Value>): Html => {
  let out = strings[0]!
  for (let i = 0; i < values.length; i++) out += render(values[i]!) + strings[i + 1]!
  return make(out)
}

/**
 * JSON for a `<script type="application/json">` block (data, never executed): `<`, `>` and `&` are written as
 * escapes so no payload can close the element.
 */
export const jsonData = (value: unknown): Html =>
  make(JSON.stringify(value).replace(/</g, "\\u003c").replace(/>/g, "\\u003e").replace(/&/g, "\\u0026").replace(/\u2028/g, "\\u2028").replace(/\u2029/g, "\\u2029"))

export const toString = (h: Html): string => h.text
