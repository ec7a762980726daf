/**
 * The dashboard's stages page and "new job" form, for every stage the viewer may name (compiled into the
 * service or registered by any worker; an org's key, the public ones only): whether a live process runs it,
 * its limits (an operator edits them), and a form to enqueue a job built from the payload's JSON Schema.
 * Pure functions from data to HTML, as Pages.ts; the form's fields are read back by `payloadFromForm`.
 */
import * as Limits from "pgfiber/internal/queue/Limits.js"
import type * as StageRegistry from "pgfiber/internal/runtime/StageRegistry.js"
import { html, type Html } from "./Html.js"

const csrfField = (csrf: string) => html`<input type="hidden" name="_csrf" value="${csrf}">`

export interface StageRow {
  readonly stage: StageRegistry.Operable
  readonly limits: Limits.View | undefined
}

const liveness = (s: StageRegistry.Operable) =>
  s.live === null
    ? html`<span class="muted" data-field="live">not registered</span>`
    : s.live
    ? html`<span data-field="live" title="${s.registered!.processes.map((p) => `${p.workerId}: ${p.live ? "live" : "gone"}, last seen ${p.lastSeenAt.toISOString()}`).join("\n")}">${s.registered!.processes.filter((p) => p.live).length} live</span>`
    : html`<span class="badge paused" data-field="live">no live process</span>`

const limitsForm = (base: string, csrf: string, name: string, v: Limits.View) => {
  const d = v.effective
  return html`<form class="limits" method="post" action="${base}/stages/${encodeURIComponent(name)}/limits">${csrfField(csrf)}
<label>max running <input name="maxRunning" type="number" min="0" step="1" value="${d.maxRunning ?? ""}" placeholder="no cap" size="6"></label>
<label>per org <input name="maxRunningPerOrg" type="number" min="0" step="1" value="${d.maxRunningPerOrg ?? ""}" placeholder="no cap" size="6"></label>
<label>rate <input name="rate" value="${d.rate === null ? "" : Limits.formatRate({ ...d.rate, burst: 1, perOrg: false })}" placeholder="none, or 20/s" size="8"></label>
<button class="plain" type="submit" data-action="limits">Save</button></form>`
}

const describeLimits = (v: Limits.View | undefined) => {
  if (v === undefined) return ""
  const d = Limits.describe(v.effective)
  return `fair ${d.fair} · max running ${d.maxRunning} · per org ${d.maxRunningPerOrg} · rate ${d.rate} (${v.source})`
}

export const stages = (base: string, csrf: string, admin: boolean, rows: ReadonlyArray<StageRow>): Html => html`
<h1>Stages</h1>
<p class="muted">Every stage ${admin ? "compiled into this service or registered by any worker" : "your key may submit to"}.</p>
<table id="registry"><thead><tr><th>stage</th><th>visibility</th><th>processes</th><th>limits</th><th></th></tr></thead>
<tbody>${rows.map(({ limits, stage: s }) => html`<tr data-stage="${s.name}"><td><a href="${base}/jobs?stage=${encodeURIComponent(s.name)}">${s.name}</a></td>
<td>${s.visibility}</td><td>${liveness(s)}</td>
<td data-field="limits">${admin && limits !== undefined ? html`<span class="muted">${describeLimits(limits)}</span>${limitsForm(base, csrf, s.name, limits)}` : describeLimits(limits)}</td>
<td class="actions"><a href="${base}/stages/${encodeURIComponent(s.name)}/new" data-action="new-job">New job…</a></td></tr>`)}</tbody></table>`

/** A JSON Schema's top-level properties as form fields: their `$ref`s into `$defs` resolved, one level. */
interface Field {
  readonly name: string
  readonly type: "string" | "number" | "integer" | "boolean" | "enum" | "json"
  readonly required: boolean
  readonly options: ReadonlyArray<string>
  readonly description: string | undefined
}

const asRecord = (u: unknown): Record<string, unknown> => (typeof u === "object" && u !== null && !Array.isArray(u) ? u as Record<string, unknown> : {})

export const fieldsOf = (schema: unknown): ReadonlyArray<Field> | undefined => {
  const root = asRecord(schema)
  if (root.type !== "object" || typeof root.properties !== "object") return undefined
  const defs = asRecord(root.$defs)
  const resolve = (u: unknown): Record<string, unknown> => {
    const s = asRecord(u)
    const ref = typeof s.$ref === "string" ? /^#\/\$defs\/(.+)$/.exec(s.$ref)?.[1] : undefined
    return ref === undefined ? s : { ...asRecord(defs[ref]), ...s }
  }
  const required = new Set(Array.isArray(root.required) ? root.required.filter((r): r is string => typeof r === "string") : [])
  return Object.entries(asRecord(root.properties)).map(([name, raw]) => {
    const p = resolve(raw)
    const options = Array.isArray(p.enum) && p.enum.every((e) => typeof e === "string") ? p.enum as Array<string> : []
    const type = options.length > 0
      ? "enum"
      : p.type === "string" || p.type === "number" || p.type === "integer" || p.type === "boolean"
      ? p.type
      : "json"
    return { name, type, required: required.has(name), options, description: typeof p.description === "string" ? p.description : undefined }
  })
}

/** The payload the form's fields make (`f.<name>`), or the raw JSON when given; a JSON field that does not parse is kept as text. */
export const payloadFromForm = (schema: unknown, params: URLSearchParams): unknown => {
  const raw = (params.get("payload") ?? "").trim()
  if (raw !== "") {
    try {
      return JSON.parse(raw)
    } catch {
      return raw
    }
  }
  const out: Record<string, unknown> = {}
  for (const f of fieldsOf(schema) ?? []) {
    const v = params.get(`f.${f.name}`)
    if (f.type === "boolean") {
      if (v !== null) out[f.name] = v === "on" || v === "true"
      continue
    }
    if (v === null || v === "") continue
    if (f.type === "number" || f.type === "integer") out[f.name] = /^-?\d+(\.\d+)?(e-?\d+)?$/i.test(v.trim()) ? Number(v) : v
    else if (f.type === "json") {
      try {
        out[f.name] = JSON.parse(v)
      } catch {
        out[f.name] = v
      }
    } else out[f.name] = v
  }
  return out
}

const fieldInput = (f: Field, value: string | null) => {
  const name = `f.${f.name}`
  switch (f.type) {
    case "boolean":
      return html`<input name="${name}" type="checkbox" ${value === "on" ? "checked" : ""}>`
    case "enum":
      return html`<select name="${name}">${f.required ? "" : html`<option value=""></option>`}${f.options.map((o) => html`<option ${o === value ? "selected" : ""}>${o}</option>`)}</select>`
    case "number":
    case "integer":
      return html`<input name="${name}" type="number" step="${f.type === "integer" ? "1" : "any"}" value="${value ?? ""}">`
    case "string":
      return html`<input name="${name}" value="${value ?? ""}">`
    case "json":
      return html`<input name="${name}" value="${value ?? ""}" placeholder="JSON">`
  }
}

export const newJob = (
  base: string,
  csrf: string,
  admin: boolean,
  stage: StageRegistry.Operable,
  schema: unknown,
  values: URLSearchParams = new URLSearchParams()
): Html => {
  const fields = fieldsOf(schema)
  return html`
<h1>New ${stage.name} job</h1>
${stage.live === false ? html`<p class="notice">No live process runs ${stage.name}: the job waits until one does.</p>` : ""}
<form id="new-job" method="post" action="${base}/stages/${encodeURIComponent(stage.name)}/enqueue">${csrfField(csrf)}
${fields === undefined || fields.length === 0 ? "" : html`<fieldset><legend>Payload (* required; checked by the server against the stage's schema)</legend>
${fields.map((f) => html`<p><label>${f.name}${f.required ? " *" : ""} ${fieldInput(f, values.get(`f.${f.name}`))}</label>${f.description ? html` <span class="muted">${f.description}</span>` : ""}</p>`)}</fieldset>`}
<p><label>Payload as JSON${fields === undefined || fields.length === 0 ? "" : " (instead of the fields)"}<br><textarea name="payload" rows="4" cols="60">${values.get("payload") ?? ""}</textarea></label></p>
${admin ? html`<p><label>Org <input name="org" value="${values.get("org") ?? ""}" placeholder="none"></label></p>` : ""}
<p><label>Delay (seconds) <input name="delaySeconds" type="number" min="0" step="1" value="${values.get("delaySeconds") ?? ""}"></label></p>
<p><button type="submit" id="enqueue">Enqueue</button> <a href="${base}/stages">Back</a></p>
</form>
${schema === null || schema === undefined ? "" : html`<details><summary>JSON Schema</summary><pre>${JSON.stringify(schema, null, 2)}</pre></details>`}`
}
