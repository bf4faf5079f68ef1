"""The backfill's decode task (`SplitDecoder`) without Spark: a JSON lines file cut into small
batches (as mapInArrow hands a split's lines over) gives the events, seqs, lines and dead
letters that `cep run`'s reader (`event_io.read_events`) gives for the whole file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from cep_core.checker import load_queries
from cep_core.event_io import EventFormat, read_events, seq_not_increasing
from cep_core.schema import SchemaRegistry
from cep_service.backfill.ingest import InputFile, SplitDecoder

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ODD_LINES = ["", "[1,2]", '"x"', '{"seq": -3}', '{"price": NaN}', "\ufeff{}", '{"ts": 1e400}',
             " \t ", "null", "{" * 1100 + "}" * 1100, '{"symbol": "IBM", "price": 1']


def messy_lines() -> list[str]:
    lines = (EXAMPLES / "data" / "trades.jsonl").read_text().splitlines()
    back = orjson.loads(lines[40])
    back["seq"] = 5
    lines[40] = orjson.dumps(back).decode()
    lines[30] = lines[30].replace('"price":', '"price":"abc","was":')
    lines[20] = lines[20].replace('"price":', '"cost":')
    for i, odd in enumerate(ODD_LINES):
        lines.insert(3 + 17 * i, odd)
    return lines


@pytest.mark.parametrize("batch_lines", [1, 7, 300, 100_000])
def test_json_lines_decode_like_cep_run(tmp_path, batch_lines):
    schema = load_queries(EXAMPLES / "finance.cep", SchemaRegistry())[0].schema
    lines = messy_lines()
    path = tmp_path / "trades.jsonl"
    path.write_text("\n".join(lines) + "\n")
    events, dead = read_events(path, schema)
    decoder = SplitDecoder(schema, InputFile(str(path), str(path), EventFormat.JSONL), None,
                           {0: (0, 0, 1)})
    batches = [pa.RecordBatch.from_arrays(
        [pa.array(lines[i:i + batch_lines], pa.string()),
         pa.array(np.zeros(len(lines[i:i + batch_lines]), np.int64))], names=["value", "_block"])
        for i in range(0, len(lines), batch_lines)]
    rows = pa.Table.from_batches(list(decoder(iter(batches)))).to_pylist()
    accepted = [r for r in rows if r["_error"] is None and r["seq"] > r["_prev_max"]]
    assert [(r["seq"], {name: r[name] for name in schema.attributes}) for r in accepted] == \
        [(e.seq, e.attrs) for e in events]
    rejected = [{"source": str(path), "line": r["_line"], "position": r["_position"],
                 "reason": r["_error"] or seq_not_increasing(r["seq"], r["_prev_max"]),
                 "raw": r["_raw"]} for r in rows if r not in accepted]
    assert rejected == [d.to_json() for d in dead]
    assert len(dead) >= len(ODD_LINES) and any("does not increase" in d.reason for d in dead)
