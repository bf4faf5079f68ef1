// The cep console: plain JavaScript against the API of the same origin (docs/api.md).
"use strict";

const $ = (id) => document.getElementById(id);
const latest = new Map();   // query name -> its latest composite events (newest first)
const tails = new Map();    // query name -> EventSource of its tail
const following = new Set();  // queries whose tail is placed (its `ready` event came)
const KEEP = 8;

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

async function refreshQueries() {
  let reply;
  try {
    reply = await api("GET", "/api/queries");
    $("health").textContent = "connected";
  } catch (e) {
    $("health").textContent = "API not reachable";
    return;
  }
  const body = $("queries").tBodies[0];
  body.replaceChildren();
  const names = new Set();
  for (const q of reply.body.queries || []) {
    names.add(q.name);
    const s = q.state || {};
    const row = body.insertRow();
    row.dataset.query = q.name;
    if (following.has(q.name)) row.dataset.tail = "ready";
    cell(row, q.name);
    cell(row, q.stream);
    cell(row, q.output);
    const stateCell = cell(row, s.failed ? "failed" : s.live ? "live" : "waiting",
                           s.failed ? "failed" : s.live ? "live" : "down");
    if (s.failed) stateCell.title = s.reason || "";
    cell(row, (s.services || []).length);
    cell(row, (s.partitions || []).join(" "));
    cell(row, s.composites_per_s);
    cell(row, s.partial_matches);
    const actions = row.insertCell();
    const edit = document.createElement("button");
    edit.textContent = "Edit";
    edit.onclick = () => { $("editor").value = q.text; check(); };
    const remove = document.createElement("button");
    remove.textContent = "Remove";
    remove.className = "remove";
    remove.onclick = () => change("DELETE", "/api/queries/" + encodeURIComponent(q.name));
    actions.append(edit, " ", remove);
    if (!tails.has(q.name)) follow(q.name);
  }
  for (const [name, source] of tails) {
    if (!names.has(name)) {
      source.close();
      tails.delete(name);
      latest.delete(name);
      following.delete(name);
    }
  }
  renderComposites();
}

function follow(name) {
  const source = new EventSource("/api/queries/" + encodeURIComponent(name) + "/tail");
  source.addEventListener("ready", () => {
    following.add(name);
    const row = document.querySelector(`#queries tr[data-query="${CSS.escape(name)}"]`);
    if (row) row.dataset.tail = "ready";
  });
  source.addEventListener("composite", (event) => {
    const list = latest.get(name) || [];
    list.unshift(JSON.parse(event.data));
    latest.set(name, list.slice(0, KEEP));
    renderComposites();
  });
  tails.set(name, source);
}

function renderComposites() {
  const body = $("composites").tBodies[0];
  body.replaceChildren();
  for (const [name, list] of latest) {
    for (const composite of list) {
      const row = body.insertRow();
      row.dataset.query = name;
      cell(row, name);
      cell(row, JSON.stringify(composite.key));
      cell(row, JSON.stringify(composite), "json");
    }
  }
}

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
setInterval(refreshQueries, 2000);
