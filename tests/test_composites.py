"""Columnar output of `cep run` (`cep_core.composites`): the numpy order equals sorting the
dicts by `sort_key`, the JSON lines built from columns (whole, or a few composites at a
time taken from their batches) are byte for byte orjson's lines of those dicts, and Parquet
/ Arrow files read back to the same dicts. Over the examples, the engine harness's random
query shapes (SEQ under CDP and automata, timed-out runs, MATCH, WINDOW) and hand-made
ties."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import test_engine_match
import test_engine_seq_timeouts as timeouts
import test_engine_window
from engine_harness import TRADES_EXTRA, new_shapes
from random_seq import random_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_queries, load_query_text
from cep_core.composite import sort_key
from cep_core.composite_batch import ColumnBatch, Decoder, Field, Keys
from cep_core.composites import Composites, read
from cep_core.stream_engines import StreamEngines, run_engines
from cep_core.event_io import read_events

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def examples(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def dict_path(composites: Composites, query_index: dict[str, int]) -> list[dict]:
    """What `cep run` did before: every composite as a dict, sorted by sort_key (stable,
    over the batches in the order the engines gave them)."""
    found = [c for b in composites.batches for c in b.to_dicts()]
    return sorted(found, key=lambda c: sort_key(c, query_index[c["query"]]))


def jsonl(dicts: list[dict]) -> bytes:
    return b"".join(orjson.dumps(c, option=orjson.OPT_APPEND_NEWLINE) for c in dicts)


def assert_columnar_output(composites: Composites, expected: list[dict], tmp: Path) -> None:
    assert composites.to_dicts() == expected
    out = io.BytesIO()
    assert composites.write_jsonl(out) == len(expected)
    assert out.getvalue() == jsonl(expected)
    for chunk_rows in (1, 5):  # composites taken from their batches a few at a time
        out = io.BytesIO()
        assert composites.write_jsonl(out, chunk_rows=chunk_rows) == len(expected)
        assert out.getvalue() == jsonl(expected), chunk_rows
    whole = composites.to_arrow()
    for suffix in (".parquet", ".arrow"):
        for chunk_rows in (65536, 5):
            path = tmp / f"composites{suffix}"
            assert composites.write(path, chunk_rows=chunk_rows) == len(expected)
            assert read(path) == expected, (suffix, chunk_rows)
            written = pq.read_table(path) if suffix == ".parquet" else \
                pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            assert written.schema == whole.schema, (suffix, chunk_rows)
            assert written.schema.metadata == whole.schema.metadata


def jit_composites(queries, stream, batch_size: int) -> Composites:
    strings = StringDictionary()
    return run_engines(StreamEngines(queries, strings), BatchEncoder(queries[0].schema, strings),
                       stream, batch_size)


def check(queries, stream, tmp: Path, batch_size: int = 7) -> Composites:
    stream = list(stream)
    composites = jit_composites(queries, stream, batch_size)
    expected = dict_path(composites, {q.name: q.index for q in queries})
    assert expected == reference.run(queries, stream)
    assert_columnar_output(composites, expected, tmp)
    return composites


# ---------------------------------------------------------------- examples


def _example_cases():
    for path in sorted(EXAMPLES.glob("*.cep")):
        yield pytest.param(load_queries(path), id=path.stem)
    # Collect lists, a NULL (division by zero), a two-attribute key, timed-out runs with
    # a Kleene variable, beside the finance queries.
    text = (EXAMPLES / "finance.cep").read_text() + TRADES_EXTRA
    yield pytest.param(load_query_text(text, path="<extra>"), id="extra")


def _events(queries):
    events, _ = read_events(EXAMPLES / "data" / f"{queries[0].schema.stream}.jsonl",
                            queries[0].schema)
    return events


@pytest.mark.parametrize("queries", list(_example_cases()))
@pytest.mark.parametrize("batch_size", [13, 65536])
def test_examples(queries, batch_size, tmp_path):
    check(queries, _events(queries), tmp_path, batch_size)


@pytest.mark.parametrize("queries", list(_example_cases()))
def test_reference_engine_dicts_write_the_same(queries, tmp_path):
    expected = reference.run(queries, _events(queries))
    assert_columnar_output(Composites.from_dicts(expected), expected, tmp_path)


# ---------------------------------------------------------------- the harness's shapes


@examples(new_shapes(3, 20))
@given(st.integers(0, 2 ** 32 - 1))
def test_random_seq_cdp(tmp_path_factory, seed):
    text, events, _sizes, _restore = random_case(seed)
    check(load_query_text(text), events, tmp_path_factory.mktemp("cdp"))


@examples(new_shapes(3, 20))
@given(st.integers(0, 2 ** 32 - 1),
       st.sampled_from(["skip-till-next-match", "strict-contiguity"]))
def test_random_seq_automata(tmp_path_factory, seed, strategy):
    text, events, _sizes, _restore = random_case(seed, strategy)
    check(load_query_text(text), events, tmp_path_factory.mktemp("aip"))


@examples(12)
@given(st.data())
def test_timed_out_runs(tmp_path_factory, data):
    # every query on abc in one file: their composites interleave by seq and query index
    queries = load_query_text(";\n".join(timeouts.QUERIES[n] for n in sorted(timeouts.QUERIES)))
    check(queries, timeouts._stream(data.draw(timeouts.ROWS)), tmp_path_factory.mktemp("timeouts"),
          data.draw(st.integers(1, 9)))


@examples(new_shapes(3, 10))
@given(st.data())
def test_random_match(tmp_path_factory, data):
    check(test_engine_match.query(data.draw(test_engine_match.match_queries())),
          data.draw(test_engine_match.streams()),
          tmp_path_factory.mktemp("match"), data.draw(st.integers(1, 20)))


@examples(new_shapes(3, 10))
@given(st.data())
def test_random_windows(tmp_path_factory, data):
    texts = [data.draw(test_engine_window.window_queries(name)) for name in ("w1", "w2")]
    check(load_query_text(";\n".join(texts)), data.draw(test_engine_window.tick_streams()),
          tmp_path_factory.mktemp("window"), data.draw(st.integers(1, 25)))


# ---------------------------------------------------------------- hand-made batches


def _batch(query, seq, start_seq, keys, fields=()):
    ids = np.arange(len(seq))
    return ColumnBatch(query, Decoder(STRINGS), Keys(ids, lambda d: [keys[i] for i in d]),
                       np.array(seq, np.int64), np.array(start_seq, np.int64), list(fields))


STRINGS = ['plain', 'quote " and \\ backslash', "tab\tnewline\n", "é ü 漢字 🙂", "\x00\x1f"]


def test_ties_are_broken_by_constituents_then_key_json(tmp_path):
    keys = ["b", "a", None, [1, "x"], 10, 9, "é"]
    first = _batch("m", [5, 5, 5, 5, 5, 5, 5], [1, 1, 1, 1, 0, 0, 2], keys)
    second = _batch("n", [5, 4, 5], [3, 4, 3], ["z", "y", "x"])
    composites = Composites([first, second], {"m": 1, "n": 0})
    assert_columnar_output(composites, dict_path(composites, {"m": 1, "n": 0}), tmp_path)
    assert [c["key"] for c in composites][:3] == ["y", "x", "z"]


def test_seqs_at_the_int64_minimum_still_sort_exactly(tmp_path):
    low = int(np.iinfo(np.int64).min)
    batch = _batch("m", [low, low, 3], [low, low + 1, low], ["k2", "k1", "k0"])
    composites = Composites([batch], {"m": 0})
    assert_columnar_output(composites, dict_path(composites, {"m": 0}), tmp_path)


def test_values_are_orjsons_text(tmp_path):
    floats = [0.0, -0.0, 1.0, 0.1, 1e16, 1e-7, 5e-324, 1.7976931348623157e308,
              123456789012345678.0, -2.5, float("nan"), float("inf"), -float("inf")]
    n = len(floats)
    rng = random.Random(1)
    fields = [
        Field("f", "float", np.array(floats)),
        Field("nullable", "float", np.array(floats), np.array([i % 3 == 0 for i in range(n)])),
        Field("s", "string", np.array([i % len(STRINGS) for i in range(n)])),
        # a NULL string's code is whatever the kernel left (here -1)
        Field("ns", "string", np.array([-1 if i % 2 else i % len(STRINGS)
                                        for i in range(n)]), np.array([i % 2 for i in range(n)])),
        Field("b", "bool", np.array([i % 2 for i in range(n)], np.int8)),
        Field("i", "int", np.array([rng.randint(-2 ** 63, 2 ** 63 - 1) for _ in range(n)])),
        Field("list", "float", np.array(floats[:6]),
              offsets=np.array([0, 2, 2, 6] + [6] * (n - 3))),
    ]
    batch = _batch("q \"quoted\"", list(range(n)), list(range(n)), STRINGS * 3, fields)
    composites = Composites([batch], {'q "quoted"': 0})
    expected = batch.to_dicts()
    out = io.BytesIO()
    composites.write_jsonl(out)
    assert out.getvalue() == jsonl(expected)
    assert b"NaN" not in out.getvalue() and b"null" in out.getvalue()


# ---------------------------------------------------------------- cep run --out


def test_cep_run_out_suffix_chooses_the_format(tmp_path):
    query = EXAMPLES / "rfid.cep"
    events = EXAMPLES / "data" / "rfid.jsonl"
    outputs = {}
    for name in ("out.jsonl", "out.parquet", "out.arrow", "out"):
        done = subprocess.run([sys.executable, "-m", "cep_service.cli.main", "run", str(query),
                               "--events", str(events), "--engine", "jit",
                               "--out", str(tmp_path / name)],
                              capture_output=True, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        outputs[name] = tmp_path / name
    lines = outputs["out.jsonl"].read_bytes()
    assert outputs["out"].read_bytes() == lines
    expected = [orjson.loads(line) for line in lines.splitlines()]
    assert len(expected) > 100
    assert read(outputs["out.parquet"]) == expected
    assert read(outputs["out.arrow"]) == expected
    import pyarrow.parquet as pq

    table = pq.read_table(outputs["out.parquet"])
    assert table.column_names[:5] == ["query", "key", "seq", "start_seq", "events"]
    events = table.schema.field("events").type
    assert events.value_type.names[:3] == ["variable", "seq", "type"]
