"""Runs MATCH_RECOGNIZE statements through Apache Flink (PyFlink, streaming mode, one
parallel task) over rows given as JSON lines, and prints each statement's rows as JSON.

Run by the dev venv's tests with the separate `.venv-flink` interpreter (`make venv-flink`):

    .venv-flink/bin/python tests/recognize_flink/flink_run.py CASES.json > ANSWERS.json

CASES.json: {"columns": {"symbol": "STRING", "price": "INT", ...}, "time": "ts",
"rows": [{...}, ...], "statements": {"name": "SELECT ... FROM quotes MATCH_RECOGNIZE ..."}}.
The rows become the table `quotes`, its time attribute `rowtime` (TIMESTAMP_LTZ(3) from the
millisecond column `time`) with a watermark equal to it (or `watermark_delay_ms` behind it,
so that rows of one time are not late); each statement's rows (or its
error) go out under its name.
"""

import json
import sys

from pyflink.table import EnvironmentSettings, TableEnvironment


def main(path: str) -> None:
    spec = json.load(open(path))
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", "1")
    columns = spec["columns"]
    time = spec["time"]
    # rows of one time need a watermark behind them, else all but the first come late
    delay = spec.get("watermark_delay_ms", 0)
    watermark = f"rowtime - INTERVAL '{delay / 1000}' SECOND" if delay else "rowtime"
    rows_file = path + ".rows.jsonl"
    with open(rows_file, "w") as f:
        for row in spec["rows"]:
            f.write(json.dumps(row) + "\n")
    schema = ", ".join(f"`{name}` {kind}" for name, kind in columns.items())
    env.execute_sql(f"""
        CREATE TABLE quotes ({schema},
            rowtime AS TO_TIMESTAMP_LTZ(`{time}`, 3),
            WATERMARK FOR rowtime AS {watermark})
        WITH ('connector' = 'filesystem', 'path' = '{rows_file}', 'format' = 'json')""")
    answers = {}
    for name, statement in spec["statements"].items():
        try:
            with env.execute_sql(statement).collect() as results:
                answers[name] = [_plain(list(row)) for row in results]
        except Exception as e:  # noqa: BLE001 - Flink's refusal is an answer too
            answers[name] = {"error": _cause(str(e))}
    json.dump(answers, sys.stdout, indent=1, sort_keys=True)


def _cause(text: str) -> str:
    """The innermost Java exception's message of a py4j error (its first line is generic)."""
    causes = [line.strip() for line in text.splitlines()
              if line.strip().startswith(("Caused by:", "org.apache.flink"))]
    return (causes[-1] if causes else text.splitlines()[0])[:500]


def _plain(values):
    out = []
    for v in values:
        if hasattr(v, "timestamp"):  # MATCH_ROWTIME: milliseconds since the epoch
            v = round(v.timestamp() * 1000)
        out.append(v)
    return out


if __name__ == "__main__":
    main(sys.argv[1])
