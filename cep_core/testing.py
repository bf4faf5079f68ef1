"""Unit-testing queries without a broker: a query text and a few events as dicts in, the
composite events as dicts out (docs/python.md, "Testing queries"; examples/test_my_queries.py).

    from cep_core.testing import run_query, assert_engines_agree

    def test_big_trade():
        found = run_query("QUERY big FROM trades INTO big PATTERN (b) "
                          "DEFINE b AS volume > 1000 EMIT symbol = symbol;", [
            {"symbol": "IBM", "price": 100, "volume": 5000, "ts": 0, "seqNum": 0}])
        assert [c["symbol"] for c in found] == ["IBM"]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cep_core.api import QuerySet, compile

__all__ = ["assert_engines_agree", "run_query"]


def _queries(text: str | QuerySet, schema: Any) -> QuerySet:
    return text if isinstance(text, QuerySet) else compile(text, schema)


def run_query(text: str | QuerySet, events: Iterable[dict], schema: Any = None, *,
              engine: str = "jit", dead_letters: list | None = None) -> list[dict]:
    """The composite events of the queries of `text` over `events`, as dicts in output
    order (what `cep run` writes as JSON lines). `schema` as `cep.compile` takes it (None:
    the built-in streams). An event's `seq` is its index in the list unless it has one.
    Records that are not valid events and events an engine rejected are appended to
    `dead_letters` when given (else they are ignored)."""
    result = _queries(text, schema).run(list(events), engine=engine)
    if dead_letters is not None:
        dead_letters.extend(result.dead_letters)
    return result.to_dicts()


def assert_engines_agree(text: str | QuerySet, events: Iterable[dict], schema: Any = None
                         ) -> list[dict]:
    """Assert that the jitted engine gives exactly the composite events and dead letters of
    the reference interpreter (the oracle) over `events`; returns the composites."""
    queries = _queries(text, schema)
    events = list(events)
    jit = queries.run(events, engine="jit")
    reference = queries.run(events, engine="reference")
    expected, got = reference.to_dicts(), jit.to_dicts()
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b),
                     min(len(expected), len(got)))
        raise AssertionError(
            f"jit gives {len(got)} composite events, the reference {len(expected)}; first "
            f"difference at #{first}:\n  reference: {_at(expected, first)}\n"
            f"  jit:       {_at(got, first)}")
    expected_dead = [d.to_json() for d in reference.dead_letters]
    got_dead = [d.to_json() for d in jit.dead_letters]
    if got_dead != expected_dead:
        raise AssertionError(f"dead letters differ:\n  reference: {expected_dead}\n"
                             f"  jit:       {got_dead}")
    return got


def _at(rows: list[dict], i: int) -> str:
    return repr(rows[i]) if i < len(rows) else "(none)"
