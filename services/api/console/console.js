// The cep console: plain JavaScript against the API of the same origin (docs/api.md,
// docs/console.md). Charts are uPlot's (vendor/, bundled: nothing from the network); the
// pipeline's graph and a query's explain drawing are SVG drawn by the API (Graphviz).
"use strict";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 2000;     // the queries, the pipeline and the history are read so often
const KEEP_EVENTS = 200;     // composite events kept for the table (newest first)
const HISTORY_S = 600;       // what the charts show
const events = [];           // composite events, newest first: {query, composite}
let tail = null;             // one EventSource: the chosen query's events, or every query's
let tailOf = null;           // the query it follows ("": every live query)
const following = new Set(); // queries whose events it brings (once its `ready` came)
const history = new Map();   // query name -> {t: [], composites_per_s: [], ...}
let liveQueries = [];        // the last /api/queries answer
let historySince = 0;
let paused = false, missed = 0;
let detail = null;           // the query shown in the detail panel, and its charts
const timing = {renders: 0, longestRenderMs: 0, received: 0};  // the page's own work (tests read it)
window.cepConsole = timing;

$("token").value = localStorage.getItem("cepToken") || "";
$("token").addEventListener("change", () => localStorage.setItem("cepToken", $("token").value));

async function api(method, path, body) {
  const headers = {"Content-Type": "application/json"};
  const token = $("token").value.trim();
  if (token) headers.Authorization = "Bearer " + token;
  const reply = await fetch(path, {method, headers,
    body: body === undefined ? undefined : JSON.stringify(body)});
  return {status: reply.status, body: await reply.json()};
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
  return td;
}

function number(value, digits = 1) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en", {maximumFractionDigits: digits});
}

function timed(name, work) {  // the page's work, for the responsiveness test
  const started = performance.now();
  try { return work(); } finally {
    const took = performance.now() - started;
    timing.renders += 1;
    timing.longestRenderMs = Math.max(timing.longestRenderMs, took);
    timing[name] = took;
  }
}

// An SVG drawn by the API (dot escapes the labels) as a node of this page, without
// anything that runs.
function svgNode(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  if (svg.nodeName !== "svg") return document.createTextNode("(no drawing)");
  for (const bad of svg.querySelectorAll("script, foreignObject")) bad.remove();
  for (const el of svg.querySelectorAll("*")) {
    for (const attr of [...el.attributes]) {
      if (/^on/i.test(attr.name) || /javascript:/i.test(attr.value)) el.removeAttribute(attr.name);
    }
  }
  return document.importNode(svg, true);
}

// ---------------------------------------------------------------- the pipeline

const pipelineDrawings = new Map();  // stream -> the SVG text drawn now

function eventTime(value, unit) {
  if (value === null || value === undefined) return "–";
  const ms = {ms: 1, s: 1000, us: 1e-3, ns: 1e-6}[unit];
  if (ms === undefined) return number(value, 0);
  return new Date(value * ms).toISOString().replace("T", " ").replace("Z", "");
}

// A process's last checkpoint: when (UTC), how long ago, its generation, how long it took
// (a chained process's is one cut of every core)
function checkpoint(proc) {
  if (proc.checkpoint_s_ago === null || proc.checkpoint_s_ago === undefined) return "–";
  const at = proc.checkpoint_time ?
    new Date(proc.checkpoint_time * 1000).toISOString().slice(11, 19) + " UTC, " : "";
  const took = proc.checkpoint_ms === null || proc.checkpoint_ms === undefined ? "" :
    `, took ${number(proc.checkpoint_ms)} ms`;
  return `${at}${number(proc.checkpoint_s_ago)} s ago (${(proc.stages || []).length ?
    "one cut, " : ""}generation ${proc.checkpoint_generation}${took})`;
}

async function refreshPipeline() {
  let reply;
  try { reply = await api("GET", "/api/pipeline"); } catch (e) { return; }
  const pipelines = reply.body.pipelines || [];
  timed("pipeline", () => drawPipelines(pipelines));
}

function drawPipelines(pipelines) {
  const box = $("pipelines");
  if (!pipelines.length) return;
  const shown = new Set();
  for (const p of pipelines) {
    shown.add(p.stream);
    let view = box.querySelector(`.pipeline[data-stream="${CSS.escape(p.stream)}"]`);
    if (!view) {
      box.querySelector("p.muted")?.remove();
      view = document.createElement("div");
      view.className = "pipeline";
      view.dataset.stream = p.stream;
      view.innerHTML = `<h3></h3><div class="graph"></div><div class="tables">
        <table class="processes"><thead><tr><th>process</th><th>role</th><th>rate</th>
        <th>lag</th><th>last checkpoint</th></tr></thead><tbody></tbody></table>
        <table class="partitions"><thead><tr><th>keyed partition</th><th>worker</th>
        <th>lag</th><th>seq</th><th>event time</th><th>last pulse</th></tr></thead>
        <tbody></tbody></table><table class="stages" hidden><thead><tr><th>stage</th>
        <th>of process</th><th>in</th><th>out</th></tr></thead><tbody></tbody></table></div>
        <ul class="withheld"></ul>`;
      box.append(view);
    }
    const up = p.processes.some((proc) => !["broker", "api"].includes(proc.role));
    view.querySelector("h3").textContent = `stream ${p.stream}` + (!up ?
      " (no service of this stream is up: its queries wait on the control topic)" :
      p.metrics ? "" : " (no metrics endpoint answers: rates, lags and checkpoints " +
      "need cep serve api --api-metrics)");
    if (p.svg && pipelineDrawings.get(p.stream) !== p.svg) {
      pipelineDrawings.set(p.stream, p.svg);
      view.querySelector(".graph").replaceChildren(svgNode(p.svg));
    }
    p.processes.forEach((proc, i) => {
      const node = view.querySelector(`.graph g[id="node-${i}"]`);
      if (!node) return;
      node.dataset.process = proc.id;
      node.dataset.rate = proc.rate === null ? "" : proc.rate;
      const texts = node.querySelectorAll("text");
      if (texts.length) texts[texts.length - 1].textContent =
        `${number(proc.rate)} ${proc.rate_unit}`;
      (proc.stages || []).forEach((stage, j) => {  // a chained process's stages: in, out
        const box = view.querySelector(`.graph g[id="node-${i}-${j}"]`);
        if (!box) return;
        box.dataset.stage = stage.stage;
        box.dataset.rateIn = stage.events_in_per_s === null ? "" : stage.events_in_per_s;
        box.dataset.rateOut = stage.events_out_per_s === null ? "" : stage.events_out_per_s;
        const lines = box.querySelectorAll("text");
        if (lines.length < 3) return;
        lines[lines.length - 2].textContent = `${number(stage.events_in_per_s)} ${stage.in_unit}`;
        lines[lines.length - 1].textContent = `${number(stage.events_out_per_s)} ${stage.out_unit}`;
      });
    });
    // Deliberately like the partitions' table below: each table of the view fills its own columns
    const procs = view.querySelector(".processes").tBodies[0];
    procs.replaceChildren();
    for (const proc of p.processes) {
      const row = procs.insertRow();
      row.dataset.process = proc.id;
      cell(row, proc.name);
      cell(row, proc.role);
      cell(row, `${number(proc.rate)} ${proc.rate_unit}`);
      cell(row, proc.role === "api" ? `${proc.tails} tails open` : number(proc.lag, 0));
      cell(row, checkpoint(proc));
    }
    const stages = view.querySelector(".stages");
    const staged = p.processes.filter((proc) => (proc.stages || []).length);
    stages.hidden = !staged.length;
    stages.tBodies[0].replaceChildren();
    for (const proc of staged) {
      for (const stage of proc.stages) {
        const row = stages.tBodies[0].insertRow();
        row.dataset.stage = stage.stage;
        cell(row, stage.stage);
        cell(row, proc.name).title = stage.services.join(", ");
        cell(row, `${number(stage.events_in_per_s)} ${stage.in_unit}`);
        cell(row, `${number(stage.events_out_per_s)} ${stage.out_unit}`);
      }
    }
    // Deliberately like the processes' table above: each table of the view fills its own columns
    const parts = view.querySelector(".partitions").tBodies[0];
    parts.replaceChildren();
    for (const part of p.partitions) {
      const row = parts.insertRow();
      row.dataset.partition = part.partition;
      cell(row, part.partition);
      cell(row, part.worker);
      cell(row, number(part.lag, 0));
      cell(row, part.seq);
      cell(row, eventTime(part.event_time, p.time_unit));
      cell(row, part.last_frame_s_ago === null ? "–" : `${number(part.last_frame_s_ago)} s ago`);
    }
    const withheld = view.querySelector(".withheld");
    withheld.replaceChildren(...(p.withheld.length ? p.withheld : [{says: "nothing withheld"}])
      .map((w) => Object.assign(document.createElement("li"), {textContent: w.says})));
  }
  for (const view of box.querySelectorAll(".pipeline")) {
    if (!shown.has(view.dataset.stream)) view.remove();
  }
}

// ---------------------------------------------------------------- queries over time

async function refreshHistory() {
  let reply;
  try { reply = await api("GET", "/api/history?since=" + historySince); } catch (e) { return; }
  const horizon = Date.now() / 1000 - HISTORY_S;
  for (const [name, points] of Object.entries(reply.body.queries || {})) {
    const kept = history.get(name) || {t: [], composites_per_s: [], partial_matches: [],
                                       state_bytes: []};
    for (const key of Object.keys(kept)) kept[key].push(...points[key]);
    while (kept.t.length && kept.t[0] < horizon) for (const key of Object.keys(kept)) kept[key].shift();
    if (points.t.length) historySince = Math.max(historySince, points.t[points.t.length - 1]);
    history.set(name, kept);
  }
  for (const name of [...history.keys()]) if (!(name in (reply.body.queries || {}))) history.delete(name);
}

function sparkline(values) {  // a small SVG polyline of the last minutes' composites/s
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "90");
  svg.setAttribute("height", "18");
  svg.setAttribute("class", "sparkline");
  const found = values.filter((v) => v !== null);
  if (found.length > 1) {
    const top = Math.max(...found, 1e-9);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", values.map((v, i) => `${(i / (values.length - 1)) * 88 + 1},` +
      `${17 - ((v || 0) / top) * 16}`).join(" "));
    svg.append(line);
  }
  return svg;
}

const compact = new Intl.NumberFormat("en", {notation: "compact", maximumFractionDigits: 1});

function drawCharts() {
  if (!detail || typeof uPlot === "undefined") return;
  const points = history.get(detail.name) || {t: []};
  for (const box of document.querySelectorAll("#detail .chart")) {
    const series = box.dataset.series;
    const data = [points.t, (points[series] || []).map((v) => v === null ? null : v)];
    let chart = detail.charts[series];
    if (!chart) {
      chart = new uPlot({width: 300, height: 120, legend: {show: false},
        scales: {x: {time: true}}, series: [{}, {stroke: "#2f6fdb", width: 1.5,
        fill: "rgba(47,111,219,0.12)", spanGaps: true}],
        axes: [{size: 30}, {size: 50, values: (u, ticks) => ticks.map((v) => compact.format(v))}]},
        data, box);
      detail.charts[series] = chart;
    } else {
      chart.setData(data);
    }
    box.dataset.points = data[1].filter((v) => v !== null).length;
  }
}

async function showDetail(name) {
  if (detail) for (const chart of Object.values(detail.charts)) chart.destroy();
  detail = {name, charts: {}};
  $("detail").hidden = false;
  $("detail-name").textContent = name;
  $("explain").replaceChildren(document.createTextNode("…"));
  delete $("explain").dataset.kind;
  $("explain-text").textContent = "";
  $("explain-headline").textContent = "";
  drawDetailState();
  drawCharts();
  $("detail").scrollIntoView({block: "nearest"});
  const reply = await api("GET", "/api/queries/" + encodeURIComponent(name) + "/explain");
  if (!detail || detail.name !== name) return;
  const e = reply.body;
  if (reply.status !== 200) { $("explain").textContent = e.error || "no explanation"; return; }
  $("explain").dataset.kind = e.kind;
  $("explain").replaceChildren(e.svg ? svgNode(e.svg) : document.createTextNode(
    "(Graphviz's dot is not installed on the API's machine: the text below says it)"));
  $("explain-headline").textContent = `${e.kind}: ${e.headline}`;
  $("explain-text").textContent = e.text;
}

function drawDetailState() {
  if (!detail) return;
  const q = liveQueries.find((x) => x.name === detail.name);
  const s = (q && q.state) || {};
  const state = q === undefined ? "removed" : s.failed ? "failed" : s.live ? "live" : "waiting";
  $("detail-state").textContent = state;
  $("detail-state").className = state === "live" ? "live" : state === "failed" ? "failed" : "down";
  $("detail-reason").hidden = !s.failed;
  $("detail-reason").textContent = s.failed ? s.reason || "" : "";
}

$("detail-close").onclick = () => {
  if (detail) for (const chart of Object.values(detail.charts)) chart.destroy();
  detail = null;
  $("detail").hidden = true;
};

// ---------------------------------------------------------------- live queries

async function refreshQueries() {
  let reply;
  try {
    reply = await api("GET", "/api/queries");
    $("health").textContent = "connected";
  } catch (e) {
    $("health").textContent = "API not reachable";
    return;
  }
  liveQueries = reply.body.queries || [];
  await refreshHistory();
  timed("queries", drawQueries);
  followChosen();
  drawDetailState();
  drawCharts();
}

function drawQueries() {
  const body = $("queries").tBodies[0];
  body.replaceChildren();
  for (const q of liveQueries) {
    const s = q.state || {};
    const row = body.insertRow();
    row.dataset.query = q.name;
    if (following.has(q.name)) row.dataset.tail = "ready";
    const name = cell(row, q.name, "name");
    name.onclick = () => showDetail(q.name);
    cell(row, q.stream);
    cell(row, q.output);
    const stateCell = cell(row, s.failed ? "failed: " + (s.reason || "") : s.live ? "live" :
      "waiting", s.failed ? "failed" : s.live ? "live" : "down");
    if (s.failed) stateCell.title = s.reason || "";
    cell(row, (s.services || []).length);
    cell(row, (s.partitions || []).join(" "));
    cell(row, number(s.composites_per_s), "rate");
    row.insertCell().append(sparkline((history.get(q.name) || {composites_per_s: []})
      .composites_per_s.slice(-60)));
    cell(row, number(s.partial_matches, 0));
    cell(row, number(s.state_bytes, 0));
    const actions = row.insertCell();
    actions.className = "actions-cell";
    const show = document.createElement("button");
    show.textContent = "Details";
    show.className = "details";
    show.onclick = () => showDetail(q.name);
    const edit = document.createElement("button");
    edit.textContent = "Edit";
    edit.onclick = () => { $("editor").value = q.text; check(); };
    const remove = document.createElement("button");
    remove.textContent = "Remove";
    remove.className = "remove";
    remove.onclick = () => change("DELETE", "/api/queries/" + encodeURIComponent(q.name));
    actions.append(show, " ", edit, " ", remove);
  }
  const select = $("filter-query");
  const chosen = select.value;
  select.replaceChildren(new Option("all queries", ""),
    ...liveQueries.map((q) => new Option(q.name, q.name)));
  select.value = liveQueries.some((q) => q.name === chosen) ? chosen : "";
}

// ---------------------------------------------------------------- composite events

function followChosen() {  // one tail: the chosen query's, else every live query's
  const chosen = $("filter-query").value;
  const names = liveQueries.map((q) => q.name);
  // every query's tail is opened again when the live set changes (it starts at the end)
  const wanted = chosen || "\u0000" + names.join(",");
  if (wanted === tailOf) return;
  if (tail) tail.close();
  following.clear();
  tailOf = wanted;
  tail = null;
  $("following").textContent = names.length ? `following ${chosen || "every query"}` : "";
  if (!names.length) return;
  tail = new EventSource("/api/tail" + (chosen ? "?queries=" + encodeURIComponent(chosen) : ""));
  tail.addEventListener("ready", () => {
    for (const name of chosen ? [chosen] : names) following.add(name);
    for (const row of document.querySelectorAll("#queries tbody tr")) {
      if (following.has(row.dataset.query)) row.dataset.tail = "ready";
    }
  });
  tail.addEventListener("composite", (event) => {
    timing.received += 1;
    const composite = JSON.parse(event.data);
    events.unshift({query: composite.query, composite});
    if (events.length > KEEP_EVENTS) events.length = KEEP_EVENTS;
    if (paused) { missed += 1; $("paused-count").textContent = `${missed} new while paused`; }
    else scheduleEvents();
  });
}

let eventsScheduled = false;
function scheduleEvents() {  // at most one table a frame, whatever the rate of events
  if (eventsScheduled) return;
  eventsScheduled = true;
  requestAnimationFrame(() => { eventsScheduled = false; timed("events", drawEvents); });
}

function drawEvents() {
  const query = $("filter-query").value;
  const key = $("filter-key").value.trim();
  const shown = events.filter((e) => (!query || e.query === query) &&
    (!key || JSON.stringify(e.composite.key ?? null).includes(key)));
  const fields = [];
  for (const e of shown) {
    for (const f of Object.keys(e.composite)) {
      if (!["query", "key", "seq"].includes(f) && !fields.includes(f)) fields.push(f);
    }
  }
  const columns = ["query", "key", "seq", ...fields];
  const head = $("composites").tHead.rows[0];
  if (head.dataset.columns !== columns.join("\u0000")) {
    head.dataset.columns = columns.join("\u0000");
    head.replaceChildren(...columns.map((c) =>
      Object.assign(document.createElement("th"), {textContent: c})));
  }
  const body = $("composites").tBodies[0];
  body.replaceChildren();
  for (const e of shown) {
    const row = body.insertRow();
    row.dataset.query = e.query;
    row.dataset.composite = JSON.stringify(e.composite);
    for (const c of columns) {
      const value = c === "query" ? e.query : e.composite[c];
      const td = cell(row, value !== null && typeof value === "object" ?
        JSON.stringify(value) : value);
      td.dataset.field = c;
    }
  }
}

$("filter-query").addEventListener("change", () => { followChosen(); drawEvents(); });
$("filter-key").addEventListener("input", () => drawEvents());
$("pause").onclick = () => {
  paused = !paused;
  $("pause").textContent = paused ? "Resume" : "Pause";
  $("pause").classList.toggle("paused", paused);
  if (!paused) { missed = 0; $("paused-count").textContent = ""; drawEvents(); }
};

// ---------------------------------------------------------------- the editor

let pending = null;
async function check() {
  const text = $("editor").value;
  const view = $("checked");
  if (!text.trim()) { view.replaceChildren(); view.className = ""; return; }
  const reply = await api("POST", "/api/queries/validate", {text});
  if ($("editor").value !== text) return;  // typed on meanwhile: a newer check follows
  showChecked(text, reply.body.errors || []);
}

function showChecked(text, errors) {
  const view = $("checked");
  view.replaceChildren();
  view.className = errors.length ? "errors" : "ok";
  const byLine = new Map();
  for (const e of errors) {
    const key = e.line || 0;
    byLine.set(key, (byLine.get(key) || []).concat([e]));
  }
  text.split("\n").forEach((line, i) => {
    const div = document.createElement("div");
    div.className = "line";
    div.dataset.line = i + 1;
    const no = document.createElement("span");
    no.className = "no";
    no.textContent = i + 1;
    div.append(no, line);
    view.append(div);
    for (const e of byLine.get(i + 1) || []) view.append(errorLine(e));
  });
  for (const e of byLine.get(0) || []) view.append(errorLine(e));
}

function errorLine(e) {
  const div = document.createElement("div");
  div.className = "error";
  if (e.line) div.dataset.line = e.line;
  const gutter = document.createElement("span");  // as wide as the line numbers
  gutter.className = "no";
  const caret = e.column ? " ".repeat(e.column - 1) + "^ " : "";
  div.append(gutter, caret + (e.line ? e.line + ":" + e.column + ": " : "") + e.message);
  return div;
}

$("editor").addEventListener("input", () => {
  clearTimeout(pending);
  pending = setTimeout(check, 250);
});

async function change(method, path, body) {
  const outcome = $("outcome");
  outcome.className = "";
  outcome.textContent = "sent, waiting for the services…";
  try {
    const reply = await api(method, path, body);
    const b = reply.body;
    outcome.className = b.outcome || "error";
    outcome.textContent = b.error ? b.error : (b.changes || []).map((c) => c.said || (c.name +
      ": " + c.outcome)).join("\n") || (b.errors || []).map((e) => e.message).join("\n");
    if (b.outcome === "invalid" && body && body.text) showChecked(body.text, b.errors);
  } catch (e) {
    outcome.className = "error";
    outcome.textContent = String(e);
  }
  refreshQueries();
}

$("add").onclick = () => change("POST", "/api/queries", {text: $("editor").value});
$("replace").onclick = async () => {
  const text = $("editor").value;
  const checked = (await api("POST", "/api/queries/validate", {text})).body;
  const name = (checked.queries && checked.queries[0] || {}).name;
  if (!name) { showChecked(text, checked.errors); return; }
  change("PUT", "/api/queries/" + encodeURIComponent(name), {text});
};


refreshQueries();
refreshPipeline();
setInterval(refreshQueries, REFRESH_MS);
setInterval(refreshPipeline, REFRESH_MS);
