"""Markdown tables of `cep bench peers` results (what docs/peers.md shows)."""

from __future__ import annotations


def _k(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1000:,.1f}k"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


def _same(m: dict) -> str:
    if m["equal"]:
        return f"equal ({m['ours']:,})"
    return f"cep {m['ours']:,} / peer {m['theirs']:,} (only cep {m['only_ours']:,}, " \
           f"only peer {m['only_theirs']:,})"


# Deliberately like flink_table below: each peer's table has its own columns
def opencep_table(rows: list[dict]) -> str:
    lines = ["| pattern | scale | events | cep process ev/s | OpenCEP process ev/s | ratio "
             "| cep engine ev/s | OpenCEP engine ev/s | ratio | matches |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['scale']} | {r['events']:,} "
                     f"| {_k(r['cep_process_ev_s'])} | {_k(r['opencep_process_ev_s'])} "
                     f"| {_x(r['process_ratio'])} | {_k(r['cep_engine_ev_s'])} "
                     f"| {_k(r['opencep_engine_ev_s'])} | {_x(r['engine_ratio'])} "
                     f"| {_same(r['matches'])} |")
    return "\n".join(lines)


# Deliberately like opencep_table above: each peer's table has its own columns
def flink_table(rows: list[dict]) -> str:
    lines = ["| query | rows | cep process ev/s | Flink process ev/s | ratio | cep engine ev/s "
             "| Flink job ev/s | cep steady ev/s | Flink steady ev/s | matches |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['query']} | {r['rows']:,} | {_k(r['cep_process_ev_s'])} "
                     f"| {_k(r['flink_process_ev_s'])} | {_x(r['process_ratio'])} "
                     f"| {_k(r['cep_engine_ev_s'])} | {_k(r['flink_job_ev_s'])} "
                     f"| {_k(r.get('cep_steady_ev_s'))} | {_k(r.get('flink_steady_ev_s'))} "
                     f"| {_same(r['matches'])} |")
    return "\n".join(lines)
