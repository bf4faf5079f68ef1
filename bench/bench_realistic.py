"""Users' data, not our benchmark's: an IoT stream as users write it, read by `cep run`'s
reader against pyarrow's own JSON reader on the same file (the floor).

The file: `--events` JSON lines `{"device", "zone", "kind", "temp", "humidity", "ts",
"firmware", "meta"}`: ISO-8601 times in four spellings (`Z` with 6 decimals, `+02:00` with
3, no zone, `-05:30` with none), a field and a nested object the schema does not name.
Measured in one process, interleaved, best of `--repeat`: `read_table` (the columnar
reader: every event and dead letter exactly as the record reader gives them) and
`pyarrow.json.read_json`; then whole processes, `cep run` on one MATCH query against
`python -c "pyarrow.json.read_json(...)"`.

    .venv/bin/python bench/bench_realistic.py --events 200000 --json
"""

from __future__ import annotations

# Deferred imports: pyarrow and the reader load when the benchmark runs, after the file is
# written.

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

SCHEMA = {"stream": "plant", "attributes": {
    "device": "string", "zone": "string", "kind": "string", "temp": "float",
    "humidity": "float", "ts": "timestamp"}, "time": "ts", "time_unit": "ms"}
QUERY = """QUERY hot FROM plant INTO hot PARTITION BY device
PATTERN ( warm hotter+ ) DEFINE warm AS temp > 25, hotter AS temp > Last(temp)
EMIT device = device, n = Count();
"""
ZONES = [(dt.UTC, "%Y-%m-%dT%H:%M:%S.%fZ"),
         (dt.timezone(dt.timedelta(hours=2)), "%Y-%m-%dT%H:%M:%S.{ms}+02:00"),
         (None, "%Y-%m-%dT%H:%M:%S.%f"),
         (dt.timezone(-dt.timedelta(hours=5, minutes=30)), "%Y-%m-%dT%H:%M:%S-05:30")]


def write_file(path: Path, n: int) -> None:
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with open(path, "wb") as f:
        for i in range(n):
            zone, spelling = ZONES[(i // 1000) % len(ZONES)]
            when = start + dt.timedelta(milliseconds=100 * i)
            local = when.astimezone(zone) if zone else when.replace(tzinfo=None)
            text = local.strftime(spelling.replace("{ms}", f"{local.microsecond // 1000:03d}"))
            f.write(orjson.dumps({
                "device": f"dev-{i % 50:03d}", "zone": f"zone-{i % 7}", "kind": "reading",
                "temp": round(15 + (i * 7919 % 1500) / 100, 2),
                "humidity": round(20 + (i * 104729 % 400) / 10, 1), "ts": text,
                "firmware": "1.2.3", "meta": {"rssi": -40 - i % 30}},
                option=orjson.OPT_APPEND_NEWLINE))


def best(seconds: list[float]) -> float:
    return round(min(seconds), 3)


def run(n: int, repeat: int) -> dict:
    import pyarrow.json as pj

    from cep_core.event_reader import read_table
    from cep_core.schema import StreamSchema

    folder = Path(tempfile.mkdtemp(prefix="cep-realistic-"))
    events, schema_file, query_file = (folder / "iot.jsonl", folder / "plant.json",
                                       folder / "hot.cep")
    write_file(events, n)
    schema_file.write_text(json.dumps(SCHEMA))
    query_file.write_text(QUERY)
    schema = StreamSchema.from_dict(SCHEMA)
    read_table(events, schema)  # warm: imports, page cache
    ours, floor = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        table, dead = read_table(events, schema)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        pj.read_json(events)
        floor.append(time.perf_counter() - started)
    assert table.num_rows == n and not dead
    cep = Path(sys.executable).with_name("cep")
    runs, floors = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([str(cep), "run", str(query_file), "--schema", str(schema_file),
                        "--events", str(events), "-o", str(folder / "out.jsonl")],
                       check=True, capture_output=True)
        runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sys, pyarrow.json as pj; "
                        "pj.read_json(sys.argv[1])", str(events)], check=True)
        floors.append(time.perf_counter() - started)
    return {"events": n, "bytes": os.path.getsize(events),
            "read_table_s": best(ours), "pyarrow_read_json_s": best(floor),
            "ratio": round(min(ours) / min(floor), 2),
            "cep_run_process_s": best(runs), "pyarrow_process_s": best(floors),
            "process_ratio": round(min(runs) / min(floors), 2),
            "load_average": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.events, args.repeat)
    print(orjson.dumps(result).decode() if args.json else result)


if __name__ == "__main__":
    main()
