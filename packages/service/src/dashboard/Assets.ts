/**
 * The dashboard's static files. Its own script and stylesheet are here as text (so they travel inside the
 * bundle and the package alike); uPlot's come from its npm package, resolved at run time from wherever this
 * module is installed. Nothing is fetched from another origin: the dashboard works offline.
 */
import * as Fs from "node:fs"
import { createRequire } from "node:module"

/** The client: live updates over server-sent events, uPlot charts. Only textContent and DOM nodes, never HTML. */
export const script = String.raw`"use strict";
(function () {
  var main = document.querySelector("main");
  if (!main) return;
  var charts = {};
  var status = document.getElementById("live-status");
  function setStatus(text) { if (status) status.textContent = text; }
  function el(tag, text, attrs) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (attrs) for (var k in attrs) node.setAttribute(k, attrs[k]);
    return node;
  }
  function readJson(id) {
    var node = document.getElementById(id);
    if (!node) return null;
    try { return JSON.parse(node.textContent || "null"); } catch (e) { return null; }
  }
  var palette = ["#2563eb", "#16a34a", "#d97706", "#9333ea", "#0891b2", "#db2777", "#65a30d", "#dc2626", "#4b5563"];
  function chartOptions(title, names, unit, width) {
    var series = [{}];
    names.forEach(function (name, i) { series.push({ label: name, stroke: palette[i % palette.length], width: 1.5, spanGaps: true, points: { show: true, size: 4 } }); });
    return { title: title, width: width, height: 220, series: series, axes: [{}, { label: unit }], legend: { live: false } };
  }
  function drawChart(id, title, unit, data) {
    var box = document.getElementById(id);
    if (!box || typeof uPlot === "undefined" || !data) return;
    var width = Math.max(300, box.clientWidth || 600);
    var key = id + ":" + data.names.join(",");
    var rows = [data.t].concat(data.values);
    if (charts[id] && charts[id].key === key) { charts[id].plot.setData(rows); return; }
    if (charts[id]) { charts[id].plot.destroy(); }
    box.textContent = "";
    charts[id] = { key: key, plot: new uPlot(chartOptions(title, data.names, unit, width), rows, box) };
  }
  function drawCharts(series) {
    if (!series) return;
    drawChart("chart-throughput", "Completed and failed per minute", "jobs/min", series.throughput);
    drawChart("chart-latency", "Average run time per minute", "ms", series.latency);
  }
  function updateStages(stages) {
    var body = document.getElementById("stage-rows");
    if (!body) return;
    stages.forEach(function (s) {
      var row = body.querySelector('tr[data-stage="' + CSS.escape(s.stage) + '"]');
      if (!row) {
        row = el("tr", null, { "data-stage": s.stage });
        var name = el("td");
        name.appendChild(el("a", s.stage, { href: main.getAttribute("data-base") + "/jobs?stage=" + encodeURIComponent(s.stage) }));
        row.appendChild(name);
        ["ready", "delayed", "running", "dead", "oldest"].forEach(function (f) { row.appendChild(el("td", "", { "data-field": f, "class": "num" })); });
        var state = el("td");
        state.appendChild(el("span", "", { "data-field": "state", "class": "badge paused" }));
        row.appendChild(state);
        body.appendChild(row);
      }
      ["ready", "delayed", "running", "dead", "oldest", "state"].forEach(function (f) {
        var cell = row.querySelector('[data-field="' + f + '"]');
        if (cell) cell.textContent = String(s[f]);
      });
      // an operator's pause / resume button follows the stage's state (another operator may have changed it)
      var control = row.querySelector("form[data-stage-control]");
      if (control) {
        var verb = s.state === "paused" ? "resume" : "pause";
        control.setAttribute("action", control.getAttribute("data-stage-control") + verb);
        var button = control.querySelector("button");
        if (button) { button.setAttribute("data-action", verb); button.textContent = verb === "resume" ? "Resume" : "Pause"; }
      }
    });
  }
  function updateWorkers(workers) {
    var body = document.getElementById("worker-rows");
    if (!body) return;
    body.textContent = "";
    workers.forEach(function (w) {
      var row = el("tr");
      row.appendChild(el("td", w.worker));
      row.appendChild(el("td", w.stage));
      row.appendChild(el("td", w.running, { "class": "num" }));
      body.appendChild(row);
    });
    if (workers.length === 0) { var r = el("tr"); r.appendChild(el("td", "no job is running", { colspan: "3", "class": "muted" })); body.appendChild(r); }
  }
  function updateJob(job) {
    if (job.gone) { if (!main.hasAttribute("data-reloaded")) { main.setAttribute("data-reloaded", ""); location.reload(); } return; }
    Object.keys(job).forEach(function (k) {
      var cell = document.querySelector('[data-job-field="' + k + '"]');
      if (cell) cell.textContent = job[k] === null ? "" : String(job[k]);
    });
  }
  drawCharts(readJson("series-data"));
  var url = main.getAttribute("data-live-url");
  if (!url || typeof EventSource === "undefined") return;
  var source = new EventSource(url);
  source.addEventListener("open", function () { setStatus("live"); });
  source.addEventListener("error", function () { setStatus("reconnecting…"); });
  source.addEventListener("overview", function (e) {
    var data = JSON.parse(e.data);
    updateStages(data.stages);
    updateWorkers(data.workers);
    drawCharts(data.series);
    var at = document.getElementById("live-at");
    if (at) at.textContent = data.at;
    setStatus("live");
  });
  source.addEventListener("job", function (e) { updateJob(JSON.parse(e.data)); setStatus("live"); });
})();
`

export const stylesheet = `
:root { color-scheme: light; --fg: #111827; --muted: #6b7280; --line: #e5e7eb; --accent: #2563eb; --bad: #b91c1c; --bg: #f9fafb; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1.25rem; align-items: center; padding: .6rem 1.25rem; background: #111827; color: #fff; }
header a { color: #d1d5db; text-decoration: none; }
header a:hover, header a[aria-current] { color: #fff; }
header .brand { font-weight: 700; color: #fff; }
header .who { margin-left: auto; color: #9ca3af; }
header form { display: inline; }
header button { background: none; border: 1px solid #4b5563; color: #d1d5db; border-radius: 4px; padding: .15rem .5rem; cursor: pointer; }
main { padding: 1rem 1.25rem 3rem; max-width: 1200px; }
h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); background: #f3f4f6; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: var(--muted); }
.bad { color: var(--bad); }
pre { background: #fff; border: 1px solid var(--line); padding: .6rem; overflow: auto; max-height: 24rem; white-space: pre-wrap; word-break: break-word; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 1rem; }
.chart { background: #fff; border: 1px solid var(--line); padding: .5rem; min-height: 260px; }
form.filters { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin-bottom: 1rem; }
label { display: flex; flex-direction: column; font-size: .8rem; color: var(--muted); gap: .15rem; }
input, select, textarea { font: inherit; padding: .25rem .4rem; border: 1px solid #d1d5db; border-radius: 4px; background: #fff; }
button { font: inherit; padding: .3rem .8rem; border: 1px solid var(--accent); background: var(--accent); color: #fff; border-radius: 4px; cursor: pointer; }
button.danger { background: var(--bad); border-color: var(--bad); }
button.plain { background: #fff; color: var(--fg); border-color: #d1d5db; }
button.plain.danger { color: var(--bad); border-color: var(--bad); }
.actions { display: flex; gap: .5rem; flex-wrap: wrap; align-items: end; margin: .5rem 0 1rem; }
.notice { padding: .5rem .75rem; border: 1px solid #bfdbfe; background: #eff6ff; margin-bottom: 1rem; }
.error { padding: .5rem .75rem; border: 1px solid #fecaca; background: #fef2f2; margin-bottom: 1rem; }
.badge { display: inline-block; padding: 0 .4rem; border-radius: 999px; font-size: .8rem; background: #e5e7eb; }
.badge.running { background: #dbeafe; } .badge.dead { background: #fee2e2; } .badge.delayed { background: #fef3c7; }
.badge.completed { background: #dcfce7; } .badge.paused { background: #fde68a; }
.badge:empty { display: none; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; background: #fff; border: 1px solid var(--line); padding: .75rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.login { max-width: 28rem; margin: 4rem auto; background: #fff; border: 1px solid var(--line); padding: 1.5rem; }
.login input { width: 100%; }
`

const require = createRequire(import.meta.url)

export interface Asset {
  readonly contentType: string
  readonly body: string | Uint8Array
}

/** uPlot's files, read once from its installed package. */
const fromPackage = (specifier: string, contentType: string): (() => Asset) => {
  let cached: Asset | undefined
  return () => (cached ??= { contentType, body: Fs.readFileSync(require.resolve(specifier)) })
}

export const assets: Readonly<Record<string, () => Asset>> = {
  "dashboard.js": () => ({ contentType: "text/javascript; charset=utf-8", body: script }),
  "dashboard.css": () => ({ contentType: "text/css; charset=utf-8", body: stylesheet }),
  "uPlot.iife.min.js": fromPackage("uplot/dist/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
  "uPlot.min.css": fromPackage("uplot/dist/uPlot.min.css", "text/css; charset=utf-8")
}
