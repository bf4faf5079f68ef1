"""Spec fixtures for the SEQ reference interpreter (the SEQ part of docs/semantics.md).
Every expected result is worked out by hand in a comment.

Shapes are (seq, constituent seqs): `seq` is the largest seq of the bound positive events;
the constituent seqs list the bound events in step order (a Kleene variable flattened).
Times are written in minutes (`MIN` ms each) unless said otherwise.
"""

from __future__ import annotations

from cep_core.checker import load_query_text
from cep_core.composite import constituent_seqs
from cep_core.events import Event, Punctuation
from cep_core.reference import run
from cep_core.reference.seq import SeqInterpreter

MIN = 60_000


def events(rows: list[dict]) -> list[Event]:
    """Events from dicts; seq by position, ts from the "ts" attribute."""
    return [Event(i, row["ts"], row) for i, row in enumerate(rows)]


def query(text: str):
    return load_query_text(text)


def shapes(out: list[dict]) -> list[tuple[int, list[int]]]:
    return [(c["seq"], constituent_seqs(c)) for c in out]


def run_text(text: str, rows: list[dict]) -> list[dict]:
    return run(query(text), events(rows))


def stock(ticker: str, minute: int, open_: float) -> dict:
    return {"ticker": ticker, "ts": minute * MIN, "open": float(open_), "peak": 0.0,
            "low": 0.0, "close": 0.0, "volume": 1}


def rfid(kind: str, item: int, minute: int) -> dict:
    return {"type": kind, "item": item, "ts": minute * MIN}


def sensor(kind: str, area: str, value: float, minute: int) -> dict:
    return {"kind": kind, "area": area, "value": float(value), "ts": minute * MIN}


def abc(kind: str, minute: int, p: int = 0, v: int = 0) -> dict:
    return {"type": kind, "p": p, "v": v, "ts": minute * MIN}


# ---------------------------------------------------------------- HYPERSONIC stocks

STOCKS = """QUERY s1 FROM stocks PATTERN SEQ(AAPL a, AMZN b, AVID c)
WHERE a.open > b.open AND b.open > c.open WITHIN 5 minutes"""


# Deliberately like test_rfid_negation_between below and the other worked examples: each
# spells out its rows and why each match is expected, as the papers' examples do
def test_hypersonic_stocks():
    rows = [stock("AAPL", 0, 10),  # 0
            stock("AMZN", 1, 9),  # 1
            stock("AAPL", 2, 12),  # 2
            stock("AVID", 3, 8),  # 3
            stock("AMZN", 4, 7),  # 4
            stock("AVID", 6, 5),  # 5
            stock("AVID", 9, 1)]  # 6
    # seq 3 (AVID@3, open 8): b in {AMZN@1 (9)}; a before b: AAPL@0 (10): 10 > 9 > 8. One.
    #   (AAPL@2 is after b.)
    # seq 5 (AVID@6, open 5): the window needs ts >= 1. b = AMZN@1: a before it is AAPL@0,
    #   out of the window (6 - 0 > 5). b = AMZN@4 (7): a = AAPL@2 (12): 12 > 7 > 5. One.
    # seq 6 (AVID@9): ts >= 4: b = AMZN@4, but no AAPL between ts 4 and seq 4. None.
    out = run_text(STOCKS, rows)
    assert shapes(out) == [(3, [0, 1, 3]), (5, [2, 4, 5])]
    assert out[0] == {
        "query": "s1", "key": None, "seq": 3, "start_seq": 0,
        "events": {"a": {"seq": 0, **rows[0]}, "b": {"seq": 1, **rows[1]},
                   "c": {"seq": 3, **rows[3]}},
    }
    assert list(out[0]["events"]) == ["a", "b", "c"]


def test_hypersonic_stocks_order_by_ts_minute_bars():
    # Minute bars: the three tickers of one minute arrive in arbitrary order.
    rows = [stock("AVID", 1, 5),  # 0
            stock("AMZN", 1, 7),  # 1
            stock("AAPL", 1, 12),  # 2
            stock("AMZN", 2, 6),  # 3
            stock("AVID", 2, 4)]  # 4
    # Stream order: the only a < b < c in seq is AAPL 2, AMZN 3, AVID 4: 12 > 6 > 4.
    assert shapes(run_text(STOCKS, rows)) == [(4, [2, 3, 4])]
    # ORDER BY ts: consecutive steps need ts(a) <= ts(b) <= ts(c), any seq order; a match is
    # found when its largest-seq event arrives.
    # seq 0, 1: no AAPL yet.
    # seq 2 (AAPL@1, 12): c = AVID@1 (seq 0, 5), b = AMZN@1 (seq 1, 7): 12 > 7 > 5. One.
    # seq 3 (AMZN@2): it must be bound, as b; then c needs ts >= 2: no AVID@2 yet. None.
    # seq 4 (AVID@2, 4): c = seq 4; b in {AMZN@1 (7), AMZN@2 (6)}; a = AAPL@1 (12) for both
    #   (ts 1 <= b.ts): 12 > 7 > 4 and 12 > 6 > 4. Two.
    out = run_text(STOCKS + " ORDER BY ts", rows)
    assert shapes(out) == [(2, [2, 1, 0]), (4, [2, 1, 4]), (4, [2, 3, 4])]
    assert out[0]["start_seq"] == 0 and out[0]["seq"] == 2


# ---------------------------------------------------------------- RFID

def test_rfid_order_receive_dispatch():
    text = """QUERY r1 FROM rfid PATTERN SEQ(O o, R r, D d)
    WHERE o.item = r.item AND r.item = d.item WITHIN 1 hour"""
    rows = [rfid("O", 1, 0),  # 0
            rfid("O", 2, 5),  # 1
            rfid("R", 1, 10),  # 2
            rfid("R", 2, 15),  # 3
            rfid("D", 2, 20),  # 4
            rfid("D", 1, 30),  # 5
            rfid("O", 1, 40),  # 6
            rfid("R", 1, 50),  # 7
            rfid("D", 1, 110)]  # 8
    # seq 4 (D item 2): o = O2@5 (seq 1), r = R2@15 (seq 3).
    # seq 5 (D item 1): o = O1@0 (seq 0), r = R1@10 (seq 2). (O1@40 comes after.)
    # seq 8 (D item 1 @110): the window needs ts >= 50: R1@50 but no O1 in [50, 50]. None.
    assert shapes(run_text(text, rows)) == [(4, [1, 3, 4]), (5, [0, 2, 5])]
    # Partitioned by item: the same matches, keyed by the item.
    out = run_text(text.replace("FROM rfid", "FROM rfid PARTITION BY item"), rows)
    assert [(c["key"], c["seq"], constituent_seqs(c)) for c in out] == \
        [(2, 4, [1, 3, 4]), (1, 5, [0, 2, 5])]


# Deliberately like test_hypersonic_stocks above: a worked example spelled out
def test_rfid_negation_between():
    text = """QUERY s2 FROM rfid PATTERN SEQ(O o, NOT(C c), D d)
    WHERE o.item = c.item AND o.item = d.item WITHIN 1 hour"""
    rows = [rfid("O", 1, 0),  # 0
            rfid("O", 2, 1),  # 1
            rfid("C", 1, 2),  # 2
            rfid("C", 3, 3),  # 3
            rfid("D", 1, 4),  # 4
            rfid("D", 2, 5),  # 5
            rfid("O", 1, 6),  # 6
            rfid("D", 1, 7)]  # 7
    # seq 4 (D1): o = O1 seq 0; C1 (seq 2) lies between seq 0 and 4 -> cancelled.
    # seq 5 (D2): o = O2 seq 1; between 1 and 5: C1, C3, neither of item 2 -> match.
    # seq 7 (D1): o = seq 0: C1 at seq 2 cancels; o = seq 6: nothing between 6 and 7 -> match.
    out = run_text(text, rows)
    assert shapes(out) == [(5, [1, 5]), (7, [6, 7])]
    assert list(out[0]["events"]) == ["o", "d"]  # negated variables are not included


def test_rfid_negation_at_start():
    text = """QUERY s4 FROM rfid PATTERN SEQ(NOT(C c), O o, D d)
    WHERE c.item = o.item AND o.item = d.item WITHIN 10 minutes"""
    rows = [rfid("C", 1, 0),  # 0
            rfid("O", 1, 5),  # 1
            rfid("D", 1, 10),  # 2
            rfid("D", 1, 11),  # 3
            rfid("C", 2, 12),  # 4
            rfid("O", 1, 13),  # 5
            rfid("D", 1, 14)]  # 6
    # A cancelling C lies before o (smaller seq) with ts >= last.ts - W.
    # seq 2 (D@10): o = O@5: region ts >= 10 - 10 = 0: C1@0 is in it (inclusive) -> cancelled.
    # seq 3 (D@11): o = O@5: region ts >= 1: C1@0 is not -> match.
    # seq 6 (D@14): o = O@5 (14 - 5 <= 10): region ts >= 4, seq < 1: nothing -> match;
    #   o = O@13: region ts >= 4, seq < 5: C2@12 has another item -> match.
    assert shapes(run_text(text, rows)) == [(3, [1, 3]), (6, [1, 6]), (6, [5, 6])]


def test_rfid_negation_at_end_waits_for_event_time():
    text = """QUERY s5 FROM rfid PATTERN SEQ(O o, D d, NOT(C c))
    WHERE o.item = d.item AND c.item = o.item WITHIN 10 minutes"""
    rows = [rfid("O", 1, 0),  # 0
            rfid("D", 1, 3),  # 1  (o0, d1) waits until event time passes 0 + 10
            rfid("O", 2, 4),  # 2
            rfid("D", 2, 6),  # 3  (o2, d3) waits until event time passes 4 + 10
            rfid("C", 1, 10),  # 4  exactly first.ts + W: cancels (o0, d1)
            rfid("R", 9, 11),  # 5  time 11 > 10: (o0, d1) decided: cancelled, nothing out
            rfid("C", 2, 15),  # 6  time 15 > 14: (o2, d3) released; C2@15 is too late
            rfid("O", 3, 20),  # 7
            rfid("D", 3, 21)]  # 8  (o7, d8) waits until time passes 30: end of stream
    evs = events(rows)
    [q] = query(text)

    interp = SeqInterpreter(q)
    released = [shapes(interp.process(e)) for e in evs]
    assert released == [[], [], [], [], [], [], [(3, [2, 3])], [], []]
    assert shapes(interp.flush()) == [(8, [7, 8])]
    assert interp.flush() == []

    # A punctuation releases it too, once it passes first.ts + W = 30 minutes.
    interp = SeqInterpreter(q)
    for e in evs:
        interp.process(e)
    assert interp.punctuate(30 * MIN) == []
    assert shapes(interp.punctuate(30 * MIN + 1)) == [(8, [7, 8])]

    assert shapes(run(query(text), evs)) == [(3, [2, 3]), (8, [7, 8])]
    assert shapes(run(query(text), evs, flush=False)) == [(3, [2, 3])]
    stream = evs + [Punctuation(31 * MIN)]
    assert shapes(run(query(text), stream, flush=False)) == [(3, [2, 3]), (8, [7, 8])]


def test_rfid_negation_order_by_ts_counts_ties_as_inside():
    text = """QUERY s6 FROM rfid PATTERN SEQ(O o, NOT(C c), D d)
    WHERE o.item = c.item AND o.item = d.item WITHIN 1 hour"""
    rows = [rfid("O", 1, 0),  # 0
            rfid("D", 1, 5),  # 1
            rfid("C", 1, 5),  # 2  same time as D1, arrives after it
            rfid("O", 2, 6),  # 3
            rfid("C", 2, 6),  # 4  same time as O2
            rfid("D", 2, 7),  # 5
            rfid("O", 3, 8),  # 6
            rfid("D", 3, 9)]  # 7
    # Stream order: (0, 1): nothing between seq 0 and 1 -> match. (3, 5): C2 at seq 4 is
    #   between -> cancelled. (6, 7) -> match.
    assert shapes(run_text(text, rows)) == [(1, [0, 1]), (7, [6, 7])]
    # ORDER BY ts: a C with ts in [o.ts, d.ts] (inclusive, not a bound event) cancels.
    # (0, 1): C1@5 lies in [0, 5] -> cancelled (the match waits until time passes 5, since
    #   an event with ts 5 could still come: C1 does). (3, 5): C2@6 in [6, 7] -> cancelled.
    # (6, 7): nothing in [8, 9] -> match, released at the end of the stream.
    assert shapes(run_text(text + " ORDER BY ts", rows)) == [(7, [6, 7])]


# ---------------------------------------------------------------- RFID Kleene

KLEENE_ROWS = [rfid("O", 1, 0),  # 0
               rfid("O", 2, 1),  # 1
               rfid("O", 3, 2),  # 2
               rfid("O", 4, 3),  # 3
               rfid("R", 9, 4),  # 4
               rfid("D", 9, 5)]  # 5


def test_rfid_kleene_every_subset():
    text = "QUERY k1 FROM rfid PATTERN SEQ(O o, KLEENE(O dup), R r, D d) WITHIN 1 hour"
    # At D (seq 5), r = R (seq 4); o is an O and dup a non-empty subset, in order, of the O's
    # after o: o = O0: 2^3 - 1 = 7 subsets of {1, 2, 3}; o = O1: 3 of {2, 3}; o = O2: 1 ({3});
    # o = O3: none. 7 + 3 + 1 = 11.
    out = run_text(text, KLEENE_ROWS)
    # (Output order compares the constituent lists lexicographically.)
    assert shapes(out) == [
        (5, [0, 1, 2, 3, 4, 5]), (5, [0, 1, 2, 4, 5]), (5, [0, 1, 3, 4, 5]), (5, [0, 1, 4, 5]),
        (5, [0, 2, 3, 4, 5]), (5, [0, 2, 4, 5]), (5, [0, 3, 4, 5]),
        (5, [1, 2, 3, 4, 5]), (5, [1, 2, 4, 5]), (5, [1, 3, 4, 5]),
        (5, [2, 3, 4, 5]),
    ]
    assert out[0]["events"]["dup"] == [{"seq": i, **KLEENE_ROWS[i]} for i in (1, 2, 3)]
    assert out[3]["events"]["dup"] == [{"seq": 1, **KLEENE_ROWS[1]}]
    assert out[0]["start_seq"] == 0


def test_rfid_kleene_bounds():
    text = """QUERY k2 FROM rfid PATTERN SEQ(O o, KLEENE(O dup){2,3}, R r, D d)
    WITHIN 1 hour"""
    # Subsets of 2 or 3 elements: o = O0: C(3,2) + C(3,3) = 4; o = O1: {2, 3}; o = O2: none.
    assert shapes(run_text(text, KLEENE_ROWS)) == [
        (5, [0, 1, 2, 3, 4, 5]), (5, [0, 1, 2, 4, 5]), (5, [0, 1, 3, 4, 5]),
        (5, [0, 2, 3, 4, 5]), (5, [1, 2, 3, 4, 5]),
    ]
    exact = text.replace("{2,3}", "{3}")  # exactly 3: only o = O0, dup = {1, 2, 3}
    assert shapes(run_text(exact, KLEENE_ROWS)) == [(5, [0, 1, 2, 3, 4, 5])]


def test_rfid_kleene_aggregates_in_where_and_emit():
    text = """QUERY k3 FROM rfid PATTERN SEQ(O o, KLEENE(O dup), R r, D d)
    WHERE count(dup) = 2 WITHIN 1 hour
    EMIT n = count(dup), total = sum(dup.item), mean = avg(dup.item), top = max(dup.item)"""
    # Two-element subsets (items are 1..4 for O0..O3): o = O0: {1,2} items 2+3 = 5,
    # {1,3} 2+4 = 6, {2,3} 3+4 = 7; o = O1: {2,3} 3+4 = 7.
    out = run_text(text, KLEENE_ROWS)
    assert [(constituent_seqs(c), c["n"], c["total"], c["mean"], c["top"]) for c in out] == [
        ([0, 1, 2, 4, 5], 2, 5, 2.5, 3), ([0, 1, 3, 4, 5], 2, 6, 3.0, 4),
        ([0, 2, 3, 4, 5], 2, 7, 3.5, 4), ([1, 2, 3, 4, 5], 2, 7, 3.5, 4),
    ]
    assert list(out[0]) == ["query", "key", "seq", "start_seq", "events",
                            "n", "total", "mean", "top"]
    # A condition on dup without an aggregate holds for every element: dup.item != 3 removes
    # O2 (item 3) from every set. o = O0: subsets of {1, 3}: 3; o = O1: {3}; o = O2: {3}.
    per_element = text.replace("count(dup) = 2", "dup.item != 3")
    assert shapes(run_text(per_element, KLEENE_ROWS)) == [
        (5, [0, 1, 3, 4, 5]), (5, [0, 1, 4, 5]), (5, [0, 3, 4, 5]),
        (5, [1, 3, 4, 5]), (5, [2, 3, 4, 5]),
    ]


# ---------------------------------------------------------------- TESLA (Cugola & Margara)

TESLA_ROWS = [sensor("Temp", "a", 50, 0),  # 0  T1
              sensor("Temp", "b", 70, 1),  # 1  Tb, another area
              sensor("Temp", "a", 48, 2),  # 2  T2
              sensor("Smoke", "a", 0, 3),  # 3  S1
              sensor("Temp", "a", 60, 6),  # 4  T4
              sensor("Temp", "a", 40, 6),  # 5  T3, too cold
              sensor("Smoke", "a", 0, 7),  # 6  S2
              sensor("Smoke", "a", 0, 12)]  # 7  S3

FIRE = """QUERY fire FROM sensors DETECT Smoke s, {policy} Temp t WITHIN 5 min FROM s
WHERE t.area = s.area AND t.value > 45 EMIT area = s.area, measuredTemp = t.value"""


def test_tesla_fire_each_last_first():
    # Qualifying t for a smoke s: a Temp before s, with s.ts - 5 <= t.ts, area a, value > 45.
    # S1@3 (seq 3): ts >= -2: T1 (50), T2 (48); Tb is area b.
    # S2@7 (seq 6): ts >= 2: T2@2 (48; the boundary is inclusive), T4 (60); T1@0 is too
    #   old, T3 (40) too cold although it is the latest Temp.
    # S3@12 (seq 7): ts >= 7: no Temp.
    def fire(policy):
        out = run_text(FIRE.format(policy=policy), TESLA_ROWS)
        return [(c["seq"], constituent_seqs(c), c["measuredTemp"]) for c in out]

    # EACH: every qualifying t.
    assert fire("EACH") == [(3, [0, 3], 50.0), (3, [2, 3], 48.0),
                            (6, [2, 6], 48.0), (6, [4, 6], 60.0)]
    # LAST: the qualifying t with the largest seq (T4 at S2, not the colder T3 after it).
    assert fire("LAST") == [(3, [2, 3], 48.0), (6, [4, 6], 60.0)]
    # FIRST: the smallest seq.
    assert fire("FIRST") == [(3, [0, 3], 50.0), (6, [2, 6], 48.0)]

    out = run_text(FIRE.format(policy="LAST"), TESLA_ROWS)
    assert out[0] == {"query": "fire", "key": None, "seq": 3, "start_seq": 2,
                      "events": {"t": {"seq": 2, **TESLA_ROWS[2]},
                                 "s": {"seq": 3, **TESLA_ROWS[3]}},
                      "area": "a", "measuredTemp": 48.0}


def test_tesla_fire_average():
    text = """QUERY f3 FROM sensors
    DETECT Smoke s WHERE 45 < avg(Temp(area = s.area).value WITHIN 5 min FROM s)
    EMIT area = s.area, avgTemp = avg(Temp(area = s.area).value WITHIN 5 min FROM s)"""
    rows = [sensor("Temp", "a", 40, 0),  # 0
            sensor("Temp", "a", 50, 2),  # 1
            sensor("Temp", "b", 90, 3),  # 2
            sensor("Smoke", "a", 0, 4),  # 3
            sensor("Temp", "a", 60, 6),  # 4
            sensor("Smoke", "a", 0, 7),  # 5
            sensor("Smoke", "b", 0, 8),  # 6
            sensor("Smoke", "a", 0, 20)]  # 7
    # seq 3 (Smoke a @4): Temps of area a before it with ts >= -1: 40, 50: avg 45, not > 45.
    # seq 5 (Smoke a @7): ts >= 2: 50 (@2, inclusive), 60: avg 55 -> fire.
    # seq 6 (Smoke b @8): ts >= 3: 90 -> fire.
    # seq 7 (Smoke a @20): ts >= 15: no Temp, avg None, the comparison is false.
    out = run_text(text, rows)
    assert [(c["seq"], constituent_seqs(c), c["area"], c["avgTemp"]) for c in out] == \
        [(5, [5], "a", 55.0), (6, [6], "b", 90.0)]


R4 = """QUERY r4 FROM abc DETECT C c, EACH B b(v > 10) WITHIN 8 min FROM c,
{policy} A a WITHIN 3 min FROM b WHERE a.p = b.p = c.p"""

R4_ROWS = [abc("A", 2, p=3),  # 0  A1
           abc("B", 5, p=3, v=20),  # 1  B1
           abc("A", 6, p=1),  # 2  A2
           abc("B", 8, p=3, v=25),  # 3  B2
           abc("A", 9, p=3),  # 4  A3
           abc("B", 9, p=2, v=30),  # 5  B3
           abc("B", 10, p=3, v=5),  # 6  B4
           abc("A", 11, p=3),  # 7  A4
           abc("B", 12, p=3, v=15),  # 8  B5
           abc("A", 13, p=3),  # 9  A5
           abc("C", 15, p=3),  # 10 C1
           abc("C", 16, p=2)]  # 11 C2


def test_tesla_r4_columns():
    # Columns:  A: A1(p3)@2  A2(p1)@6  A3(p3)@9  A4(p3)@11  A5(p3)@13
    #           B: B1(p3,v20)@5  B2(p3,v25)@8  B3(p2,v30)@9  B4(p3,v5)@10  B5(p3,v15)@12
    #           C: C1(p3)@15  C2(p2)@16
    # C1 (p=3, @15): EACH b: B before C1, v > 10, ts >= 15 - 8 = 7, b.p = 3:
    #   B1@5 too old; B2@8 yes; B3 has p=2; B4 has v=5; B5@12 yes.
    #   b = B2@8: a is an A before B2 with ts >= 5 and p = 3: A2 has p=1, A1@2 too old: none.
    #   b = B5@12: A before B5 with ts >= 9, p = 3: A3@9, A4@11 (A5@13 is after B5);
    #     LAST takes A4 (seq 7).
    #   -> exactly one composite event: a = A4, b = B5, c = C1.
    # C2 (p=2, @16): b: ts >= 8, v > 10, p = 2: B3@9; a: A before B3 with ts >= 6, p = 2: none.
    out = run_text(R4.format(policy="LAST"), R4_ROWS)
    assert shapes(out) == [(10, [7, 8, 10])]
    assert out[0]["start_seq"] == 7 and list(out[0]["events"]) == ["a", "b", "c"]
    # With EACH A instead, b = B5 pairs with both A3 and A4.
    assert shapes(run_text(R4.format(policy="EACH"), R4_ROWS)) == \
        [(10, [4, 8, 10]), (10, [7, 8, 10])]
    # FIRST A: A3.
    assert shapes(run_text(R4.format(policy="FIRST"), R4_ROWS)) == [(10, [4, 8, 10])]


# ---------------------------------------------------------------- windows, AND, strategies

def test_window_boundary_is_inclusive():
    text = "QUERY w FROM abc PATTERN SEQ(A a, B b) WITHIN 10 minutes"
    rows = [{"type": "A", "p": 0, "v": 0, "ts": 0},  # 0
            {"type": "B", "p": 0, "v": 0, "ts": 10 * MIN},  # 1  10 min after A0: == W
            {"type": "A", "p": 0, "v": 0, "ts": 20 * MIN},  # 2
            {"type": "B", "p": 0, "v": 0, "ts": 30 * MIN + 1}]  # 3  W + 1 ms after A2
    # seq 1: 10 min - 0 == W -> match. seq 3: (30 min + 1 ms) - 20 min = W + 1 -> no; A0 is
    # older still.
    assert shapes(run_text(text, rows)) == [(1, [0, 1])]


def test_and_group_in_the_middle_either_order():
    text = """QUERY g FROM rfid PARTITION BY item PATTERN SEQ(O o, AND(R r, C c), D d)
    WITHIN 1 hour"""
    rows = [rfid("O", 1, 0), rfid("R", 1, 1), rfid("C", 1, 2), rfid("D", 1, 3),  # 0-3
            rfid("O", 2, 4), rfid("C", 2, 5), rfid("R", 2, 6), rfid("D", 2, 7),  # 4-7
            rfid("O", 3, 8), rfid("R", 3, 9), rfid("D", 3, 10), rfid("C", 3, 11),  # 8-11
            rfid("O", 4, 12), rfid("R", 4, 13), rfid("C", 4, 14), rfid("R", 4, 15),  # 12-15
            rfid("D", 4, 16)]  # 16
    # item 1: O R C D -> o0 r1 c2 d3. item 2: O C R D (the other order) -> o4 r6 c5 d7.
    # item 3: O R D C: C comes after D -> nothing.
    # item 4: O R C R D: r in {13, 15}, c = 14, both between o and d -> two matches.
    out = run_text(text, rows)
    assert [(c["key"], c["seq"], c["start_seq"], constituent_seqs(c)) for c in out] == [
        (1, 3, 0, [0, 1, 2, 3]), (2, 7, 4, [4, 6, 5, 7]),
        (4, 16, 12, [12, 13, 14, 16]), (4, 16, 12, [12, 15, 14, 16]),
    ]
    assert list(out[1]["events"]) == ["o", "r", "c", "d"]


def test_and_group_at_the_end_releases_on_its_last_member():
    text = "QUERY g2 FROM abc PATTERN SEQ(A a, AND(B b, C c)) WITHIN 1 hour"
    rows = [abc("A", 0), abc("C", 1), abc("B", 2), abc("B", 3)]
    # seq 2 (B): a = A0, c = C1, b = B2 (C before B is fine) -> match.
    # seq 3 (B): a = A0, c = C1, b = B3 -> match.
    assert shapes(run_text(text, rows)) == [(2, [0, 2, 1]), (3, [0, 3, 1])]


STRATEGY_ROWS = [abc("A", 0),  # 0  A1
                 abc("A", 1),  # 1  A2
                 abc("C", 2),  # 2  C
                 abc("B", 3),  # 3  B1
                 abc("B", 4),  # 4  B2
                 abc("A", 5),  # 5  A3
                 abc("B", 6)]  # 6  B3


def test_strategies_on_a_small_stream():
    text = "QUERY st FROM abc PATTERN SEQ(A a, B b){using}"
    # skip-till-any-match: every A before every B:
    #   B1: A1, A2; B2: A1, A2; B3: A1, A2, A3 -> 7.
    assert shapes(run_text(text.format(using=""), STRATEGY_ROWS)) == [
        (3, [0, 3]), (3, [1, 3]), (4, [0, 4]), (4, [1, 4]),
        (6, [0, 6]), (6, [1, 6]), (6, [5, 6])]
    # skip-till-next-match: A1 starts run 1; A2 is ignored by it and starts run 2; C is
    #   ignored; B1 completes both runs. B2: no run left. A3 starts run 3, B3 completes it.
    assert shapes(run_text(text.format(using=" USING skip-till-next-match"),
                           STRATEGY_ROWS)) == [(3, [0, 3]), (3, [1, 3]), (6, [5, 6])]
    # strict-contiguity: A2 kills run 1 (not a B) and starts run 2; C kills run 2; B1, B2
    #   start nothing. A3 starts run 3, B3 follows it directly -> one match.
    assert shapes(run_text(text.format(using=" USING strict-contiguity"),
                           STRATEGY_ROWS)) == [(6, [5, 6])]


def test_strategies_with_kleene():
    text = "QUERY sk FROM abc PATTERN SEQ(A a, B+ b, C c){using}"
    rows = [abc("A", 0),  # 0  A1
            abc("B", 1),  # 1  B1
            abc("A", 2),  # 2  A2
            abc("B", 3),  # 3  B2
            abc("B", 4),  # 4  B3
            abc("C", 5)]  # 5  C1
    # any-match: a = A1: b any non-empty subset of {B1, B2, B3}: 7; a = A2: of {B2, B3}: 3.
    assert len(run_text(text.format(using=""), rows)) == 10
    # skip-till-next-match: run 1 (A1) takes B1; A2 is ignored by it (neither a B nor the
    #   next step's C) and starts run 2; B2, B3 go to both Kleene steps; C1 ends both.
    assert shapes(run_text(text.format(using=" USING skip-till-next-match"), rows)) == \
        [(5, [0, 1, 3, 4, 5]), (5, [2, 3, 4, 5])]
    # strict-contiguity: A2 kills run 1; run 2 takes B2, B3, C1.
    assert shapes(run_text(text.format(using=" USING strict-contiguity"), rows)) == \
        [(5, [2, 3, 4, 5])]


def test_skip_till_next_match_next_step_wins():
    text = "QUERY nw FROM abc PATTERN SEQ(A a, B+ b, B c) USING skip-till-next-match"
    rows = [abc("A", 0), abc("B", 1), abc("B", 2), abc("B", 3)]
    # The run takes B1 into b (b needs one element first); B2 qualifies for both b and c:
    # the next step wins, so c = B2 and the run is complete. B3: no run.
    assert shapes(run_text(text, rows)) == [(2, [0, 1, 2])]
    # Under skip-till-any-match: c = B2 with b = {B1}; c = B3 with b in {B1}, {B2}, {B1, B2}.
    any_match = text.replace(" USING skip-till-next-match", "")
    assert shapes(run_text(any_match, rows)) == \
        [(2, [0, 1, 2]), (3, [0, 1, 2, 3]), (3, [0, 1, 3]), (3, [0, 2, 3])]


def test_skip_till_next_match_kleene_with_order_by_ts():
    # The example query s3: o, then at least two duplicate orders, then R and D.
    text = """QUERY s3 FROM rfid PATTERN SEQ(O o, KLEENE(O dup){2,}, R r, D d)
    WITHIN 1 hour USING skip-till-next-match ORDER BY ts"""
    rows = [rfid("O", 1, 0), rfid("O", 1, 1), rfid("O", 1, 2), rfid("R", 1, 3),
            rfid("D", 1, 4)]
    # Run 1 (O0): dup takes O1, O2; R3 is the next step and dup has 2 elements: r = R3; d = D4.
    # Run 2 (O1): dup = {O2} only, R3 cannot end it (needs 2): ignored; D4 ignored.
    # Run 3 (O2): dup empty; nothing more.
    assert shapes(run_text(text, rows)) == [(4, [0, 1, 2, 3, 4])]


def test_event_time_going_backwards_is_dead_lettered():
    text = "QUERY dl FROM abc PARTITION BY p PATTERN SEQ(A a, B b) WITHIN 1 hour"
    rows = [abc("A", 10, p=1),  # 0
            abc("B", 5, p=2),  # 1  another partition: time may differ
            abc("B", 8, p=1),  # 2  behind A@10 in partition 1: rejected
            abc("B", 12, p=1)]  # 3
    [q] = query(text)
    interp = SeqInterpreter(q)
    out = []
    for e in events(rows):
        out.extend(interp.process(e))
    assert [(c["key"], c["seq"], constituent_seqs(c)) for c in out] == [(1, 3, [0, 3])]
    assert [(e.seq, reason) for e, reason in interp.dead_letters] == \
        [(2, "event time goes backwards")]


def test_buffer_is_pruned_by_the_window():
    # A few thousand events: only a window's worth stays in the partition buffer.
    text = "QUERY big FROM abc PATTERN SEQ(A a, B b) WHERE a.p = b.p WITHIN 3 minutes"
    rows = [abc("A" if i % 2 == 0 else "B", i, p=(i // 2) % 7) for i in range(3000)]
    [q] = query(text)
    interp = SeqInterpreter(q)
    out = []
    for e in events(rows):
        out.extend(interp.process(e))
    # The B at minute 2k+1 (p = k mod 7) can pair with the A's at minutes 2k and 2k-2 (within
    # 3 minutes); only the one at 2k has the same p. So 1500 matches, one per B.
    assert shapes(out) == [(2 * k + 1, [2 * k, 2 * k + 1]) for k in range(1500)]
    [part] = interp._partitions.values()
    assert len(part.events) <= 4


def test_runs_trailing_kleene_and_and_group():
    # Decision (not in the decisions file): under skip-till-next-match / strict-contiguity a
    # Kleene step that is the last positive step completes its run as soon as it has its
    # minimum number of elements.
    text = "QUERY tk FROM abc PATTERN SEQ(A a, B+ b{bounds}) USING skip-till-next-match"
    rows = [abc("A", 0), abc("B", 1), abc("B", 2), abc("B", 3)]
    # B1 gives b one element: done. B2, B3: no run (only an A starts one).
    assert shapes(run_text(text.format(bounds=""), rows)) == [(1, [0, 1])]
    text = "QUERY tk FROM abc PATTERN SEQ(A a, KLEENE(B b){2}) USING skip-till-next-match"
    assert shapes(run_text(text, rows)) == [(2, [0, 1, 2])]
    # Decision: under runs an AND group is filled in arrival order, each event taking the
    # first unfilled member (in written order) it qualifies for.
    text = "QUERY ag FROM abc PATTERN SEQ(A a, AND(B b, C c), A d) USING {strategy}"
    rows = [abc("A", 0), abc("C", 1), abc("B", 2), abc("B", 3), abc("A", 4)]
    # next-match: run A0: C1 fills c, B2 fills b (group complete), B3 is ignored, A4 is d.
    #   A4 also starts a run, which ends with the stream.
    assert shapes(run_text(text.format(strategy="skip-till-next-match"), rows)) == \
        [(4, [0, 2, 1, 4])]
    # strict: B3 continues nothing (the group is complete, the next step wants an A): dies.
    assert shapes(run_text(text.format(strategy="strict-contiguity"), rows)) == []
    assert shapes(run_text(text.format(strategy="strict-contiguity"),
                           rows[:3] + rows[4:])) == [(3, [0, 2, 1, 3])]


def test_punctuation_releases_every_partition():
    text = """QUERY pe FROM rfid PARTITION BY item PATTERN SEQ(O o, D d, NOT(C c))
    WHERE c.item = o.item WITHIN 10 minutes"""
    rows = [rfid("O", 1, 0), rfid("O", 2, 1), rfid("D", 2, 2), rfid("D", 1, 3),
            rfid("C", 1, 12)]
    # item 2: (o1, d2) waits until time passes 1 + 10 = 11; item 1: (o0, d3) until 10.
    # C1@12 passes item 1's deadline (and is too late to cancel): (o0, d3) is released.
    # Item 2 sees no event after minute 2; the punctuation at 11 min + 1 ms releases it.
    [q] = query(text)
    interp = SeqInterpreter(q)
    got = [shapes(interp.process(e)) for e in events(rows)]
    assert got == [[], [], [], [], [(3, [0, 3])]]
    assert interp.punctuate(11 * MIN) == []
    assert [(c["key"], c["seq"]) for c in interp.punctuate(11 * MIN + 1)] == [(2, 2)]
    assert interp.flush() == []


# ---------------------------------------------------------------- timed-out partial matches

TIMEOUTS = """QUERY t FROM abc PARTITION BY p PATTERN SEQ(A a, KLEENE(B b), C c) WITHIN 5 minutes
USING skip-till-next-match ON TIMEOUT EMIT PARTIAL EMIT n = count(b)"""


def test_timed_out_partial_matches():
    interp = SeqInterpreter(query(TIMEOUTS)[0])
    rows = [abc("A", 0, p=0),  # 0: starts run x (first.ts 0, window closes after 5)
            abc("B", 1, p=0),  # 1: x takes it as b's first element
            abc("A", 2, p=1),  # 2: starts run y in partition 1 (closes after 7)
            abc("B", 4, p=0),  # 3: x takes it: b = [1, 3]
            abc("A", 5, p=0),  # 4: x ignores it (b is open, A fits nothing); starts run z
            abc("C", 6, p=0)]  # 5: time 6 > 0 + 5: x times out before seeing it (bound so
    #                               far: a = 0, b = [1, 3]); z cannot take C (b needs one)
    out = {e.seq: interp.process(e) for e in events(rows)}
    assert all(out[s] == [] for s in range(5))
    assert out[5] == [{"query": "t", "key": 0, "seq": 3, "start_seq": 0, "timed_out": True,
                       "events": {"a": rows[0] | {"seq": 0},
                                  "b": [rows[1] | {"seq": 1}, rows[3] | {"seq": 3}]}}]
    # A punctuation at 7 is not past y's 2 + 5 = 7; at 8 it is (partition 1 had no event
    # since). z (first.ts 5) waits until after 10.
    assert interp.punctuate(7 * MIN) == []
    assert shapes(interp.punctuate(8 * MIN)) == [(2, [2])]
    # End of input: event time reaches +infinity, z times out with a alone.
    flushed = interp.flush()
    assert shapes(flushed) == [(4, [4])] and flushed[0]["timed_out"] is True
    assert interp.flush() == []


def test_timed_out_runs_are_not_the_failed_ones():
    # strict-contiguity: a run that does not take the next event dies without a report;
    # a completed match carries no "timed_out".
    text = """QUERY t FROM abc PATTERN SEQ(A a, B b, C c) WITHIN 3 minutes
    USING strict-contiguity ON TIMEOUT EMIT PARTIAL"""
    rows = [abc("A", 0), abc("C", 1),  # run 0 dies on C (not a B): no report
            abc("A", 2), abc("B", 3), abc("C", 4),  # 2, 3, 4: a match
            abc("A", 5), abc("B", 6)]  # 5, 6: left at the end: timed out at flush
    out = run_text(text, rows)
    assert shapes(out) == [(4, [2, 3, 4]), (6, [5, 6])]
    assert "timed_out" not in out[0] and out[1]["timed_out"] is True
