"""Runs one MATCH_RECOGNIZE query on PyFlink's local mini-cluster (batch over a CSV file).

Executed by bench/peers/flink.py with the interpreter of a virtualenv that has
apache-flink (never the project's .venv):

    python bench/peers/flink_runner.py --query mshape --csv FILE --out FILE

The CSV has no header: symbol, price, volume, ts, seqNum. Rows are ordered by a time
attribute made from seqNum (strictly increasing, so ties in `ts` cannot reorder a symbol's
trades). Writes each match as a JSON list [first seqNum, last seqNum]; prints one JSON
object: matches and `job_s` (the job, from submission to the last row collected).
"""

from __future__ import annotations

# Deferred imports: pyflink lives only in the PyFlink peer's own virtualenv, where this script runs.

import argparse
import json
import time

# The product's MATCH queries (bench/peers/flink.py has them side by side): `.` is S,
# `First(price)` S.price, `Last(price)` the previous row of the (contiguous) match. Flink has
# no physical offsets (PREV) in MATCH_RECOGNIZE, so the previous row is the variable's own
# previous row or, for its first row, the last row of the variable before it.
QUERIES = {
    "mshape": """
        PATTERN (S R1+ D1+ R2+? D2* E)
        DEFINE
          R1 AS R1.price > S.price AND R1.price >= COALESCE(LAST(R1.price, 1), S.price),
          D1 AS D1.price >= S.price AND D1.price < COALESCE(LAST(D1.price, 1), LAST(R1.price)),
          R2 AS R2.price > S.price AND R2.price >= COALESCE(LAST(R2.price, 1), LAST(D1.price)),
          D2 AS D2.price >= S.price AND D2.price < COALESCE(LAST(D2.price, 1), LAST(R2.price)),
          E AS E.price < S.price AND E.price < COALESCE(LAST(D2.price), LAST(R2.price))""",
    "bigrise": """
        PATTERN (B R+ F)
        DEFINE
          B AS B.volume > 900,
          R AS R.volume <= 900 AND R.price > COALESCE(LAST(R.price, 1), B.price),
          F AS F.volume <= 900 AND F.price < LAST(R.price)""",
}


def sql(query: str) -> str:
    first, last = query_variables(query)
    return f"""
    SELECT start_seq, end_seq FROM trades MATCH_RECOGNIZE (
        PARTITION BY symbol ORDER BY rt
        MEASURES FIRST({first}.seqNum) AS start_seq, LAST({last}.seqNum) AS end_seq
        ONE ROW PER MATCH
        AFTER MATCH SKIP PAST LAST ROW
        {QUERIES[query]}
    )"""


def query_variables(query: str) -> tuple[str, str]:
    """The first and last variables of the query's PATTERN."""
    pattern = QUERIES[query].split("PATTERN (", 1)[1].split(")", 1)[0].split()
    return pattern[0].rstrip("+*?"), pattern[-1].rstrip("+*?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--query", required=True, choices=sorted(QUERIES))
    ap.add_argument("--csv", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--parallelism", type=int, default=1)
    args = ap.parse_args()

    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", str(args.parallelism))
    env.execute_sql(f"""
        CREATE TABLE trades (
            symbol STRING, price BIGINT, volume BIGINT, ts BIGINT, seqNum BIGINT,
            rt AS TO_TIMESTAMP_LTZ(seqNum, 3),
            WATERMARK FOR rt AS rt
        ) WITH ('connector' = 'filesystem', 'path' = '{args.csv}', 'format' = 'csv')""")
    started = time.perf_counter()
    count = 0
    with env.execute_sql(sql(args.query)).collect() as rows, open(args.out, "w") as out:
        for row in rows:
            out.write(json.dumps([row[0], row[1]]) + "\n")
            count += 1
    print(json.dumps({"query": args.query, "matches": count,
                      "job_s": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
