"""Shared harness for differential tests: the jitted engine against the reference.

`jit_run` feeds a stream to engines in batches of the given sizes and, optionally, at a
given event count snapshots every engine, throws it away and continues with engines
restored from the bytes (as a restarted worker would).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from cep_core import reference
from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.composite import sort_key
from cep_core.checker import load_queries
from cep_core.engine_factory import create_engine
from cep_core.stream_engines import compact_strings
from cep_core.events import Event, Punctuation


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Each new query shape compiles its own kernels (seconds each into an empty cache). `make
# test` draws a few per differential test; `make test-full` (CEP_TEST_FULL=1) draws many.
FULL = os.environ.get("CEP_TEST_FULL") == "1"


# Beside examples/finance.cep: Collect lists, a NULL (division by zero), a two-attribute key,
# SEQ runs that time out with a Kleene variable.
TRADES_EXTRA = """
QUERY collected FROM trades PARTITION BY symbol, volume
PATTERN ( . up+ )
DEFINE up AS price >= Last(price)
EMIT prices = Collect(price), names = Collect(symbol), ratio = Last(price) / (Count() - 2);

QUERY stuck FROM trades PARTITION BY symbol
PATTERN SEQ(ANY a, ANY+ b, ANY c)
WHERE a.volume > 300 AND b.price > a.price AND c.price < a.price
WITHIN 5 seconds USING skip-till-next-match
ON TIMEOUT EMIT PARTIAL;
"""


def new_shapes(quick: int, full: int) -> int:
    """How many random queries a differential test draws in this run."""
    return full if FULL else quick


def example_queries(kind: str) -> list:
    """pytest params (path, query name) of every `kind` query of examples/*.cep."""
    return [pytest.param(path, q.name, id=f"{path.stem}:{q.name}")
            for path in sorted(EXAMPLES.glob("*.cep")) for q in load_queries(path)
            if q.query.kind == kind]


def jit_run(queries, stream, sizes=(7,), restore_at: int | None = None,
            factory=create_engine, compact: bool = False, **options):
    """`factory(checked, strings, **options)` makes each engine (default: create_engine).
    `compact`: drop every string the engines no longer hold after each batch."""
    strings = StringDictionary()
    encoder = BatchEncoder(queries[0].schema, strings)
    engines = [factory(q, strings, **options) for q in queries]
    found = []
    items = list(stream)
    position, sizes_cycle, consumed = 0, itertools.cycle(sizes), 0

    def collect(q, out):
        found.extend((sort_key(c, q.index), c) for c in out)

    while position < len(items):
        item = items[position]
        if isinstance(item, Punctuation):
            for q, engine in zip(queries, engines):
                collect(q, engine.punctuate(item.ts))
            position += 1
            continue
        size = next(sizes_cycle)
        chunk = []
        while position < len(items) and len(chunk) < size and \
                isinstance(items[position], Event):
            chunk.append(items[position])
            position += 1
        batch = encoder.from_events(chunk)
        for q, engine in zip(queries, engines):
            collect(q, engine.process(batch))
        consumed += len(chunk)
        if compact:
            compact_strings(engines, strings, slack=1.0, minimum=0)
        if restore_at is not None and consumed >= restore_at:
            restore_at = None
            snapshots = [engine.snapshot() for engine in engines]
            strings = StringDictionary()
            encoder = BatchEncoder(queries[0].schema, strings)
            engines = [factory(q, strings, **options) for q in queries]
            for engine, data in zip(engines, snapshots):
                engine.restore(data)
    for q, engine in zip(queries, engines):
        collect(q, engine.flush())
    found.sort(key=lambda pair: pair[0])
    dead = sorted((q.name, seq, reason) for q, engine in zip(queries, engines)
                  for seq, reason in engine.dead_letters)
    return [c for _, c in found], dead


def reference_run(queries, stream):
    rejected = []
    out = reference.run(queries, list(stream), rejected=rejected)
    return out, sorted((q.name, e.seq, reason) for q, e, reason in rejected)


def assert_same(queries, stream, sizes=(7,), restore_at=None, factory=create_engine,
                **options):
    """The engine's composite events and rejected events equal the reference's."""
    stream = list(stream)
    expected, expected_dead = reference_run(queries, stream)
    got, got_dead = jit_run(queries, stream, sizes, restore_at, factory, **options)
    assert got == expected, _diff(expected, got)
    assert got_dead == expected_dead
    return got


def _diff(expected, got) -> str:
    for i, (e, g) in enumerate(zip(expected, got)):
        if e != g:
            return f"first difference at #{i}:\n reference {e}\n jit       {g}"
    return f"reference gives {len(expected)} composite events, jit {len(got)}"
