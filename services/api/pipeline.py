"""The pipeline view of the console (GET /api/pipeline): one stream's processes as a
graph with their rates, each keyed partition with its lag, seq, stream time and last
frame, each process's last checkpoint, and the composite events the coordinator
withholds with what they wait for.

Generic over the processes: they are those up on the stream's status topic (any role:
splitter, worker, coordinator shards, or one process with another role), joined by name
with the figures of the Prometheus endpoints the API reads (`--api-metrics`; each
service's `cep_service` metric names it). A chained process (services/stream/chained.py)
writes on the status topic as a splitter, a worker and coordinator shards; its endpoint
names them (`cep_stage_service`), and the view folds them into one node of role `chained`
with its stages (routing, partitions, merge) and their rates. The graph ranks processes
by role in the order data flows (ROLES; an unknown role takes a rank of its own before
the API), one edge between each rank and the next, and is drawn by Graphviz's dot only
when its shape changes (the console writes the rates into the drawing's nodes).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cep_core.explain import quote, svg
from cep_service.stream.status import Presence, Role

ROLES = (Role.BROKER, Role.SPLITTER, Role.WORKER, Role.COORDINATOR)  # then others, the api
RATE_PLACEHOLDER = "000,000.0 composites/s out"  # as wide as the rates the console writes
WHAT_FLOWS = {Role.BROKER: "source", Role.SPLITTER: "keyed", Role.WORKER: "matches",
              Role.COORDINATOR: "INTO", Role.CHAINED: "INTO"}
# A chained process's stages in the order data flows through them: what each takes in and
# sends out, and what goes from it to the next (in memory)
STAGES = {"routing": ("events/s in", "routed/s out", "keyed"),
          "partitions": ("events/s in", "matches/s out", "matches"),
          "merge": ("matches/s in", "composites/s out", "")}


def endpoint_figures(text: str) -> dict:
    """What one Prometheus endpoint says, by the metric's name: a list of (labels, value)
    of its samples."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _one(figures: dict, name: str) -> float | None:
    found = figures.get(name)
    return found[0][1] if found else None


def process_figures(figures: dict, before: tuple | None, now: float) -> dict:
    """One endpoint's process: its name and role, counters and their rates since the
    `before` look (`look(...)` of the last figures), lag, last checkpoint; a chained
    process's stages too (the names they write as on the status topic, and per stage its
    events in and out with their rates)."""
    named: dict = next((labels for labels, _ in figures.get("cep_service", ())
                  if labels.get("service")), {})
    events_in = _one(figures, "cep_events_in_total") or 0.0
    events_out = _one(figures, "cep_events_out_total") or 0.0
    stages: dict[str, list] = {}
    for i, name in enumerate(("cep_stage_events_in_total", "cep_stage_events_out_total")):
        for labels, value in figures.get(name, ()):
            stages.setdefault(labels["stage"], [0.0, 0.0])[i] = value
    elapsed = None if before is None else now - before[0]
    rates: tuple = (None, None)
    stage_rates: dict[str, tuple] = {}
    if before is not None and elapsed is not None and elapsed > 0.05:
        rates = tuple(round((value - old) / elapsed, 1)
                      for value, old in ((events_in, before[1]), (events_out, before[2])))
        earlier = before[3] if len(before) > 3 else {}
        stage_rates = {stage: tuple(round((value - old) / elapsed, 1)
                                    for value, old in zip(counts, earlier[stage]))
                       for stage, counts in stages.items() if stage in earlier}
    checkpoint = _one(figures, "cep_checkpoint_time_seconds")
    took = _one(figures, "cep_checkpoint_seconds")
    oldest = {labels["output"]: value for labels, value in figures.get("cep_withheld_seq", ())}
    return {"service": named.get("service"), "role": named.get("role"),
            "events_in": events_in, "events_out": events_out,
            "events_in_per_s": rates[0], "events_out_per_s": rates[1],
            "members": {labels["service"]: labels["stage"]
                        for labels, _ in figures.get("cep_stage_service", ())},
            "stages": {stage: tuple(counts) for stage, counts in stages.items()},
            "stages_per_s": stage_rates,
            "lag": _one(figures, "cep_consumer_lag"),
            "checkpoint_time": checkpoint or None,
            "checkpoint_generation": _one(figures, "cep_checkpoint_generation")
            if checkpoint else None,
            "checkpoint_ms": round(took * 1000, 1) if checkpoint and took else None,
            "partition_lag": {(labels["topic"], int(labels["partition"])): value
                              for labels, value in figures.get("cep_partition_lag", ())},
            "merged": {name: {int(labels["partition"]): value
                              for labels, value in figures.get(metric, ())}
                       for name, metric in (("seq", "cep_merged_seq"),
                                            ("time", "cep_merged_event_time"),
                                            ("frame", "cep_merged_frame_time_seconds"))},
            "withheld": [{"output": labels["output"], "waits_for": labels["waits_for"],
                          "seq": int(oldest.get(labels["output"], -1)), "count": int(value)}
                         for labels, value in figures.get("cep_withheld_composites", ())]}


def look(found: dict, now: float) -> tuple:
    """What the next process_figures of the same endpoint takes its rates from."""
    return now, found["events_in"], found["events_out"], found.get("stages", {})


def pipeline(stream: str, topics: Any, view: dict, processes: dict, api: dict,
             bootstrap: str, now: float | None = None) -> dict:
    """The pipeline of `stream` (`topics`: its Topics): `view` is its status topic's
    services up (services_view), `processes` the endpoints' figures by service name
    (process_figures; those of other streams' services are left out), `api` this API's
    own node (rates of the INTO topics, open tails). A chained process is one node (role
    `chained`) with its stages: the services it writes as on the status topic (a splitter,
    a worker, coordinator shards) are folded into it."""
    now = time.time() if now is None else now
    processes = {service: found for service, found in processes.items() if service in view}
    folded = {member: service for service, found in processes.items()
              for member in found.get("members", {}) if member != service}
    view = {service: _folded(service, entry, view, processes, folded)
            for service, entry in view.items() if service not in folded}
    procs: list[dict] = [{"id": "broker", "role": Role.BROKER, "name": bootstrap,
              "state": Presence.UP, "partitions": [], "rate": _sum(found.get("events_in_per_s")
                                             for service, found in processes.items()
                                             if service in view and view[service]["role"]
                                             in (Role.SPLITTER, Role.CHAINED)),
              "rate_unit": "records/s in"}]
    for service, entry in sorted(view.items(), key=lambda i: (_rank(i[1]["role"]), i[0])):
        found = processes.get(service, {})
        out_role = entry["role"] == Role.COORDINATOR
        checkpoint = found.get("checkpoint_time")
        procs.append({
            "id": service, "role": entry["role"] or "?", "name": service, "state": Presence.UP,
            "partitions": sorted(entry["partitions"]),
            "rate": found.get("events_out_per_s" if out_role else "events_in_per_s"),
            "rate_unit": "composites/s out" if out_role else "events/s in",
            "lag": found.get("lag"),
            "checkpoint_s_ago": None if checkpoint is None else round(now - checkpoint, 1),
            "checkpoint_time": checkpoint,
            "checkpoint_generation": found.get("checkpoint_generation"),
            "checkpoint_ms": found.get("checkpoint_ms"),
            "services": entry.get("services", []),
            "stages": _stages(found) if entry["role"] == Role.CHAINED else []})
    procs.append({"id": "api", "role": Role.API, "name": "API", "state": Presence.UP,
                  "partitions": [],
                  "rate": api.get("composites_per_s"), "rate_unit": "composites/s",
                  "tails": api.get("tails")})
    return {"stream": stream, "processes": procs, "edges": _edges(procs),
            "partitions": _partitions(topics, view, processes, now),
            "withheld": _withheld(processes),
            "metrics": bool(processes)}


def _folded(service: str, entry: dict, view: dict, processes: dict, folded: dict) -> dict:
    """A status view's entry; a chained process's (its routing stage's name) with role
    `chained`, the keyed partitions its stages hold and the names they write as."""
    members = [m for m, into in folded.items() if into == service]
    if not members and processes.get(service, {}).get("role") != Role.CHAINED:
        return entry
    partitions = dict(entry["partitions"])
    for member in members:
        partitions.update(view[member]["partitions"] if member in view else {})
    return {**entry, "role": Role.CHAINED, "partitions": partitions,
            "services": [service, *sorted(m for m in members if m in view)]}


def _stages(found: dict) -> list[dict]:
    """A chained process's stages, in the order data flows, with their rates."""
    rates = found.get("stages_per_s", {})
    members = found.get("members", {})
    return [{"stage": stage, "events_in_per_s": rates.get(stage, (None, None))[0],
             "events_out_per_s": rates.get(stage, (None, None))[1],
             "in_unit": units[0], "out_unit": units[1],
             "services": sorted(m for m, s in members.items() if s == stage)}
            for stage, units in STAGES.items() if stage in found.get("stages", {})]


def _rank(role: str | None) -> int:
    if role == Role.API:
        return len(ROLES) + 1
    return ROLES.index(role) if role in ROLES else len(ROLES)


def _sum(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(sum(found), 1) if found else None


def _edges(procs: list[dict]) -> list[dict]:
    ranks: dict[int, list[str]] = {}
    for p in procs:
        ranks.setdefault(_rank(p["role"]), []).append(p["id"])
    order = sorted(ranks)
    out = []
    for a, b in zip(order, order[1:]):
        role = procs[[p["id"] for p in procs].index(ranks[a][0])]["role"]
        for source in ranks[a]:
            for target in ranks[b]:
                out.append({"source": source, "target": target,
                            "label": WHAT_FLOWS.get(role, "")})
    return out


def _partitions(topics: Any, view: dict, processes: dict, now: float) -> list[dict]:
    """Each keyed partition: who holds it, its lag there, and the coordinators' view (the
    lowest seq and stream time of the shards, the newest frame)."""
    holders = {p: service for service, entry in view.items()
               if entry["role"] in (Role.WORKER, Role.CHAINED) for p in entry["partitions"]}
    lags: dict[int, float] = {}
    merged: dict[int, dict] = {}
    for found in processes.values():
        for (topic, part), lag in found["partition_lag"].items():
            if topic == topics.keyed:
                lags[part] = lags.get(part, 0) + lag
        for measure, values in found["merged"].items():
            for part, value in values.items():
                seen = merged.setdefault(part, {})
                pick = max if measure == "frame" else min
                seen[measure] = value if measure not in seen else pick(seen[measure], value)
    parts = sorted(set(holders) | set(lags) | set(merged))
    return [{"partition": p, "worker": holders.get(p), "lag": lags.get(p),
             "seq": merged.get(p, {}).get("seq"), "event_time": merged.get(p, {}).get("time"),
             "last_frame_s_ago": None if "frame" not in merged.get(p, {}) else
             round(max(0.0, now - merged[p]["frame"]), 2)} for p in parts]


def _withheld(processes: dict) -> list[dict]:
    out = []
    for found in processes.values():
        for w in found["withheld"]:
            waits = w["waits_for"]
            if waits.startswith("partition "):
                seqs = found["merged"]["seq"]
                waits = ", ".join(f"partition {p} (at seq {int(seqs[int(p)])})"
                                  if int(p) in seqs else f"partition {p}"
                                  for p in waits.split(" ", 1)[1].split(","))
            out.append({**w, "says": f"{w['count']} composite event"
                        f"{'s' if w['count'] != 1 else ''} for {w['output']} from seq "
                        f"{w['seq']} wait for {waits}"})
    return sorted(out, key=lambda w: w["output"])


def graph_dot(view: dict) -> str:
    """The pipeline's processes and edges in Graphviz's language: each node's SVG group
    is `id="node-<i>"` in process order, and its last text line is the rate the console
    fills in."""
    out = ["digraph pipeline {", "  rankdir=LR; bgcolor=transparent;",
           '  node [fontname="Helvetica", fontsize=11, shape=box, style="rounded,filled", '
           'fillcolor="#ffffff"];', '  edge [fontname="Helvetica", fontsize=9];']
    ins, outs = {}, {}  # where an edge to a process ends, where one from it starts
    for i, p in enumerate(view["processes"]):
        label = f"{p['role']}\n{_short(p['name'])}\n{RATE_PLACEHOLDER}"
        ins[p["id"]] = outs[p["id"]] = f"n{i}"
        if not p.get("stages"):
            out.append(f"  n{i} [id={quote(f'node-{i}')}, label={quote(label)}, "
                       f"tooltip={quote(p['name'])}];")
            continue
        # a chained process: a box (id node-i) around its stages (ids node-i-j), each
        # with its rate in and out
        out += [f"  subgraph cluster_n{i} {{", f"    id={quote(f'node-{i}')}; "
                f"label={quote(label)}; tooltip={quote(p['name'])};",
                '    style="rounded,filled"; fillcolor="#f3f6fb"; color="#8aa4d6"; '
                'fontname="Helvetica"; fontsize=11;']
        stages = p["stages"]
        for j, stage in enumerate(stages):
            text = f"{stage['stage']}\n{RATE_PLACEHOLDER}\n{RATE_PLACEHOLDER}"
            out.append(f"    n{i}s{j} [id={quote(f'node-{i}-{j}')}, label={quote(text)}];")
        for j, a in enumerate(stages[:-1]):
            out.append(f"    n{i}s{j} -> n{i}s{j + 1} "
                       f"[label={quote(STAGES.get(a['stage'], ('', '', ''))[2])}];")
        out.append("  }")
        ins[p["id"]], outs[p["id"]] = f"n{i}s0", f"n{i}s{len(stages) - 1}"
    for e in view["edges"]:
        out.append(f"  {outs[e['source']]} -> {ins[e['target']]} "
                   f"[label={quote(e['label'])}];")
    out.append("}")
    return "\n".join(out) + "\n"


def _short(name: str) -> str:
    """A service's name without the host (`worker@host:pid#n` -> `pid#n`)."""
    return name.rsplit(":", 1)[-1] if "@" in name else name


class Drawings:
    """The graph's SVG per shape (roles, names, edges): dot runs once per shape."""

    def __init__(self, keep: int = 32):
        self.keep = keep
        self.kept: dict = {}

    def svg(self, view: dict) -> str | None:
        text = graph_dot(view)
        if text not in self.kept:
            if len(self.kept) >= self.keep:
                self.kept.pop(next(iter(self.kept)))
            try:
                self.kept[text] = svg(text)
            except RuntimeError:
                self.kept[text] = None
        return self.kept[text]
