"""Users' data, not our benchmark's: realistic streams read by `cep run`'s reader against
pyarrow's own reader on the same file (the floor), side by side in one run.

The files: the issue's IoT file (`{"device", "zone", "kind", "temp", "humidity", "ts",
"firmware", "meta"}`, ISO-8601 times in four spellings, a field and a nested object the
schema does not name) as the user wrote it, without its extra fields, with epoch-ms times,
and both; the realistic workloads (`cep gen iot|activity|clicks`) as JSON lines and CSV;
finance1 (our benchmark's own stream) for comparison. For each, interleaved, best of
`--repeat`: `read_table` (every event and dead letter exactly as the record reader gives
them) and `pyarrow.json.read_json` / `pyarrow.csv.read_csv`, in wall-clock and CPU seconds
(CPU: both threads of pyarrow counted; steadier on a busy machine); then, with
`--processes`, `cep run` whole (its summary's "read in") against a process that only calls
pyarrow's reader.

    .venv/bin/python bench/bench_realistic.py --events 200000 [--processes] [--json]
    cep bench reading --count 200000 [--processes] [--json]     # the same
"""

from __future__ import annotations

# Deferred imports: pyarrow and the reader load when the benchmark runs, after the files are
# written.

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from cep_core.schema import StreamSchema

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
ISSUE_FILES = {"as the user wrote them": (True, True), "without the extra fields": (True, False),
               "ISO times as epoch ms": (False, True), "both": (False, False)}


def write_file(path: Path, n: int, iso: bool = True, extra: bool = True) -> None:
    """The issue's IoT file (`iso`: times as ISO-8601 text, else epoch ms; `extra`: the
    firmware field and the meta object the schema does not name)."""
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    with open(path, "wb") as f:
        for i in range(n):
            zone, spelling = ZONES[(i // 1000) % len(ZONES)]
            when = start + dt.timedelta(milliseconds=100 * i)
            local = when.astimezone(zone) if zone else when.replace(tzinfo=None)
            text = local.strftime(spelling.replace("{ms}", f"{local.microsecond // 1000:03d}"))
            record = {"device": f"dev-{i % 50:03d}", "zone": f"zone-{i % 7}", "kind": "reading",
                      "temp": round(15 + (i * 7919 % 1500) / 100, 2),
                      "humidity": round(20 + (i * 104729 % 400) / 10, 1),
                      "ts": text if iso else round(when.timestamp() * 1000)}
            if extra:
                record |= {"firmware": "1.2.3", "meta": {"rssi": -40 - i % 30}}
            f.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))


def _files(folder: Path, n: int) -> list[tuple[str, Path, StreamSchema]]:
    """(name, file, schema) of every file measured."""
    from cep_core.event_io import EventFormat
    from cep_core.schema import StreamSchema
    from cep_core.workloads import WORKLOADS, write_events

    plant = StreamSchema.from_dict(SCHEMA)
    files = []
    for name, (iso, extra) in ISSUE_FILES.items():
        path = folder / f"issue-{iso}-{extra}.jsonl"
        write_file(path, n, iso, extra)
        files.append((f"issue file, {name}", path, plant))
    for name in ("iot", "activity", "clicks", "finance1"):
        workload = WORKLOADS[name]
        table = workload.written(n, 1)
        for fmt in (EventFormat.JSONL, EventFormat.CSV):
            path = write_events(table, folder / f"{name}.{fmt}", fmt)
            files.append((f"{name} {fmt}", path, workload.schema()))
    return files


def _best(run: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The least wall-clock and CPU seconds of `repeat` runs."""
    wall, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return min(wall), min(cpu)


def measure(name: str, path: Path, schema: StreamSchema, repeat: int) -> dict[str, Any]:
    import pyarrow.csv as pcsv
    import pyarrow.json as pj

    from cep_core.event_io import EventFormat, event_format
    from cep_core.event_reader import read_table

    floor = pcsv.read_csv if event_format(path) is EventFormat.CSV else pj.read_json
    table, dead = read_table(path, schema)  # warm: imports, page cache
    floor(path)
    ours, theirs = [], []
    for _ in range(repeat):  # interleaved: both see the same load
        ours.append(_best(lambda: read_table(path, schema), 1))
        theirs.append(_best(lambda: floor(path), 1))
    wall, cpu = min(w for w, _ in ours), min(c for _, c in ours)
    floor_wall, floor_cpu = min(w for w, _ in theirs), min(c for _, c in theirs)
    return {"file": name, "events": table.num_rows, "dead": len(dead),
            "mb": round(os.path.getsize(path) / 1e6, 1), "read_table_s": round(wall, 3),
            "floor_s": round(floor_wall, 3), "ratio": round(wall / floor_wall, 2),
            "cpu_ratio": round(cpu / floor_cpu, 2),
            "load_average": round(os.getloadavg()[0], 2)}


def processes(name: str, path: Path, folder: Path, repeat: int) -> dict[str, Any]:
    """`cep run` whole on one of the issue's files (and the read time its summary gives)
    against a process reading the file with pyarrow."""
    cep = Path(sys.executable).with_name("cep")
    schema_file, query_file = folder / "plant.json", folder / "hot.cep"
    schema_file.write_text(json.dumps(SCHEMA))
    query_file.write_text(QUERY)
    reader = "json"
    runs, reads, floors = [], [], []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([str(cep), "run", str(query_file), "--schema", str(schema_file),
                               "--events", str(path), "-o", str(folder / "out.jsonl")],
                              check=True, capture_output=True, text=True)
        runs.append(time.perf_counter() - started)
        read = re.search(r"read in ([0-9.]+)s", done.stderr)
        if read is None:
            raise RuntimeError(f"cep run's summary gives no read time:\n{done.stderr}")
        reads.append(float(read.group(1)))
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import sys, pyarrow.{reader} as r; "
                        f"r.read_{reader}(sys.argv[1])", str(path)], check=True)
        floors.append(time.perf_counter() - started)
    return {"file": name, "cep_run_s": round(min(runs), 3), "cep_run_read_s": min(reads),
            "pyarrow_process_s": round(min(floors), 3),
            "read_ratio": round(min(reads) / min(floors), 2),
            "load_average": round(os.getloadavg()[0], 2)}


def run_all(events: int = 200_000, repeat: int = 3,
            whole: bool = False) -> list[dict[str, Any]]:
    """A row per file (`measure`), then with `whole` a row per issue file (`processes`)."""
    folder = Path(tempfile.mkdtemp(prefix="cep-realistic-"))
    files = _files(folder, events)
    rows = [measure(name, path, schema, repeat) for name, path, schema in files]
    if whole:
        rows += [processes(name, path, folder, repeat)
                 for name, path, _ in files if name.startswith("issue")]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", action="store_true",
                        help="also whole `cep run` processes (the issue's file only)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for row in run_all(args.events, args.repeat, args.processes):
        print(orjson.dumps(row).decode() if args.json else row)


if __name__ == "__main__":
    main()
