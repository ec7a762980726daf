/**
 * The dashboard's pages as functions from data to HTML (Html.ts escapes every value). No inline script or
 * style: behaviour comes from /assets/dashboard.js, data for it from `data-*` attributes and
 * `<script type="application/json">` blocks, which are never executed.
 */
import * as Queue from "pgfiber/internal/queue/Queue.js"
import * as Bulk from "pgfiber/internal/queue/Bulk.js"
import * as EventLog from "pgfiber/internal/queue/EventLog.js"
import type * as Schedules from "pgfiber/internal/queue/Schedules.js"
import type * as StagePool from "pgfiber/internal/runtime/StagePool.js"
import { html, jsonData, type Html, type Value } from "./Html.js"
import type * as View from "./View.js"

export interface Frame {
  readonly base: string
  readonly title: string
  readonly nav: "overview" | "jobs" | "dead" | "schedules" | "webhooks" | "events" | "orgs" | "stages" | "none"
  /** Who is signed in, for the header; absent on the sign-in page. */
  readonly who?: { readonly label: string; readonly csrf: string } | undefined
  readonly liveUrl?: string | undefined
  readonly notice?: string | undefined
  readonly error?: string | undefined
}

const when = (at: Date | string | null | undefined): string =>
  at === null || at === undefined ? "" : new Date(at).toISOString().replace("T", " ").replace(/\.\d{3}Z$/, "Z")

const qs = (params: Record<string, string | null | undefined>) => {
  const p = new URLSearchParams()
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") p.set(k, v)
  const s = p.toString()
  return s === "" ? "" : `?${s}`
}

export const layout = (frame: Frame, body: Value): Html => {
  const link = (nav: Frame["nav"], href: string, text: string) =>
    html`<a href="${frame.base}${href}" ${frame.nav === nav ? html`aria-current="page"` : ""}>${text}</a>`
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${frame.title} · pgfiber</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${frame.base}/assets/uPlot.min.css">
<link rel="stylesheet" href="${frame.base}/assets/dashboard.css">
<script src="${frame.base}/assets/uPlot.iife.min.js" defer></script>
<script src="${frame.base}/assets/dashboard.js" defer></script>
</head>
<body>
<header>
<a class="brand" href="${frame.base}/">pgfiber</a>
${frame.who === undefined ? "" : html`
${link("overview", "/", "Overview")}
${link("jobs", "/jobs", "Jobs")}
${link("dead", "/dead", "Dead letters")}
${link("schedules", "/schedules", "Schedules")}
${link("webhooks", "/webhooks", "Webhooks")}
${link("events", "/events", "Events")}
${link("stages", "/stages", "Stages")}
${link("orgs", "/orgs", "Orgs")}
<span class="who">${frame.who.label} · <span id="live-status">${frame.liveUrl ? "connecting…" : ""}</span></span>
<form method="post" action="${frame.base}/logout"><input type="hidden" name="_csrf" value="${frame.who.csrf}"><button type="submit">Sign out</button></form>`}
</header>
<main data-base="${frame.base}" ${frame.liveUrl ? html`data-live-url="${frame.liveUrl}"` : ""}>
${frame.notice ? html`<p class="notice" role="status">${frame.notice}</p>` : ""}
${frame.error ? html`<p class="error" role="alert">${frame.error}</p>` : ""}
${body}
</main>
</body>
</html>`
}

export const login = (base: string, error?: string): Html =>
  layout({ base, title: "Sign in", nav: "none", error }, html`
<form class="login" method="post" action="${base}/login">
<h1>Sign in</h1>
<p class="muted">With an API key: an operator's key (<code>pgfiber keys create --admin</code>) shows every org, an org's key that org only.</p>
<label>API key <input name="key" type="password" autocomplete="off" required placeholder="pgf_…"></label>
<p><button type="submit">Sign in</button></p>
</form>`)

const csrfField = (csrf: string) => html`<input type="hidden" name="_csrf" value="${csrf}">`

const orgPicker = (base: string, path: string, scope: View.Scope, orgs: ReadonlyArray<string>) =>
  scope.viewer.admin
    ? html`<form class="filters" method="get" action="${base}${path}">
<label>Org <select name="org"><option value="">every org</option>${orgs.map((o) => html`<option ${o === scope.org ? "selected" : ""}>${o}</option>`)}</select></label>
<button class="plain" type="submit">Show</button></form>`
    : ""

export const overview = (
  base: string,
  csrf: string,
  scope: View.Scope,
  data: View.Overview,
  pools: ReadonlyArray<StagePool.PoolHealth> | undefined,
  orgs: ReadonlyArray<string>
): Html => html`
<h1>Overview ${scope.org && scope.viewer.admin ? html`<span class="muted">· org ${scope.org}</span>` : ""}</h1>
${orgPicker(base, "/", scope, orgs)}
<h2>Stages</h2>
<table id="stages">
<thead><tr><th>stage</th><th class="num">queued (ready)</th><th class="num">delayed</th><th class="num">running</th><th class="num">dead</th><th class="num">oldest ready</th><th>state</th>${scope.viewer.admin ? html`<th></th>` : ""}</tr></thead>
<tbody id="stage-rows">
${data.stages.map((s) => html`<tr data-stage="${s.stage}"><td><a href="${base}/jobs${qs({ stage: s.stage })}">${s.stage}</a></td>
<td class="num" data-field="ready">${s.ready}</td><td class="num" data-field="delayed">${s.delayed}</td>
<td class="num" data-field="running">${s.running}</td><td class="num" data-field="dead">${s.dead}</td><td class="num" data-field="oldest">${s.oldest}</td>
<td><span class="badge paused" data-field="state">${s.state}</span></td>
${scope.viewer.admin ? html`<td class="actions"><form method="post" data-stage-control="${base}/stages/${encodeURIComponent(s.stage)}/" action="${base}/stages/${encodeURIComponent(s.stage)}/${s.state === "paused" ? "resume" : "pause"}">${csrfField(csrf)}<button class="plain" type="submit" data-action="${s.state === "paused" ? "resume" : "pause"}">${s.state === "paused" ? "Resume" : "Pause"}</button></form>
<form method="post" action="${base}/stages/${encodeURIComponent(s.stage)}/purge">${csrfField(csrf)}<button class="plain danger" type="submit" data-action="purge">Purge…</button></form></td>` : ""}</tr>`)}
</tbody>
</table>
<p class="muted">Updated <span id="live-at">${data.at}</span>.</p>
<h2>Last hour</h2>
<div class="charts"><div class="chart" id="chart-throughput"></div><div class="chart" id="chart-latency"></div></div>
<script type="application/json" id="series-data">${jsonData(data.series)}</script>
<h2>Workers with running jobs</h2>
<table><thead><tr><th>worker</th><th>stage</th><th class="num">running</th></tr></thead>
<tbody id="worker-rows">${data.workers.length === 0 ? html`<tr><td colspan="3" class="muted">no job is running</td></tr>` : data.workers.map((w) => html`<tr><td>${w.worker}</td><td>${w.stage}</td><td class="num">${w.running}</td></tr>`)}</tbody></table>
${pools === undefined ? "" : html`
<h2>Pools in this process</h2>
<table id="pools"><thead><tr><th>stage</th><th>state</th><th class="num">concurrency</th><th class="num">in flight</th><th class="num">claimed ahead</th><th>last claim</th></tr></thead>
<tbody>${pools.map((p) => html`<tr data-pool="${p.stage}"><td>${p.stage}</td><td>${p.paused ? "waiting for the database" : p.state}</td><td class="num">${p.concurrency}</td><td class="num" data-field="inFlight">${p.inFlight}</td><td class="num" data-field="claimedAhead">${p.claimedAhead}</td><td>${when(p.lastClaimAt)}</td></tr>`)}</tbody></table>
<p class="muted">A job claimed ahead is leased (counted as running above) but waits here for a free slot.</p>`}`

export const statuses: ReadonlyArray<Queue.BrowseStatus> = Queue.browseStatuses

export interface JobsQuery {
  readonly stage: string
  readonly status: string
  readonly org: string
  readonly subject: string
  readonly since: string
  readonly until: string
  readonly id: string
  /** Payload search: `key=value[,key=value]` or a JSON object the payload contains. */
  readonly payload: string
  /** A substring of the last error. */
  readonly error: string
}

const statusBadge = (status: string) => html`<span class="badge ${status}">${status}</span>`

const jobRows = (base: string, rows: ReadonlyArray<Queue.JobSummary>) =>
  rows.length === 0
    ? html`<tr><td colspan="8" class="muted">no jobs match</td></tr>`
    : rows.map((j) => html`<tr data-job="${j.id}"><td><a href="${base}/jobs/${j.id}">${j.id}</a></td><td>${j.stage}</td><td>${statusBadge(j.status)}</td>
<td>${j.orgId ?? ""}</td><td>${j.subjectId ?? ""}</td><td class="num">${j.attempts}/${j.maxAttempts}</td><td>${when(j.createdAt)}</td><td>${j.lastError ?? ""}</td></tr>`)

const jobTable = (base: string, rows: ReadonlyArray<Queue.JobSummary>) => html`
<table class="jobs"><thead><tr><th>id</th><th>stage</th><th>status</th><th>org</th><th>subject</th><th class="num">attempts</th><th>created</th><th>last error</th></tr></thead>
<tbody>${jobRows(base, rows)}</tbody></table>`

/** The list's states a bulk action's filter can name (any, or a live one); the others are finished jobs. */
const bulkStatuses: ReadonlyArray<string> = ["", ...Bulk.filterStatuses]

/**
 * "Select all matching": the list's filter, carried to a bulk action on every live job it matches (not only the
 * page shown); the next page says how many and asks before anything changes.
 */
const bulkForm = (base: string, csrf: string, query: JobsQuery) =>
  query.since !== "" || query.until !== "" || query.id !== "" || !bulkStatuses.includes(query.status)
    ? html`<p class="muted" id="bulk-unavailable">Bulk actions act on live jobs chosen by stage, status (queued, delayed, running), org, subject, payload, error: clear the id, dates and finished states to use them.</p>`
    : html`<form class="filters" id="bulk" method="post" action="${base}/jobs/bulk">${csrfField(csrf)}
${(["stage", "status", "org", "subject", "payload", "error"] as const).map((k) => html`<input type="hidden" name="${k}" value="${query[k]}">`)}
<label>All live jobs matching this filter: <select name="action" id="bulk-action">
<option value="cancel">cancel</option><option value="retry">retry now (failed, waiting)</option><option value="run-now">run now (delayed)</option><option value="priority">set priority</option></select></label>
<label>priority <input name="priority" size="6" placeholder="0..100, fast"></label>
<button type="submit" id="bulk-select-all">Select all matching…</button>
</form>`

export const jobs = (
  base: string,
  csrf: string,
  scope: View.Scope,
  query: JobsQuery,
  stages: ReadonlyArray<string>,
  rows: ReadonlyArray<Queue.JobSummary>,
  next: string | null
): Html => html`
<h1>Jobs</h1>
<form class="filters" method="get" action="${base}/jobs">
<label>Id <input name="id" value="${query.id}" size="8" inputmode="numeric"></label>
<label>Stage <select name="stage"><option value="">any</option>${stages.map((s) => html`<option ${s === query.stage ? "selected" : ""}>${s}</option>`)}</select></label>
<label>Status <select name="status"><option value="">any</option>${statuses.map((s) => html`<option ${s === query.status ? "selected" : ""}>${s}</option>`)}</select></label>
${scope.viewer.admin ? html`<label>Org <input name="org" value="${query.org}" size="10"></label>` : ""}
<label>Subject <input name="subject" value="${query.subject}" size="12"></label>
<label>Created since <input name="since" type="datetime-local" value="${query.since}"></label>
<label>until <input name="until" type="datetime-local" value="${query.until}"></label>
<label>Payload <input name="payload" value="${query.payload}" size="18" placeholder="customer=42 or {&quot;customer&quot;:42}"></label>
<label>Error <input name="error" value="${query.error}" size="14" placeholder="text in the last error"></label>
<button type="submit">Filter</button>
</form>
${jobTable(base, rows)}
${bulkForm(base, csrf, query)}
${next === null ? "" : html`<p><a id="next-page" href="${base}/jobs${qs({ ...query, before: next })}">Older jobs →</a></p>`}
<p class="muted">Live jobs, finished ones kept for their stage's retention, and dead letters.</p>`

/** A job as its page shows it: live, from the kept history, or only its dead letter left. */
export interface JobPage extends Pick<Queue.Job,
  | "id" | "stage" | "orgId" | "subjectId" | "payload" | "priority" | "attempts" | "maxAttempts" | "polls" | "lockedBy"
  | "lockedUntil" | "dedupeKey" | "lastError" | "errors" | "createdAt" | "updatedAt" | "startedAt" | "finishedAt"
  | "lastRunMs" | "output" | "progress" | "progressMessage"
> {
  /** The job's status, with `delayed` for a queued job that is not due yet. */
  readonly status: string
  /** When it runs next; null once finished. */
  readonly availableAt: Date | null
  readonly deadLetter: Queue.DeadLetter | null
  /** A waiting job's parents not finished yet. */
  readonly waitingOn?: number | null | undefined
  readonly batchId?: string | null | undefined
}

const dependencyTable = (base: string, id: string, links: ReadonlyArray<Queue.DependencyLink>, empty: string) => html`
<table id="${id}"><thead><tr><th>id</th><th>stage</th><th>status</th><th>if it fails</th></tr></thead>
<tbody>${links.length === 0 ? html`<tr><td colspan="4" class="muted">${empty}</td></tr>` : links.map((l) => html`<tr><td><a href="${base}/jobs/${l.id}">${l.id}</a></td><td>${l.stage ?? ""}</td><td>${l.status === null ? "(pruned)" : statusBadge(l.status)}</td><td>${l.onFailure}</td></tr>`)}</tbody></table>`

export const job = (
  base: string,
  csrf: string,
  j: JobPage,
  related: ReadonlyArray<Queue.JobSummary>,
  dependencies: Queue.Dependencies | null = null
): Html => {
  const field = (name: string, value: Value) => html`<span data-job-field="${name}">${value}</span>`
  const timeline: Array<{ at: string; what: string }> = [
    { at: when(j.createdAt), what: "enqueued" },
    ...(j.startedAt ? [{ at: when(j.startedAt), what: "first run started" }] : []),
    ...j.errors.map((e) => ({ at: when(e.at), what: `attempt ${e.attempt} failed${e.worker ? ` on ${e.worker}` : ""}: ${e.tag}: ${e.message}` })),
    ...(j.status === "running" && j.lockedBy ? [{ at: when(j.updatedAt), what: `running on ${j.lockedBy}` }] : []),
    ...(j.finishedAt && j.status !== "dead" ? [{ at: when(j.finishedAt), what: `${j.status}${j.lastRunMs !== null ? ` (last run ${Math.round(j.lastRunMs)} ms)` : ""}` }] : []),
    ...(j.status === "delayed" && j.availableAt ? [{ at: when(j.availableAt), what: "runs again (scheduled)" }] : []),
    ...(j.deadLetter ? [{ at: when(j.deadLetter.deadAt), what: `dead-lettered: ${j.deadLetter.reason}` }] : []),
    ...(j.deadLetter?.resolvedAt ? [{ at: when(j.deadLetter.resolvedAt), what: `${j.deadLetter.resolutionStatus}${j.deadLetter.retriedJobId ? ` as job ${j.deadLetter.retriedJobId}` : ""}${j.deadLetter.resolutionNotes ? `: ${j.deadLetter.resolutionNotes}` : ""}` }] : [])
  ].sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0))
  return html`
<h1>Job ${j.id} <span class="muted">· ${j.stage}</span></h1>
<dl class="facts">
<dt>status</dt><dd>${field("status", j.status)}</dd>
<dt>org</dt><dd>${j.orgId ?? "(none)"}</dd>
<dt>subject</dt><dd>${j.subjectId === null ? "(none)" : html`<a href="${base}/jobs?subject=${encodeURIComponent(j.subjectId)}">${j.subjectId}</a>`}</dd>
<dt>attempts</dt><dd>${field("attempts", j.attempts)} of ${field("maxAttempts", j.maxAttempts)}${j.polls > 0 ? html` · polls ${field("polls", j.polls)}` : ""}</dd>
<dt>priority</dt><dd>${j.priority}</dd>
<dt>runs at</dt><dd>${field("availableAt", j.availableAt ? j.availableAt.toISOString() : "")}</dd>
<dt>worker</dt><dd>${field("lockedBy", j.lockedBy ?? "")}</dd>
<dt>lease until</dt><dd>${field("lockedUntil", j.lockedUntil ? j.lockedUntil.toISOString() : "")}</dd>
<dt>dedupe key</dt><dd>${j.dedupeKey ?? ""}</dd>
<dt>waits on</dt><dd>${field("waitingOn", j.waitingOn == null ? "" : `${j.waitingOn} parent${j.waitingOn === 1 ? "" : "s"}`)}</dd>
<dt>batch</dt><dd>${field("batchId", j.batchId ?? "")}</dd>
<dt>progress</dt><dd>${field("progress", j.progress === null ? "" : j.progress)} ${field("progressMessage", j.progressMessage ?? "")}</dd>
<dt>last error</dt><dd class="bad">${field("lastError", j.lastError ?? "")}</dd>
<dt>created</dt><dd>${when(j.createdAt)}</dd>
<dt>started</dt><dd>${field("startedAt", j.startedAt ? j.startedAt.toISOString() : "")}</dd>
<dt>finished</dt><dd>${j.finishedAt ? j.finishedAt.toISOString() : ""}${j.lastRunMs !== null ? ` · last run ${Math.round(j.lastRunMs)} ms` : ""}</dd>
<dt>updated</dt><dd>${field("updatedAt", j.updatedAt.toISOString())}</dd>
</dl>
<div class="actions">
${j.status === "waiting" || j.status === "queued" || j.status === "delayed" || j.status === "running" ? html`
<form method="post" action="${base}/jobs/${j.id}/cancel">${csrfField(csrf)}<button class="danger" type="submit" data-action="cancel">Cancel job…</button></form>` : ""}
${j.status === "delayed" ? html`<form method="post" action="${base}/jobs/${j.id}/run-now">${csrfField(csrf)}<button type="submit" data-action="run-now">Run now</button></form>` : ""}
${j.deadLetter && j.deadLetter.resolutionStatus === null ? deadLetterActions(base, csrf, j.deadLetter.id) : ""}
</div>
<h2>Payload</h2>
<pre id="payload">${JSON.stringify(j.payload, null, 2)}</pre>
${j.status === "completed" ? html`<h2>Output</h2><pre id="output">${j.output === null || j.output === undefined ? "(none)" : JSON.stringify(j.output, null, 2)}</pre>` : ""}
<h2>Attempts and errors</h2>
<table><thead><tr><th class="num">attempt</th><th>at</th><th>error</th><th>message</th></tr></thead>
<tbody>${j.errors.length === 0 ? html`<tr><td colspan="4" class="muted">no failed attempt</td></tr>` : j.errors.map((e) => html`<tr><td class="num">${e.attempt}</td><td>${when(e.at)}</td><td>${e.tag}</td><td>${e.message}</td></tr>`)}</tbody></table>
<h2>Timeline</h2>
<table><tbody>${timeline.map((t) => html`<tr><td>${t.at}</td><td>${t.what}</td></tr>`)}</tbody></table>
${dependencies === null || (dependencies.parents.length === 0 && dependencies.children.length === 0) ? "" : html`
<h2>Waits on (parents)</h2>
${dependencyTable(base, "parents", dependencies.parents, "none: it waits for nothing")}
<h2>Waited on by (children)</h2>
${dependencyTable(base, "children", dependencies.children, "nothing waits for it")}`}
<h2>Related jobs (same subject)</h2>
${j.subjectId === null ? html`<p class="muted">This job has no subject.</p>` : jobTable(base, related.filter((r) => r.id !== j.id))}`
}

const deadLetterActions = (base: string, csrf: string, id: string) => html`
<form method="post" action="${base}/dead/${id}/retry">${csrfField(csrf)}<button type="submit" data-action="retry">Retry</button></form>
<form method="post" action="${base}/dead/${id}/resolve">${csrfField(csrf)}<input name="notes" placeholder="notes" size="18"> <button class="plain" type="submit" data-action="resolve">Resolve</button></form>`

export const deadLetters = (
  base: string,
  csrf: string,
  scope: View.Scope,
  filter: { readonly stage: string; readonly org: string; readonly all: boolean },
  stages: ReadonlyArray<string>,
  list: ReadonlyArray<Queue.DeadLetter>,
  next: string | null
): Html => html`
<h1>Dead letters</h1>
<form class="filters" method="get" action="${base}/dead">
<label>Stage <select name="stage"><option value="">any</option>${stages.map((s) => html`<option ${s === filter.stage ? "selected" : ""}>${s}</option>`)}</select></label>
${scope.viewer.admin ? html`<label>Org <input name="org" value="${filter.org}" size="10"></label>` : ""}
<label>Show <select name="all"><option value="">open only</option><option value="1" ${filter.all ? "selected" : ""}>resolved too</option></select></label>
<button class="plain" type="submit">Filter</button>
</form>
<table id="dead-letters"><thead><tr><th>id</th><th>job</th><th>stage</th><th>org</th><th>reason</th><th>dead at</th><th>resolution</th><th></th></tr></thead>
<tbody>${list.length === 0 ? html`<tr><td colspan="8" class="muted">no dead letters</td></tr>` : list.map((d) => html`<tr data-dead-letter="${d.id}">
<td>${d.id}</td><td><a href="${base}/jobs/${d.jobId}">${d.jobId}</a></td><td>${d.stage}</td><td>${d.orgId ?? ""}</td><td>${d.reason}</td><td>${when(d.deadAt)}</td>
<td>${d.resolutionStatus ?? ""}${d.retriedJobId ? html` → <a href="${base}/jobs/${d.retriedJobId}">${d.retriedJobId}</a>` : ""}${d.resolutionNotes ? html` (${d.resolutionNotes})` : ""}</td>
<td class="actions">${d.resolutionStatus === null ? deadLetterActions(base, csrf, d.id) : ""}</td></tr>`)}</tbody></table>
${next === null ? "" : html`<p><a href="${base}/dead${qs({ stage: filter.stage, org: filter.org, all: filter.all ? "1" : "", after: next })}">More →</a></p>`}
<h2>In bulk</h2>
<form class="filters" method="post" action="${base}/dead/bulk">${csrfField(csrf)}
<input type="hidden" name="stage" value="${filter.stage}"><input type="hidden" name="org" value="${filter.org}">
<label>Every open dead letter ${filter.stage ? html`of ${filter.stage}` : "of every stage"}${filter.org ? html` in org ${filter.org}` : ""}
<select name="action"><option value="retry">retry</option><option value="resolve">resolve</option></select></label>
<label>Notes (resolve) <input name="notes" size="18"></label>
<button class="plain" type="submit">Review…</button>
</form>
<form class="filters" method="post" action="${base}/dead/purge">${csrfField(csrf)}
<label>Purge dead letters older than (hours) <input name="hours" type="number" min="0" step="any" value="24" size="5"></label>
<label>Include open ones <select name="unresolved"><option value="">no, resolved and retried only</option><option value="1">yes</option></select></label>
<button class="danger" type="submit">Review purge…</button>
</form>`

/**
 * The confirmation step of a destructive or bulk action: the action's form again, with `confirm=yes`, behind
 * a question that says what will happen. Nothing is done until it is submitted; `back` leaves it undone.
 */
export const confirm = (
  base: string,
  csrf: string,
  action: string,
  question: string,
  fields: Record<string, string>,
  back = "/dead"
): Html => html`
<h1>Confirm</h1>
<p id="question">${question}</p>
<form method="post" action="${base}${action}">${csrfField(csrf)}
${Object.entries(fields).map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`)}
<input type="hidden" name="confirm" value="yes">
<div class="actions"><button class="danger" type="submit" id="confirm">Yes, do it</button> <a id="back" href="${base}${back}">No, go back</a></div>
</form>`

const scheduleActions = (base: string, csrf: string, s: Schedules.Schedule) => {
  // "-" for the system's (no org): no org id can be "-"
  const target = (verb: string) => `${base}/schedules/${encodeURIComponent(s.orgId ?? "-")}/${encodeURIComponent(s.name)}/${verb}`
  return html`<form method="post" action="${target(s.enabled ? "disable" : "enable")}">${csrfField(csrf)}<button class="plain" type="submit" data-action="${s.enabled ? "disable" : "enable"}">${s.enabled ? "Disable" : "Enable"}</button></form>
<form method="post" action="${target("run-now")}">${csrfField(csrf)}<button class="plain" type="submit" data-action="run-now">Run now</button></form>`
}

export const schedules = (base: string, csrf: string, list: ReadonlyArray<Schedules.Schedule>): Html => html`
<h1>Schedules</h1>
<table id="schedules"><thead><tr><th>name</th><th>org</th><th>stage</th><th>when</th><th>enabled</th><th>next tick</th><th>last tick</th><th>source</th><th></th></tr></thead>
<tbody>${list.length === 0 ? html`<tr><td colspan="9" class="muted">no schedules</td></tr>` : list.map((s) => html`<tr data-schedule="${s.name}"><td>${s.name}</td><td>${s.orgId ?? "(system)"}</td>
<td><a href="${base}/jobs?stage=${encodeURIComponent(s.stage)}">${s.stage}</a></td><td>${s.cron ? html`<code>${s.cron}</code> ${s.timeZone}` : `every ${Math.round((s.everyMs ?? 0) / 1000)} s`}</td>
<td>${s.enabled ? "yes" : "no"}</td><td>${when(s.nextTickAt)}</td><td>${when(s.lastTickAt)}</td><td>${s.source}</td>
<td class="actions">${scheduleActions(base, csrf, s)}</td></tr>`)}</tbody></table>`

export const orgs = (base: string, rows: ReadonlyArray<View.OrgRow>): Html => html`
<h1>Orgs</h1>
<table id="orgs"><thead><tr><th>org</th><th class="num">queued</th><th class="num">running</th><th class="num">dead</th><th class="num">completed (last hour)</th><th class="num">failed (last hour)</th></tr></thead>
<tbody>${rows.length === 0 ? html`<tr><td colspan="6" class="muted">no jobs</td></tr>` : rows.map((o) => html`<tr><td>${o.org === "(no org)" ? o.org : html`<a href="${base}/?org=${encodeURIComponent(o.org)}">${o.org}</a>`}</td>
<td class="num">${o.queued}</td><td class="num">${o.running}</td><td class="num">${o.dead}</td><td class="num">${o.completedLastHour}</td><td class="num">${o.failedLastHour}</td></tr>`)}</tbody></table>`

/** The event log's newest events, shown oldest first (newest last), as `GET /events` would have sent them. */
export const events = (
  base: string,
  scope: View.Scope,
  filter: { readonly stage: string; readonly kind: string },
  stages: ReadonlyArray<string>,
  list: ReadonlyArray<EventLog.LoggedEvent>,
  limit: number
): Html => html`
<h1>Events${scope.viewer.admin && scope.org ? html` <span class="muted">· org ${scope.org}</span>` : ""}</h1>
<form class="filters" method="get" action="${base}/events">
<label>Stage <input name="stage" value="${filter.stage}" size="16" list="event-stages" placeholder="any"></label>
<datalist id="event-stages">${stages.map((s) => html`<option value="${s}">`)}</datalist>
<label>Kind <select name="kind"><option value="">any</option>${EventLog.kinds.map((k) => html`<option ${k === filter.kind ? "selected" : ""}>${k}</option>`)}</select></label>
${scope.viewer.admin ? html`<label>Org <input name="org" value="${scope.org ?? ""}" size="10" placeholder="every org"></label>` : ""}
<button class="plain" type="submit">Filter</button>
</form>
<p class="muted">The ${limit} newest events of the event log that match, newest last (kept for <code>PGFIBER_EVENTS_RETAIN</code>). Reload for
newer ones; to follow them as they happen: <code>GET /events</code> on the API (server-sent events, resumable) or <code>pgfiber events --follow</code>.</p>
<table id="events"><thead><tr><th>id</th><th>at</th><th>kind</th><th>stage</th>${scope.viewer.admin ? html`<th>org</th>` : ""}<th>job</th><th>subject</th><th class="num">attempt</th><th>data</th></tr></thead>
<tbody>${list.length === 0 ? html`<tr><td colspan="${scope.viewer.admin ? 9 : 8}" class="muted">no events match</td></tr>` : list.map((e) => html`<tr data-event="${e.id}">
<td>${e.id}</td><td>${when(e.at)}</td><td><span class="badge ${e.kind}">${e.kind}</span></td><td>${e.stage}</td>${scope.viewer.admin ? html`<td>${e.orgId ?? ""}</td>` : ""}
<td><a href="${base}/jobs/${e.jobId}">${e.jobId}</a></td><td>${e.subjectId ?? ""}</td><td class="num">${e.attempt}</td><td><code>${e.data === null ? "" : JSON.stringify(e.data)}</code></td></tr>`)}</tbody></table>`

export const notFound = (what: string): Html => html`<h1>Not found</h1><p>${what}</p>`
