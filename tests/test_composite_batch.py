"""Composite events as columns (`cep_core.composite_batch`): `process_columns` gives the
reference's events, and `to_arrow()` holds the same events as `to_dicts()`."""

from pathlib import Path

import orjson
import pytest

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.composite_batch import ColumnBatch, to_dicts
from cep_core.stream_engines import StreamEngines
from cep_core.event_io import read_events
from engine_harness import TRADES_EXTRA

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _cases():
    for name in ("finance", "rfid", "stocks", "fire", "auction", "r4", "marathon", "ticks"):
        yield name, load_queries(EXAMPLES / f"{name}.cep")
    # Collect lists, a NULL (division by zero), a two-attribute key, timed-out SEQ runs.
    text = (EXAMPLES / "finance.cep").read_text() + TRADES_EXTRA
    yield "extra", [q for q in load_query_text(text, path="<extra>")
                    if q.name in ("collected", "stuck")]


def _stream(queries):
    stream = queries[0].schema.stream
    events, dead = read_events(EXAMPLES / "data" / f"{stream}.jsonl", queries[0].schema)
    assert not dead
    return events


def _run_columns(queries, events, size=97):
    strings = StringDictionary()
    encoder = BatchEncoder(queries[0].schema, strings)
    engines = StreamEngines(queries, strings)
    batches, tail = [], []
    for start in range(0, len(events), size):
        batches += engines.process_columns(encoder.from_events(events[start:start + size]))
    tail += engines.flush()
    return engines, batches, tail


def _arrow_row(composite: dict) -> dict:
    """A dict composite as `to_arrow` represents it (key as JSON text, bound events as
    {variable, seq, attributes} structs)."""
    row = dict(composite)
    row["key"] = orjson.dumps(composite["key"]).decode()
    if "events" in composite:
        elements = []
        for var, bound in composite["events"].items():
            for event in bound if isinstance(bound, list) else [bound]:
                elements.append({"variable": var, **event})
        row["events"] = sorted(elements, key=lambda e: (e["seq"], e["variable"]))
    return row


@pytest.mark.parametrize("name,queries", list(_cases()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_columns_equal_reference_and_arrow_equals_dicts(name, queries):
    events = _stream(queries)
    engines, batches, tail = _run_columns(queries, events)
    expected = reference.run(queries, events)
    assert expected, f"{name}: the example finds nothing"
    assert engines.order(to_dicts(batches) + tail) == expected
    columnar = [b for b in batches if isinstance(b, ColumnBatch)]
    if any(q.query.kind != "window" for q in queries):
        assert columnar, f"{name}: no engine returned columns"
    for batch in batches:
        dicts = batch.to_dicts()
        rows = batch.to_arrow().to_pylist()
        assert len(rows) == len(dicts) == len(batch)
        for row, composite in zip(rows, dicts):
            want = _arrow_row(composite)
            if "events" in row:
                row["events"] = sorted(row["events"], key=lambda e: (e["seq"], e["variable"]))
            assert row == want
