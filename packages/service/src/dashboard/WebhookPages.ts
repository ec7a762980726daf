/**
 * The dashboard's webhooks page: the org's subscriptions (never their secrets) with how their recent deliveries
 * went, a form to add one, and the page that shows a new one's signing secret, the only time it is shown (as the
 * HTTP API's 201 does). Pure functions from data to HTML, as Pages.ts; the data comes from the same
 * `Subscriptions` service the API and the CLI call, and the deliveries from `Reads.browse` (they are jobs).
 */
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import type * as Queue from "pgfiber/internal/queue/Queue.js"
import type * as Subscriptions from "../stages/webhooks/Subscriptions.js"
import { html, type Html } from "./Html.js"

const csrfField = (csrf: string) => html`<input type="hidden" name="_csrf" value="${csrf}">`

const when = (at: Date): string => at.toISOString().replace("T", " ").replace(/\.\d{3}Z$/, "Z")

/** How one delivery went, from its job's status: the one place a delivery's state is named. */
export type DeliveryState = "delivered" | "pending" | "retrying" | "dead" | "cancelled"
export const deliveryStates: ReadonlyArray<DeliveryState> = ["delivered", "pending", "retrying", "dead", "cancelled"]

export const deliveryState = (j: Queue.JobSummary): DeliveryState =>
  j.status === "completed"
    ? "delivered"
    : j.status === "dead"
    ? "dead"
    : j.status === "cancelled"
    ? "cancelled"
    // queued, delayed, running or waiting: a failed attempt behind it makes it a retry
    : j.attempts > 0
    ? "retrying"
    : "pending"

export interface WebhookRow {
  readonly webhook: Subscriptions.WebhookView
  /** Its newest deliveries, newest first (at most `recentLimit`); undefined when not looked up. */
  readonly recent: ReadonlyArray<Queue.JobSummary> | undefined
}

/** What the add form held, shown again with the error when it was refused. */
export interface AddForm {
  readonly org: string
  readonly url: string
  readonly kinds: ReadonlyArray<string>
  readonly stages: string
}

export const emptyForm = (org: string): AddForm => ({ org, url: "", kinds: [], stages: "" })

/** The jobs page's filter for one webhook's deliveries (stage and payload). */
export const deliveriesHref = (base: string, stage: string, webhookId: string) =>
  `${base}/jobs?${new URLSearchParams({ stage, payload: JSON.stringify({ webhookId }) }).toString()}`

const deliveriesCell = (base: string, stage: string, row: WebhookRow, recentLimit: number) => {
  if (row.recent === undefined) {
    return html`<a href="${deliveriesHref(base, stage, row.webhook.id)}">deliveries →</a>`
  }
  const counts = new Map<DeliveryState, number>(deliveryStates.map((s) => [s, 0]))
  for (const j of row.recent) counts.set(deliveryState(j), counts.get(deliveryState(j))! + 1)
  const newest = row.recent[0]
  return html`${row.recent.length === 0 ? html`<span class="muted">none yet</span>` : html`
${deliveryStates.filter((s) => s === "delivered" || s === "retrying" || s === "dead" || counts.get(s)! > 0).map((s, i) =>
    html`${i > 0 ? " · " : ""}<span data-field="${s}">${counts.get(s)!}</span> ${s}`)}
<span class="muted">(of the last ${row.recent.length === recentLimit ? recentLimit : row.recent.length})</span><br>
newest: <a href="${base}/jobs/${newest!.id}">${newest!.id}</a> <span class="badge ${newest!.status}">${deliveryState(newest!)}</span> ${when(newest!.updatedAt)}${
    newest!.lastError ? html` <span class="bad">${newest!.lastError}</span>` : ""}`}
<br><a href="${deliveriesHref(base, stage, row.webhook.id)}" data-action="deliveries">all deliveries →</a>`
}

export const webhooks = (
  base: string,
  csrf: string,
  options: {
    /** An operator's view: every org's webhooks (or the one org picked), an org column, an org field. */
    readonly admin: boolean
    /** An operator's choice of org for the list; null: every org. */
    readonly org: string | null
    readonly deliveryStage: string
    readonly recentLimit: number
  },
  rows: ReadonlyArray<WebhookRow>,
  form: AddForm
): Html => {
  const chosen = new Set(form.kinds.length === 0 ? ["completed", "dead", "cancelled"] : form.kinds)
  return html`
<h1>Webhooks${options.admin && options.org ? html` <span class="muted">· org ${options.org}</span>` : ""}</h1>
<p class="muted">Each job event a webhook wants is POSTed to its URL, signed per Standard Webhooks with its secret; every delivery is a
job of the internal stage <code>${options.deliveryStage}</code>, retried on failure and dead-lettered like any job. The secret is
shown once, when the webhook is added. For the events themselves as they happen: <code>GET /events</code> on the API (server-sent
events) or <code>pgfiber events --follow</code>.</p>
${options.admin ? html`<form class="filters" method="get" action="${base}/webhooks">
<label>Org <input name="org" value="${options.org ?? ""}" size="12" placeholder="every org"></label>
<button class="plain" type="submit">Show</button></form>` : ""}
<table id="webhooks"><thead><tr><th>id</th>${options.admin ? html`<th>org</th>` : ""}<th>url</th><th>kinds</th><th>stages</th><th>created</th><th>recent deliveries</th><th></th></tr></thead>
<tbody>${rows.length === 0
    ? html`<tr><td colspan="${options.admin ? 8 : 7}" class="muted">no webhooks</td></tr>`
    : rows.map((r) => html`<tr data-webhook="${r.webhook.id}"><td>${r.webhook.id}</td>${options.admin ? html`<td>${r.webhook.orgId}</td>` : ""}
<td data-field="url">${r.webhook.url}</td><td data-field="kinds">${r.webhook.kinds.join(", ")}</td><td data-field="stages">${r.webhook.stages?.join(", ") ?? html`<span class="muted">every stage</span>`}</td>
<td>${when(r.webhook.createdAt)}</td><td data-field="deliveries">${deliveriesCell(base, options.deliveryStage, r, options.recentLimit)}</td>
<td class="actions"><form method="post" action="${base}/webhooks/${r.webhook.id}/remove">${csrfField(csrf)}<button class="plain danger" type="submit" data-action="remove">Remove…</button></form></td></tr>`)}</tbody></table>
<h2>Add a webhook</h2>
<form id="add-webhook" method="post" action="${base}/webhooks">${csrfField(csrf)}
${options.admin ? html`<p><label>Org <input name="org" value="${form.org}" size="16" required placeholder="the org whose events it receives"></label></p>` : ""}
<p><label>URL <input name="url" type="url" value="${form.url}" size="48" required placeholder="https://example.com/pgfiber"></label></p>
<fieldset><legend>Event kinds</legend>
${EventLog.kinds.map((k) => html`<label><input type="checkbox" name="kinds" value="${k}" ${chosen.has(k) ? "checked" : ""}> ${k}</label> `)}
</fieldset>
<p><label>Stages <input name="stages" value="${form.stages}" size="32" placeholder="every stage, or: resize, mail"></label></p>
<p><button type="submit" data-action="add-webhook">Add webhook</button></p>
<p class="muted">A URL on a loopback, private or link-local address is refused unless the operator allows them (<code>PGFIBER_WEBHOOK_ALLOW_PRIVATE</code>).</p>
</form>`
}

/** After adding: the secret, this once; the page is `no-store` like every dashboard page. */
export const created = (base: string, webhook: Subscriptions.WebhookView, secret: string): Html => html`
<h1>Webhook ${webhook.id} added</h1>
<dl class="facts">
<dt>org</dt><dd>${webhook.orgId}</dd>
<dt>url</dt><dd>${webhook.url}</dd>
<dt>kinds</dt><dd>${webhook.kinds.join(", ")}</dd>
<dt>stages</dt><dd>${webhook.stages?.join(", ") ?? "every stage"}</dd>
</dl>
<p><strong>Its signing secret, shown this once: store it now.</strong> It is never listed again; to replace it, remove the webhook and add it anew.</p>
<pre id="webhook-secret">${secret}</pre>
<p><a id="back" href="${base}/webhooks">Back to the webhooks</a></p>`
