"""Apache Flink MATCH_RECOGNIZE (PyFlink, local mini-cluster) against `cep run --engine jit`:
the M-shape query (`cep gen finance1`) and BIG RISE+ FALL over generated trades (390
symbols), whole processes, steady-state rates, and their match sets compared."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.csv as pacsv
from compare import compare
from flink_runner import sql
from opencep import run_cep, run_timed

from cep_core.workloads import WORKLOADS

HERE = Path(__file__).resolve().parent
INSTALL = "python3 -m venv /tmp/flinkvenv && /tmp/flinkvenv/bin/pip install apache-flink"

# `rise`, `drop` and `deep` (and `big`, `rise`, `fall`) exclude each other, so greedy and
# reluctant quantifiers find the same matches (Flink only allows `R2+?` before `D2*`).
BIGRISE = """QUERY bigrise FROM trades INTO bigrise
PARTITION BY symbol
PATTERN ( big rise+ fall )
DEFINE big AS volume > 900,
       rise AS volume <= 900 AND price > Last(price),
       fall AS volume <= 900 AND price < Last(price)
EMIT symbol = symbol, seqNum = First(seqNum), count = Count();
"""


def query_texts(seed: int) -> dict[str, str]:
    mshape = WORKLOADS["finance1"].query_text(seed).replace("finance1", "mshape")
    return {"mshape": mshape, "bigrise": BIGRISE}


def same_statement(name: str) -> str:
    """Flink's own statement for `name` as cep runs it (MATCH_RECOGNIZE, Flink's answers):
    ordered by `ts` (Flink's `rt` is made from seqNum, which keeps the file's order, as cep
    does for equal `ts`), the measures renamed from the composite's own `start_seq`."""
    return (sql(name).replace("ORDER BY rt", "ORDER BY ts")
            .replace("SELECT start_seq, end_seq", "SELECT *")
            .replace("AS start_seq", "AS first_seq").replace("AS end_seq", "AS last_seq"))


def check_pyflink(python: str | None) -> str:
    if not python:
        raise SystemExit("Flink: no PyFlink interpreter given; make one with "
                         f"`{INSTALL}` (Java 17 on PATH) and pass --pyflink "
                         "/tmp/flinkvenv/bin/python (or set PYFLINK_PYTHON)")
    try:
        done = subprocess.run([python, "-c", "import pyflink"], capture_output=True)
    except OSError:
        done = None
    if done is None or done.returncode:
        raise SystemExit(f"Flink: {python} cannot import pyflink; make a virtualenv with "
                         f"`{INSTALL}`")
    return python


def generate_trades(rows: int, seed: int):
    """The finance workload's trades (`cep gen finance1`), as a pyarrow table."""
    return WORKLOADS["finance1"].generate(rows, seed)


def write_trades(table, rows: int, work: Path) -> tuple[Path, Path]:
    """The first `rows` trades as CSV with a header (cep) and without (Flink): every
    input is a prefix of the largest, so the steady-state rates compare like with like."""
    table = table.slice(0, rows)
    ours, theirs = work / f"trades_{rows}.csv", work / f"trades_{rows}_flink.csv"
    pacsv.write_csv(table, ours)
    pacsv.write_csv(table.select(["symbol", "price", "volume", "ts", "seqNum"]), theirs,
                    pacsv.WriteOptions(include_header=False))
    return ours, theirs


def run_flink(python: str, query: str, csv: Path, out: Path) -> dict:
    cmd = [python, str(HERE / "flink_runner.py"), "--query", query, "--csv", str(csv),
           "--out", str(out)]
    wall_s, done = run_timed(cmd, f"Flink runner on {query}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall_s, "engine_s": summary["job_s"]}


def read_match_spans(path: Path) -> Counter:
    """`cep run` MATCH composites as (start_seq, seq)."""
    with open(path) as f:
        return Counter((d["start_seq"], d["seq"]) for d in map(json.loads, f))


def read_flink_spans(path: Path) -> Counter:
    with open(path) as f:
        return Counter(tuple(json.loads(line)) for line in f if line.strip())


def nested_in_earlier(only_ours: Counter, only_theirs: Counter) -> int:
    """Matches found by cep alone that lie inside a match found by Flink alone that starts
    earlier: the earlier start wins in Flink, the earlier end in cep (see docs/peers.md)."""
    return sum(1 for s, e in only_ours
               if any(s2 < s and e2 >= e for s2, e2 in only_theirs))


def run(python: str, rows_list: list[int], work: Path, seed: int = 0,
        progress=print) -> list[dict]:
    python = check_pyflink(python)
    rows = []
    texts = query_texts(seed)
    trades = generate_trades(max(rows_list), seed)
    for rows_n in sorted(rows_list):
        ours_csv, theirs_csv = write_trades(trades, rows_n, work)
        for name, text in texts.items():
            query = work / f"{name}.cep"
            query.write_text(text)
            ours_out, theirs_out = work / f"{name}_{rows_n}.cep.jsonl", \
                work / f"{name}_{rows_n}.flink.jsonl"
            progress(f"{name} {rows_n} rows: cep ...")
            ours = run_cep(query, ours_csv, ours_out, rows_n)
            progress(f"{name} {rows_n} rows: Flink ...")
            theirs = run_flink(python, name, theirs_csv, theirs_out)
            a, b = read_match_spans(ours_out), read_flink_spans(theirs_out)
            matches = compare(a, b)
            matches["only_ours_inside_earlier_flink_match"] = nested_in_earlier(a - b, b - a)
            rows.append(_row(name, rows_n, ours, theirs, matches))
            # The same statement on both sides: cep runs Flink's MATCH_RECOGNIZE text.
            query = work / f"{name}_sql.cep"
            query.write_text(same_statement(name))
            ours_out = work / f"{name}_sql_{rows_n}.cep.jsonl"
            progress(f"{name} {rows_n} rows: cep on Flink's statement ...")
            ours = run_cep(query, ours_csv, ours_out, rows_n)
            matches = compare(read_match_spans(ours_out), b)
            rows.append(_row(f"{name} (Flink's statement)", rows_n, ours, theirs, matches))
    return _with_steady_state(rows)


def _row(name: str, rows_n: int, ours: dict, theirs: dict, matches: dict) -> dict:
    return {"query": name, "rows": rows_n,
            "cep_process_ev_s": rows_n / ours["wall_s"],
            "cep_engine_ev_s": rows_n / ours["engine_s"],
            "flink_process_ev_s": rows_n / theirs["wall_s"],
            "flink_job_ev_s": rows_n / theirs["engine_s"],
            "process_ratio": theirs["wall_s"] / ours["wall_s"],
            "cep": ours, "flink": theirs, "matches": matches}


def _with_steady_state(rows: list[dict]) -> list[dict]:
    """Steady-state rate: the extra rows over the extra time between the smallest and the
    largest input of a query (start-up, compiling and JVM warm-up cancel out)."""
    for name in {r["query"] for r in rows}:
        mine = sorted((r for r in rows if r["query"] == name), key=lambda r: r["rows"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        extra = hi["rows"] - lo["rows"]
        for side, key in (("cep", "wall_s"), ("flink", "wall_s")):
            dt = hi[side][key] - lo[side][key]
            hi[f"{side}_steady_ev_s"] = extra / dt if dt > 0 else None
    return rows
