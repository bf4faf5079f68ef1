"""How a user unit-tests their queries with pytest: a few events as dicts in, the composite
events out, no broker (docs/python.md, "Testing queries"). Run: pytest examples/."""

import pytest

from cep_core.testing import assert_engines_agree, run_query

RISE = """
QUERY rise FROM trades INTO rises
PARTITION BY symbol
PATTERN ( a b+ )
DEFINE a AS TRUE, b AS price > Last(price)
EMIT symbol = symbol, gain = Last(price) - First(price), trades = Count();
"""


def trade(symbol: str, price: int, ts: int) -> dict:
    return {"symbol": symbol, "price": price, "volume": 100, "ts": ts, "seqNum": 0}


def test_a_rise_is_found_per_symbol():
    events = [trade("IBM", 100, 1), trade("MSFT", 50, 2), trade("IBM", 101, 3),
              trade("MSFT", 49, 4)]
    found = run_query(RISE, events)
    assert [(c["symbol"], c["gain"], c["trades"]) for c in found] == [("IBM", 1, 2)]


def test_a_fall_is_not_a_rise():
    assert run_query(RISE, [trade("IBM", 100, 1), trade("IBM", 99, 2)]) == []


def test_bad_events_go_to_dead_letters():
    dead: list = []
    found = run_query(RISE, [trade("IBM", 100, 1), {"symbol": "IBM", "price": "high"},
                             trade("IBM", 102, 3)], dead_letters=dead)
    assert [c["gain"] for c in found] == [2]
    assert [d.reason for d in dead] == ["attribute 'price': expected int, got a string ('high')"]


@pytest.mark.parametrize("prices", [[1, 2, 3, 2, 5], [5, 4, 3], [7, 7, 8, 9, 1, 2]])
def test_the_jit_engine_agrees_with_the_reference(prices):
    events = [trade("IBM", p, t) for t, p in enumerate(prices)]
    assert_engines_agree(RISE, events)


def test_my_own_stream():
    schema = {"stream": "sensors_of_mine", "attributes": {"room": "string", "temp": "float",
                                                          "at": "int"}, "time": "at"}
    hot = """QUERY hot FROM sensors_of_mine PARTITION BY room
             PATTERN ( h h ) DEFINE h AS temp > 30.0 EMIT room = room, peak = Max(temp);"""
    events = [{"room": "lab", "temp": t, "at": i} for i, t in enumerate([31.0, 35.5, 20.0])]
    assert [c["peak"] for c in run_query(hot, events, schema)] == [35.5]
