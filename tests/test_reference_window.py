"""The reference WINDOW interpreter against hand-worked fixtures (docs/semantics.md,
WINDOW).

Every expected row below is worked out by hand in the comment above it; none is produced
by running the code."""

from __future__ import annotations

from cep_core.checker import load_query_text
from cep_core.events import Event, Punctuation
from cep_core.reference import run
from cep_core.reference.window import WindowInterpreter

S = 1_000  # ms
M = 60_000  # ms


def query(text: str):
    (checked,) = load_query_text(text)
    return checked


def bids(rows):
    """(ts, price) pairs -> bids events, seq by position."""
    return [Event(i, ts, {"bidder": f"b{i}", "bid_price": price, "timestamp": ts})
            for i, (ts, price) in enumerate(rows)]


def ticks(rows):
    """(time, symbol, price, volume) -> ticks events, seq by position."""
    return [Event(i, t, {"symbol": sym, "price": price, "volume": vol, "time": t})
            for i, (t, sym, price, vol) in enumerate(rows)]


def strip(rows, *fields):
    return [{f: r[f] for f in fields} for r in rows]


# ------------------------------------------------ CQPH: bids, RANGE 4 min SLIDE 1 min

CQPH = ("QUERY top SELECT max(bid_price), timestamp "
        "FROM bids [RANGE 4 minutes SLIDE 1 minute WATTR timestamp]")

# seq  ts       price   ends of its windows (multiples of 1 min with end - 4 min < ts <= end)
#  0   0:30     5       1:00 2:00 3:00 4:00
#  1   1:00     9       1:00 2:00 3:00 4:00        (exactly at an end: in the 1:00 window)
#  2   1:45     4       2:00 3:00 4:00 5:00
#  3   3:10     6       4:00 5:00 6:00 7:00
#  4   6:20     2       7:00 8:00 9:00 10:00
BIDS = bids([(30 * S, 5), (1 * M, 9), (105 * S, 4), (190 * S, 6), (380 * S, 2)])

# window (start, end]   events       max  seq start_seq
# (-3:00, 1:00]         0 1          9    1   0
# (-2:00, 2:00]         0 1 2        9    2   0
# (-1:00, 3:00]         0 1 2        9    2   0
# ( 0:00, 4:00]         0 1 2 3      9    3   0
# ( 1:00, 5:00]         2 3          6    3   2   (1:00 itself is outside: start exclusive)
# ( 2:00, 6:00]         3            6    3   3
# ( 3:00, 7:00]         3 4          6    4   3
# ( 4:00, 8:00]         4            2    4   4
# ( 5:00, 9:00]         4            2    4   4
# ( 6:00, 10:00]        4            2    4   4
CQPH_ROWS = [
    (-3 * M, 1 * M, 9, 1, 0),
    (-2 * M, 2 * M, 9, 2, 0),
    (-1 * M, 3 * M, 9, 2, 0),
    (0 * M, 4 * M, 9, 3, 0),
    (1 * M, 5 * M, 6, 3, 2),
    (2 * M, 6 * M, 6, 3, 3),
    (3 * M, 7 * M, 6, 4, 3),
    (4 * M, 8 * M, 2, 4, 4),
    (5 * M, 9 * M, 2, 4, 4),
    (6 * M, 10 * M, 2, 4, 4),
]


def cqph_row(start, end, hi, seq, start_seq):
    # Unaliased names: max(bid_price) -> max_bid_price; the window attribute keeps its name
    # and its value is the window end.
    return {"query": "top", "key": None, "seq": seq, "start_seq": start_seq,
            "window_start": start, "window_end": end, "max_bid_price": hi, "timestamp": end}


def test_cqph_every_window_row():
    # run() orders by (seq, query, start_seq, window_end, key): here that is window order.
    assert run([query(CQPH)], BIDS) == [cqph_row(*r) for r in CQPH_ROWS]


def test_cqph_release_timing():
    # A window is released once event time exceeds its end:
    #   0:30 -> nothing; 1:00 -> nothing (== end of the 1:00 window, not above it);
    #   1:45 -> 1:00; 3:10 -> 2:00 3:00; 6:20 -> 4:00 5:00 6:00; flush -> 7:00 .. 10:00.
    interp = WindowInterpreter(query(CQPH))
    released = [interp.process(e) for e in BIDS]
    released.append(interp.flush())
    expected = [cqph_row(*r) for r in CQPH_ROWS]
    assert released == [[], [], expected[0:1], expected[1:3], expected[3:6], expected[6:10]]
    assert interp.dead_letters == []
    assert interp.flush() == []  # nothing left


# ---------------------------------------------------------------- ticks: WHERE + GROUP BY

TICKS_WHERE = ("WHERE symbol IN ('GOOG', 'AAPL', 'YHOO') AND (volume > 100 OR price < 10) "
               "GROUP BY symbol")
TICKS_SMALL = ("QUERY w2 SELECT symbol, max(price) AS hi, count(*) AS n "
               "FROM ticks [RANGE 10 seconds SLIDE 5 seconds WATTR time] " + TICKS_WHERE)
TICKS_FULL = ("QUERY w2 SELECT symbol, max(price) AS hi, count(*) AS n "
              "FROM ticks [RANGE 300 seconds SLIDE 5 seconds WATTR time] " + TICKS_WHERE)

# seq  time  symbol  price   volume  WHERE
#  0   1 s   GOOG    500.0   200     yes (volume > 100)
#  1   2 s   AAPL    150.0    50     no  (volume <= 100 and price >= 10)
#  2   3 s   MSFT      5.0   500     no  (symbol not listed)
#  3   4 s   YHOO      8.5    10     yes (price < 10)
#  4   6 s   GOOG    510.0   300     yes
#  5   7 s   AAPL      9.0    20     yes (price < 10)
#  6  12 s   AAPL    160.0  1000     yes
#  7  16 s   MSFT      1.0     1     no  (but it moves event time to 16 s)
TICKS = ticks([
    (1 * S, "GOOG", 500.0, 200),
    (2 * S, "AAPL", 150.0, 50),
    (3 * S, "MSFT", 5.0, 500),
    (4 * S, "YHOO", 8.5, 10),
    (6 * S, "GOOG", 510.0, 300),
    (7 * S, "AAPL", 9.0, 20),
    (12 * S, "AAPL", 160.0, 1000),
    (16 * S, "MSFT", 1.0, 1),
])


def tick_row(start, end, symbol, hi, n, seq, start_seq):
    return {"query": "w2", "key": symbol, "seq": seq, "start_seq": start_seq,
            "window_start": start, "window_end": end, "symbol": symbol, "hi": hi, "n": n}


def test_ticks_range_10s_slide_5s_release_timing():
    # RANGE 10 s SLIDE 5 s: window end e covers (e - 10 s, e]. Selected events: 0 3 4 5 6.
    #   ( -5 s,  5 s]: GOOG{0: 500.0}  YHOO{3: 8.5}
    #   (  0 s, 10 s]: AAPL{5: 9.0}  GOOG{0: 500.0, 4: 510.0}  YHOO{3: 8.5}
    #   (  5 s, 15 s]: AAPL{5: 9.0, 6: 160.0}  GOOG{4: 510.0}
    #   ( 10 s, 20 s]: AAPL{6: 160.0}
    # Releases: event 4 (6 s) releases 5 s; event 6 (12 s) releases 10 s; event 7 (16 s,
    # filtered out, still advances event time) releases 15 s; flush releases 20 s.
    # Rows of a window come in key order: "AAPL" < "GOOG" < "YHOO".
    interp = WindowInterpreter(query(TICKS_SMALL))
    released = [interp.process(e) for e in TICKS] + [interp.flush()]
    assert released == [
        [], [], [], [],
        [tick_row(-5 * S, 5 * S, "GOOG", 500.0, 1, 0, 0),
         tick_row(-5 * S, 5 * S, "YHOO", 8.5, 1, 3, 3)],
        [],
        [tick_row(0, 10 * S, "AAPL", 9.0, 1, 5, 5),
         tick_row(0, 10 * S, "GOOG", 510.0, 2, 4, 0),
         tick_row(0, 10 * S, "YHOO", 8.5, 1, 3, 3)],
        [tick_row(5 * S, 15 * S, "AAPL", 160.0, 2, 6, 5),
         tick_row(5 * S, 15 * S, "GOOG", 510.0, 1, 4, 4)],
        [tick_row(10 * S, 20 * S, "AAPL", 160.0, 1, 6, 6)],
    ]
    assert interp.dead_letters == []


def test_ticks_range_10s_slide_5s_run_order():
    # run() sorts by (seq, query, start_seq, window_end, key); a row's seq is the last
    # selected event of its group in the window (rows as in the test above):
    #   seq 0: GOOG@5 s;  seq 3: YHOO@5 s, YHOO@10 s;  seq 4: GOOG@10 s (start 0),
    #   GOOG@15 s (start 4);  seq 5: AAPL@10 s;  seq 6: AAPL@15 s (start 5), AAPL@20 s (start 6).
    out = run([query(TICKS_SMALL)], TICKS)
    assert strip(out, "seq", "window_end", "symbol") == [
        {"seq": 0, "window_end": 5 * S, "symbol": "GOOG"},
        {"seq": 3, "window_end": 5 * S, "symbol": "YHOO"},
        {"seq": 3, "window_end": 10 * S, "symbol": "YHOO"},
        {"seq": 4, "window_end": 10 * S, "symbol": "GOOG"},
        {"seq": 4, "window_end": 15 * S, "symbol": "GOOG"},
        {"seq": 5, "window_end": 10 * S, "symbol": "AAPL"},
        {"seq": 6, "window_end": 15 * S, "symbol": "AAPL"},
        {"seq": 6, "window_end": 20 * S, "symbol": "AAPL"},
    ]


def test_ticks_spec_query_range_300s_slide_5s():
    # The spec's query: window end e (a multiple of 5 s) covers (e - 300 s, e]; an event at
    # time t is in the windows with t <= e < t + 300 s.
    #   GOOG @1 s -> ends 5 s .. 300 s;  GOOG @6 s -> 10 s .. 305 s;  union 5 s .. 305 s: 61
    #   YHOO @4 s -> ends 5 s .. 300 s: 60
    #   AAPL @7 s -> 10 s .. 305 s;  AAPL @12 s -> 15 s .. 310 s;  union 10 s .. 310 s: 61
    # 182 rows. Some of them:
    #   end 5 s:   GOOG{0} hi 500.0 n 1;  YHOO{3} hi 8.5 n 1          (no AAPL yet)
    #   end 300 s: (0, 300 s]: AAPL{5,6} hi 160.0 n 2; GOOG{0,4} hi 510.0 n 2; YHOO{3} 8.5 n 1
    #   end 305 s: (5 s, 305 s]: AAPL{5,6} n 2; GOOG{4} hi 510.0 n 1  (YHOO @4 s has left)
    #   end 310 s: (10 s, 310 s]: AAPL{6} hi 160.0 n 1
    # Event time ends at 16 s, so only 5 s, 10 s, 15 s are released before the flush.
    interp = WindowInterpreter(query(TICKS_FULL))
    before = [r for e in TICKS for r in interp.process(e)]
    assert sorted({r["window_end"] for r in before}) == [5 * S, 10 * S, 15 * S]
    rows = before + interp.flush()
    assert len(rows) == 182
    by = {(r["window_end"], r["symbol"]): r for r in rows}
    assert {sym for end, sym in by if end == 5 * S} == {"GOOG", "YHOO"}
    assert by[(5 * S, "GOOG")] == tick_row(-295 * S, 5 * S, "GOOG", 500.0, 1, 0, 0)
    assert by[(5 * S, "YHOO")] == tick_row(-295 * S, 5 * S, "YHOO", 8.5, 1, 3, 3)
    assert by[(300 * S, "AAPL")] == tick_row(0, 300 * S, "AAPL", 160.0, 2, 6, 5)
    assert by[(300 * S, "GOOG")] == tick_row(0, 300 * S, "GOOG", 510.0, 2, 4, 0)
    assert by[(300 * S, "YHOO")] == tick_row(0, 300 * S, "YHOO", 8.5, 1, 3, 3)
    assert {sym for end, sym in by if end == 305 * S} == {"AAPL", "GOOG"}
    assert by[(305 * S, "AAPL")] == tick_row(5 * S, 305 * S, "AAPL", 160.0, 2, 6, 5)
    assert by[(305 * S, "GOOG")] == tick_row(5 * S, 305 * S, "GOOG", 510.0, 1, 4, 4)
    assert [r for r in rows if r["window_end"] == 310 * S] == \
        [tick_row(10 * S, 310 * S, "AAPL", 160.0, 1, 6, 6)]
    per_symbol = {sym: sorted(end for end, s in by if s == sym) for sym in ("AAPL", "GOOG",
                                                                             "YHOO")}
    assert per_symbol["GOOG"] == list(range(5 * S, 305 * S + 1, 5 * S))
    assert per_symbol["YHOO"] == list(range(5 * S, 300 * S + 1, 5 * S))
    assert per_symbol["AAPL"] == list(range(10 * S, 310 * S + 1, 5 * S))
    # The flush releases its windows in (window_end, key) order.
    flushed = rows[len(before):]
    assert [(r["window_end"], r["symbol"]) for r in flushed] == \
        sorted((r["window_end"], r["symbol"]) for r in flushed)


# ------------------------------------------------ punctuation, boundaries, late events

PUNCT = "QUERY p SELECT count(*), sum(bid_price) FROM bids [RANGE 2 minutes SLIDE 1 minute]"


def punct_row(end, count, total, seq, start_seq):
    # No WATTR: windows are over the time attribute. count(*) -> count; sum(bid_price) ->
    # sum_bid_price.
    return {"query": "p", "key": None, "seq": seq, "start_seq": start_seq,
            "window_start": end - 2 * M, "window_end": end, "count": count,
            "sum_bid_price": total}


def test_punctuation_closes_windows():
    # Window end e covers (e - 2 min, e].
    #   event 0 @1:00 price 3 -> windows 1:00 (exactly at its end: included) and 2:00
    #   event 1 @1:30 price 4 -> windows 2:00 and 3:00
    # process(0 @1:00)      -> nothing: event time 1:00 is not above the end 1:00
    # punctuate(1:00)       -> nothing, for the same reason
    # punctuate(1:00.001)   -> window 1:00: {0} count 1 sum 3
    # process(1 @1:30)      -> nothing
    # punctuate(1:40)       -> nothing (2:00 not passed)
    # punctuate(3:20)       -> 2:00: {0,1} count 2 sum 7; 3:00: {1} count 1 sum 4
    # punctuate(2:30)       -> nothing (event time does not go back)
    # flush                 -> nothing left
    interp = WindowInterpreter(query(PUNCT))
    e0, e1 = bids([(1 * M, 3), (90 * S, 4)])
    assert interp.process(e0) == []
    assert interp.punctuate(1 * M) == []
    assert interp.punctuate(1 * M + 1) == [punct_row(1 * M, 1, 3, 0, 0)]
    assert interp.process(e1) == []
    assert interp.punctuate(100 * S) == []
    assert interp.punctuate(200 * S) == [punct_row(2 * M, 2, 7, 1, 0),
                                         punct_row(3 * M, 1, 4, 1, 1)]
    assert interp.punctuate(150 * S) == []
    assert interp.flush() == []
    assert interp.dead_letters == []


def test_punctuation_in_run():
    # Same stream through run(): rows appear at the punctuations; the flush has nothing left.
    e0, e1 = bids([(1 * M, 3), (90 * S, 4)])
    stream = [e0, Punctuation(1 * M), Punctuation(1 * M + 1), e1, Punctuation(200 * S)]
    assert run([query(PUNCT)], stream) == [punct_row(1 * M, 1, 3, 0, 0),
                                           punct_row(2 * M, 2, 7, 1, 0),
                                           punct_row(3 * M, 1, 4, 1, 1)]
    # Without the last punctuation, the flush releases 2:00 and 3:00 all the same.
    assert run([query(PUNCT)], stream[:-1]) == run([query(PUNCT)], stream)


def test_late_events_go_to_dead_letters():
    #   event 0 @1:00 price 3 (windows 1:00, 2:00), event 1 @1:30 price 4 (2:00, 3:00):
    #   event 1 moves event time above 1:00 and releases window 1:00; punctuate(3:20)
    #   releases 2:00 and 3:00 (ends below 3:20).
    #   event 2 @3:00 price 100: its windows are 3:00 (released) and 4:00 -> late, not counted
    #   event 3 @2:59 price 50 (filtered out by WHERE) -> in no window: not late, dropped
    #   event 4 @3:10 price 1: windows 4:00 and 5:00, both open -> accepted although its time
    #     is below event time
    #   event 5 @1:00 price 7: windows 1:00, 2:00 released -> late
    # flush: 4:00 {4} count 1 sum 1 (event 2 not counted); 5:00 {4} count 1 sum 1.
    q = query("QUERY p SELECT count(*), sum(bid_price) FROM bids "
              "[RANGE 2 minutes SLIDE 1 minute] WHERE bid_price != 50")
    interp = WindowInterpreter(q)
    e0, e1, e2, e3, e4, e5 = bids([(1 * M, 3), (90 * S, 4), (3 * M, 100), (179 * S, 50),
                                   (190 * S, 1), (1 * M, 7)])
    assert interp.process(e0) == []
    assert interp.process(e1) == [punct_row(1 * M, 1, 3, 0, 0)]
    assert [r["window_end"] for r in interp.punctuate(200 * S)] == [2 * M, 3 * M]
    assert interp.process(e2) == []
    assert interp.process(e3) == []
    assert interp.process(e4) == []
    assert interp.process(e5) == []
    assert [e for e, _ in interp.dead_letters] == [e2, e5]
    assert all("late" in reason for _, reason in interp.dead_letters)
    assert interp.flush() == [punct_row(4 * M, 1, 1, 4, 4), punct_row(5 * M, 1, 1, 4, 4)]
    # After the flush every event is late.
    (e6,) = bids([(10 * M, 1)])
    assert interp.process(e6) == []
    assert interp.dead_letters[-1][0] is e6


# ---------------------------------------------------------------- ROWS n SLIDE m

ROWS_PLAIN = ("QUERY r1 SELECT count(*), sum(volume), avg(volume), sum(price) AS sp, "
              "avg(price) AS ap FROM ticks [ROWS 4 SLIDE 2] WHERE symbol != 'X'")

# row (seq+1)  symbol price  volume  WHERE
#  1           A      1.5    10      yes
#  2           X      100.0  1000    no
#  3           B      2.25   5       yes
#  4           A      0.25   7       yes
#  5           X      1.0    1       no
#  6           X      1.0    1       no
#  7           X      1.0    1       no
#  8           X      1.0    1       no
#  9           B      4.0    1       yes
ROW_TICKS = ticks([
    (1 * S, "A", 1.5, 10), (2 * S, "X", 100.0, 1000), (3 * S, "B", 2.25, 5),
    (4 * S, "A", 0.25, 7), (5 * S, "X", 1.0, 1), (6 * S, "X", 1.0, 1),
    (7 * S, "X", 1.0, 1), (8 * S, "X", 1.0, 1), (9 * S, "B", 4.0, 1),
])


def test_rows_without_group_by():
    # Window k covers rows (2k - 4, 2k] and is released on row 2k (rows count every event,
    # selected or not):
    #   row 2: (-2, 2]: rows {1}      count 1 sum(volume) 10 avg 10.0  sp 1.5  ap 1.5
    #   row 4: ( 0, 4]: rows {1,3,4}  count 3 sum 22 avg 22/3  sp 1.5+2.25+0.25=4.0 ap 4.0/3
    #   row 6: ( 2, 6]: rows {3,4}    count 2 sum 12 avg 6.0   sp 2.5  ap 1.25
    #   row 8: ( 4, 8]: no selected row -> nothing
    #   row 9: not a release point; flush: window (6, 10] never reached row 10 -> nothing
    # seq/start_seq: last/first selected event (seq = row - 1).
    def row(start, end, count, sv, av, sp, ap, seq, start_seq):
        return {"query": "r1", "key": None, "seq": seq, "start_seq": start_seq,
                "window_start": start, "window_end": end, "count": count,
                "sum_volume": sv, "avg_volume": av, "sp": sp, "ap": ap}

    interp = WindowInterpreter(query(ROWS_PLAIN))
    released = [interp.process(e) for e in ROW_TICKS] + [interp.flush()]
    assert released == [
        [], [row(-2, 2, 1, 10, 10.0, 1.5, 1.5, 0, 0)],
        [], [row(0, 4, 3, 22, 22 / 3, 4.0, 4.0 / 3, 3, 0)],
        [], [row(2, 6, 2, 12, 6.0, 2.5, 1.25, 3, 2)],
        [], [],
        [], [],
    ]
    # sum of ints stays an int; avg is always a float.
    first = released[1][0]
    assert type(first["sum_volume"]) is int and type(first["avg_volume"]) is float
    # Punctuations do nothing to count windows.
    assert WindowInterpreter(query(ROWS_PLAIN)).punctuate(10**12) == []


def test_rows_with_group_by():
    # row symbol price volume
    #  1  A      1.5   10
    #  2  B      2.0   3
    #  3  A      2.5   4
    #  4  A      1.0   1
    #  5  B      0.5   6
    #  6  B      1.0   2
    #  7  B      3.0   1
    #  8  B      1.0   1
    # (-2, 2]: A{1}: n 1 sp 1.5 av 10.0 (seq 0, start 0); B{2}: n 1 sp 2.0 av 3.0 (1, 1)
    # ( 0, 4]: A{1,3,4}: n 3 sp 5.0 av 15/3 = 5.0 (3, 0);   B{2}: n 1 sp 2.0 av 3.0 (1, 1)
    # ( 2, 6]: A{3,4}: n 2 sp 3.5 av 2.5 (3, 2);            B{5,6}: n 2 sp 1.5 av 4.0 (5, 4)
    # ( 4, 8]: A has no row there: empty group, nothing;    B{5..8}: n 4 sp 5.5 av 2.5 (7, 4)
    q = query("QUERY r2 SELECT symbol, count(*) AS n, sum(price) AS sp, avg(volume) AS av "
              "FROM ticks [ROWS 4 SLIDE 2] GROUP BY symbol")
    events = ticks([(1 * S, "A", 1.5, 10), (2 * S, "B", 2.0, 3), (3 * S, "A", 2.5, 4),
                    (4 * S, "A", 1.0, 1), (5 * S, "B", 0.5, 6), (6 * S, "B", 1.0, 2),
                    (7 * S, "B", 3.0, 1), (8 * S, "B", 1.0, 1)])

    def row(start, end, sym, n, sp, av, seq, start_seq):
        return {"query": "r2", "key": sym, "seq": seq, "start_seq": start_seq,
                "window_start": start, "window_end": end, "symbol": sym, "n": n,
                "sp": sp, "av": av}

    a2, b2 = row(-2, 2, "A", 1, 1.5, 10.0, 0, 0), row(-2, 2, "B", 1, 2.0, 3.0, 1, 1)
    a4, b4 = row(0, 4, "A", 3, 5.0, 5.0, 3, 0), row(0, 4, "B", 1, 2.0, 3.0, 1, 1)
    a6, b6 = row(2, 6, "A", 2, 3.5, 2.5, 3, 2), row(2, 6, "B", 2, 1.5, 4.0, 5, 4)
    b8 = row(4, 8, "B", 4, 5.5, 2.5, 7, 4)

    interp = WindowInterpreter(q)
    released = [interp.process(e) for e in events] + [interp.flush()]
    # Each release point gives its window's rows in key order.
    assert released == [[], [a2, b2], [], [a4, b4], [], [a6, b6], [], [b8], []]
    # run() orders by (seq, query, start_seq, window_end, key):
    #   a2 (0,[0],2)  b2 (1,[1],2)  b4 (1,[1],4)  a4 (3,[0],4)  a6 (3,[2],6)  b6 (5,[4],6)
    #   b8 (7,[4],8)
    assert run([q], events) == [a2, b2, b4, a4, a6, b6, b8]


def test_time_window_empty_groups_and_multi_attribute_key():
    # GROUP BY two attributes: the key is a list. RANGE 10 s SLIDE 10 s (tumbling):
    #   seq 0 @1 s  (A, 1)  price 1.0     window 10 s
    #   seq 1 @2 s  (A, 2)  price 2.0     window 10 s
    #   seq 2 @3 s  (A, 1)  price 3.0     window 10 s
    #   seq 3 @15 s (A, 2)  price 4.0     window 20 s
    #   seq 4 @25 s (A, 2)  price 1.0     filtered (price < 2): moves event time to 25 s
    # Window 10 s: key [A,1]: {0,2} min 1.0 (seq 2, start 0); key [A,2]: {1} min 2.0
    # Window 20 s: key [A,2]: {3} min 4.0; key [A,1] has no event: nothing.
    # Event 4 (25 s) releases 20 s; window 30 s holds nothing, so the flush emits nothing.
    q = query("QUERY g SELECT symbol, volume, min(price) FROM ticks "
              "[RANGE 10 seconds SLIDE 10 seconds] WHERE price >= 2 OR volume = 1 "
              "GROUP BY symbol, volume")
    events = ticks([(1 * S, "A", 1.0, 1), (2 * S, "A", 2.0, 2), (3 * S, "A", 3.0, 1),
                    (15 * S, "A", 4.0, 2), (25 * S, "A", 1.0, 2)])

    def row(end, vol, lo, seq, start_seq):
        return {"query": "g", "key": ["A", vol], "seq": seq, "start_seq": start_seq,
                "window_start": end - 10 * S, "window_end": end, "symbol": "A",
                "volume": vol, "min_price": lo}

    interp = WindowInterpreter(q)
    released = [interp.process(e) for e in events] + [interp.flush()]
    assert released == [[], [], [],
                        [row(10 * S, 1, 1.0, 2, 0), row(10 * S, 2, 2.0, 1, 1)],
                        [row(20 * S, 2, 4.0, 3, 3)],
                        []]
