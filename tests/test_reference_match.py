"""Spec fixtures for MATCH (docs/semantics.md, MATCH),
run on the reference interpreter. Each expected output is worked out by hand in a comment.

Notation in the workings: `cN` is the candidate (partial match) that started at seq N; its
residual is the part of the pattern it still has to match; "dies" means it could not take
the event (partition-contiguous).
"""

from __future__ import annotations

from cep_core.checker import load_query_text
from cep_core.events import Event
from cep_core.reference import run
from cep_core.reference.match import MatchInterpreter
from test_checker_ok import SEMANTICS_EXAMPLES


def events(rows: list[dict], time: str = "ts") -> list[Event]:
    """Events from dicts, seq = position in the list."""
    return [Event(seq, row[time], dict(row)) for seq, row in enumerate(rows)]


def abc(*specs: str, start: int = 0) -> list[dict]:
    """Rows of the `abc` stream: each spec is the event type, ts increases by 1."""
    return [{"type": t, "p": 0, "v": 0, "ts": start + i} for i, t in enumerate(specs)]


def match(name: str, seq: int, start_seq: int, key=None, **emit) -> dict:
    return {"query": name, "key": key, "seq": seq, "start_seq": start_seq, **emit}


# ---------------------------------------------------------------- Hirzel: a+ b


def test_hirzel_a_plus_b_reports_the_longest():
    queries = load_query_text("""
        QUERY h FROM abc
        PATTERN ( a+ b )
        DEFINE a AS type = 'A', b AS type = 'B'
    """)
    stream = events(abc("C", "A", "A", "B"))  # x, a1, a2, b
    # seq0 x : c0 dies (x is not a).
    # seq1 a1: c1 -> a* b.
    # seq2 a2: c1 -> a* b; c2 -> a* b.
    # seq3 b : c1 accepts (a1 a2 b), c2 accepts (a2 b), c3 dies.
    #          Both accept on the same event: the earliest start, c1, is the longest.
    assert run(queries, stream) == [match("h", seq=3, start_seq=1)]


# ---------------------------------------------------------------- overlapping predicates


def test_overlapping_predicates_ab_or_ba():
    queries = load_query_text("""
        QUERY ov FROM abc
        PATTERN ( A B | B A )
        DEFINE A AS p > 0, B AS v > 0
    """)
    stream = events([
        {"type": "A", "p": 1, "v": 1, "ts": 0},  # seq0: satisfies A and B
        {"type": "A", "p": 1, "v": 0, "ts": 1},  # seq1: A only
        {"type": "A", "p": 0, "v": 1, "ts": 2},  # seq2: B only
        {"type": "A", "p": 1, "v": 0, "ts": 3},  # seq3: A only
    ])
    # seq0 (A,B): c0 -> B | A   (taken as A, B remains; taken as B, A remains: an NFA).
    # seq1 (A)  : c0 -> accepts via the path B A. c1 -> B.
    #             Report (0..1); discard c1.
    #             (Had seq0 been read as A only, c0 would die here and (1..2) would match.)
    # seq2 (B)  : c2 -> A.
    # seq3 (A)  : c2 accepts (B A); c3 -> B, discarded.
    assert run(queries, stream) == [match("ov", seq=1, start_seq=0),
                                    match("ov", seq=3, start_seq=2)]


# ---------------------------------------------------------------- marathon (Woods)

MARATHON = SEMANTICS_EXAMPLES["marathon"]


def test_marathon_cheaters_interleaved_runners():
    queries = load_query_text(MARATHON)
    rows = [
        (1, "Staten Island", 0),   # seq0
        (2, "Staten Island", 1),   # seq1
        (3, "Staten Island", 2),   # seq2
        (4, "Staten Island", 3),   # seq3
        (1, "Brooklyn", 10),       # seq4
        (2, "Queens", 11),         # seq5  runner 2 skipped Brooklyn
        (3, "Brooklyn", 12),       # seq6
        (4, "Brooklyn", 13),       # seq7
        (1, "Queens", 20),         # seq8
        (3, "Bronx", 21),          # seq9  runner 3 skipped Queens
        (4, "Queens", 22),         # seq10
        (1, "Bronx", 30),          # seq11
        (4, "Manhattan", 31),      # seq12 runner 4 skipped the Bronx
        (1, "Manhattan", 40),      # seq13 runner 1 ran the whole course
        (2, "Manhattan", 41),      # seq14
    ]
    stream = events([{"runner": r, "checkpoint": c, "ts": t} for r, c, t in rows])
    # Runner 1 (honest: SI, Brooklyn, Queens, Bronx, Manhattan), c0 after SI has residual
    #   NOTB* C | NOTC* D | NOTD* E.
    #   Brooklyn: NOTB fails, C/D/E fail; NOTC, NOTD hold -> NOTC* D | NOTD* E.
    #   Queens:   NOTC fails, D fails; NOTD holds -> NOTD* E.
    #   Bronx:    NOTD fails, E fails -> dies. Manhattan: no candidate (c13 is not A). None.
    # Runner 2: SI (c1), Queens: C holds -> accepts at seq5: (1..5). Manhattan later: c14
    #   dies (not A).
    # Runner 3: SI (c2), Brooklyn -> NOTC* D | NOTD* E, Bronx: D holds -> accepts (2..9).
    # Runner 4: SI (c3), Brooklyn -> NOTC* D | NOTD* E, Queens -> NOTD* E,
    #   Manhattan: E holds -> accepts (3..12).
    assert run(queries, stream) == [
        match("cheat", seq=5, start_seq=1, key=2),
        match("cheat", seq=9, start_seq=2, key=3),
        match("cheat", seq=12, start_seq=3, key=4),
    ]


# ---------------------------------------------------------------- M-shape (Hirzel finance1)

MSHAPE = SEMANTICS_EXAMPLES["mshape"]


def test_m_shape_two_symbols_interleaved():
    queries = load_query_text(MSHAPE)
    x_prices = [100, 110, 120, 105, 115, 125, 110, 95]
    y_prices = [50, 60, 55, 65, 40, 45, 50, 48, 52, 30]
    order = []  # X and Y alternate; the last two are Y's
    for i in range(len(y_prices)):
        if i < len(x_prices):
            order.append(("X", x_prices[i]))
        order.append(("Y", y_prices[i]))
    rows = [{"symbol": s, "price": p, "volume": 1, "ts": 10 * seq, "seqNum": 500 + seq}
            for seq, (s, p) in enumerate(order)]
    stream = events(rows)
    # Seqs: X prices at seq 0,2,...,14; Y prices at 1,3,...,15, then 16, 17.
    # First/Last below are over the candidate's events before the current one.
    #
    # X, c0 (starts at 100, '.'):
    #   110 rise (>100, >=100)       120 rise (>100, >=110)
    #   105 drop (>=100, <120)       115 rise (>100, >=105)      125 rise (>100, >=115)
    #   110 drop (>=100, <125)       95 deep (<100, <110): accepts at seq 14.
    #   Later X candidates all die before seq 14: c2 (110): 120 rise, 105 is neither rise
    #   (<120) nor drop (<110), deep not yet allowed -> dies; c4 (120): 105 not rise -> dies;
    #   c6 (105): 115, 125 rise, 110 drop, 95 not drop (<105), deep not allowed -> dies;
    #   c8 (115): 125 rise, 110 drop? 110 < 115 = First -> no; dies. c10 (125): 110 no rise.
    #   c12 (110): 95 no rise. c14 starts at 95 and is discarded with the report.
    #   -> X: start_seq 0, seq 14, seqNum 500, count 8, maxPrice 125.
    # Y, c1 (50): 60 rise, 55 drop (>=50, <60), 65 rise (>50, >=55),
    #   40 deep (<50, <65): accepts at seq 9 (Y's 5th event).
    #   c3 (60): 55 not rise -> dies. c5 (55): 65 rise, 40 not drop, deep not allowed -> dies.
    #   c7 (65): 40 -> dies. c9 (40) starts on the matching event: discarded.
    #   -> Y: start_seq 1, seq 9, seqNum 501, count 5, maxPrice 65.
    # Y, c11 (45): 50 rise, 48 drop (>=45, <50), 52 rise (>45, >=48), 30 deep (<45, <52):
    #   accepts at seq 17 -> start_seq 11, seqNum 511, count 5, maxPrice 52.
    #   (Had c9 survived, it would accept at seq 17 with start 9: 40 . 45 50 rise, 48 drop,
    #   52 rise, 30 deep (<40) -- the discard after a report prevents that.)
    #   c13 (50): 48 not rise -> dies. c15 (48): 52 rise, 30 not drop -> dies.
    out = run(queries, stream)
    assert out == [
        match("mshape", seq=9, start_seq=1, key="Y",
              symbol="Y", seqNum=501, count=5, maxPrice=65),
        match("mshape", seq=14, start_seq=0, key="X",
              symbol="X", seqNum=500, count=8, maxPrice=125),
        match("mshape", seq=17, start_seq=11, key="Y",
              symbol="Y", seqNum=511, count=5, maxPrice=52),
    ]
    # EMIT fields follow the fixed ones, in the order written.
    assert list(out[0]) == ["query", "key", "seq", "start_seq",
                            "symbol", "seqNum", "count", "maxPrice"]


# ---------------------------------------------------------------- non-overlapping


def test_non_overlapping_discards_partial_matches_after_a_report():
    queries = load_query_text("""
        QUERY no FROM abc
        PATTERN ( a b | b c )
        DEFINE a AS type = 'A', b AS type = 'B', c AS type = 'C'
    """)
    stream = events(abc("A", "B", "C", "B", "C"))
    # seq0 A: c0 -> b.
    # seq1 B: c0 accepts (a b): report (0..1). c1 (-> c) is discarded.
    # seq2 C: c2 dies. (Without the discard, c1 would accept here: (1..2), overlapping.)
    # seq3 B: c3 -> c.
    # seq4 C: c3 accepts (b c): report (3..4).
    assert run(queries, stream) == [match("no", seq=1, start_seq=0),
                                    match("no", seq=4, start_seq=3)]


def test_non_overlapping_pairs():
    queries = load_query_text("""
        QUERY pairs FROM abc PATTERN ( a a ) DEFINE a AS type = 'A'
    """)
    stream = events(abc("A", "A", "A", "A", "A"))
    # seq1: c0 accepts (0..1), c1 discarded. seq2: c2 -> a. seq3: c2 accepts (2..3),
    # c3 discarded. seq4: c4 -> a, never completes. Not (1..2) nor (3..4).
    assert run(queries, stream) == [match("pairs", seq=1, start_seq=0),
                                    match("pairs", seq=3, start_seq=2)]


# ---------------------------------------------------------------- aggregates, no partition


def test_emit_aggregates_and_delta_in_a_predicate_without_partition():
    queries = load_query_text("""
        QUERY agg FROM trades
        PATTERN ( s+ e )
        DEFINE s AS price > 0,
               e AS price = 0 AND Delta(ts) <= 100
        EMIT dt = Delta(ts), mean = Average(price), total = Sum(volume), lo = Min(price),
             prices = Collect(price), sym = symbol, n = count()
    """)
    rows = [
        ("X", 10, 1, 1000),  # seq0
        ("Y", 20, 2, 1010),  # seq1
        ("X", 0, 3, 1050),   # seq2
        ("Y", 5, 1, 1100),   # seq3
        ("X", 7, 1, 1150),   # seq4
        ("Y", 0, 1, 1250),   # seq5
    ]
    stream = events([{"symbol": s, "price": p, "volume": v, "ts": t, "seqNum": 0}
                     for s, p, v, t in rows])
    # No PARTITION BY: one partition, key null; symbols mix freely.
    # seq0: c0 -> s* e.  seq1: c0, c1 -> s* e.
    # seq2 (price 0): e with Delta(ts) = current ts - first ts of the candidate:
    #   c0: 1050 - 1000 = 50 <= 100 -> accepts; c1: 1050 - 1010 = 40 -> accepts too.
    #   Earliest start wins: (0..2). EMIT over seq0..2:
    #   dt = 1050 - 1000 = 50, mean = (10 + 20 + 0) / 3 = 10.0, total = 1 + 2 + 3 = 6,
    #   lo = 0, prices = [10, 20, 0], sym = last event's symbol 'X', n = 3.
    # seq3: c3 -> s* e. seq4: c3, c4 -> s* e.
    # seq5 (price 0): c3: Delta = 1250 - 1100 = 150 > 100, and not s -> dies.
    #   c4: Delta = 1250 - 1150 = 100 <= 100 -> accepts: (4..5).
    #   dt = 100, mean = (7 + 0) / 2 = 3.5, total = 2, lo = 0, prices = [7, 0], sym 'Y', n 2.
    assert run(queries, stream) == [
        match("agg", seq=2, start_seq=0, dt=50, mean=10.0, total=6, lo=0,
              prices=[10, 20, 0], sym="X", n=3),
        match("agg", seq=5, start_seq=4, dt=100, mean=3.5, total=2, lo=0,
              prices=[7, 0], sym="Y", n=2),
    ]


# ---------------------------------------------------------------- regex operators


def test_any_optional_alternation_nested_groups():
    queries = load_query_text("""
        QUERY rx FROM abc
        PATTERN ( a ( b | c . )? ( d | ( e f )+ ) )
        DEFINE a AS p = 1, b AS p = 2, c AS p = 3, d AS p = 4, e AS p = 5, f AS p = 6
    """)
    ps = [7, 1, 4, 1, 3, 4, 5, 6, 1, 2, 5, 5, 1, 5, 6, 1, 3, 1, 4]
    stream = events([{"type": "A", "p": p, "v": 0, "ts": i} for i, p in enumerate(ps)])
    # R = (d | (e f)+). Every candidate not starting at an a (p = 1) dies at once.
    # seq0 (7): no a.
    # seq1 a: c1 -> (b | c .)? R.   seq2 d: the ? is skipped, d -> accepts (1..2).
    # seq3 a: c3.   seq4 c: c3 -> . R.   seq5 d: taken by '.' -> R (not accepting).
    # seq6 e: c3 -> f (e f)*.   seq7 f: c3 -> (e f)*, accepts (3..7).
    # seq8 a: c8.   seq9 b: c8 -> R.   seq10 e: c8 -> f (e f)*.   seq11 e: not f: c8 dies.
    # seq12 a: c12.   seq13 e: ? skipped, c12 -> f (e f)*.   seq14 f: accepts (12..14).
    # seq15 a: c15.   seq16 c: c15 -> . R.   seq17 a: c15 -> R ('.'); c17 starts.
    # seq18 d: c15 accepts (a c . d) and c17 accepts (a d): earliest start wins (15..18).
    assert run(queries, stream) == [
        match("rx", seq=2, start_seq=1),
        match("rx", seq=7, start_seq=3),
        match("rx", seq=14, start_seq=12),
        match("rx", seq=18, start_seq=15),
    ]


# ---------------------------------------------------------------- earliest start wins


def test_two_candidates_accept_on_the_same_event_earliest_start_wins():
    queries = load_query_text("""
        QUERY tie FROM abc PARTITION BY v
        PATTERN ( a b c | b c )
        DEFINE a AS type = 'A', b AS type = 'B', c AS type = 'C'
        EMIT n = Count(), ps = Collect(p), first = First(p)
    """)
    stream = events([{"type": t, "p": 10 + i, "v": 7, "ts": i}
                     for i, t in enumerate(["A", "B", "C"])])
    # seq0 A: c0 -> b c.   seq1 B: c0 -> c; c1 -> c.
    # seq2 C: c0 accepts (a b c) and c1 accepts (b c) on the same event.
    #   The earliest start (c0, the longest match) is reported: n 3, ps [10, 11, 12].
    assert run(queries, stream) == [
        match("tie", seq=2, start_seq=0, key=7, n=3, ps=[10, 11, 12], first=10),
    ]


# ---------------------------------------------------------------- bad input


def test_event_time_going_backwards_in_a_partition_is_a_dead_letter():
    (query,) = load_query_text("""
        QUERY back FROM abc PARTITION BY v
        PATTERN ( a b ) DEFINE a AS type = 'A', b AS type = 'B'
    """)
    stream = events([
        {"type": "A", "p": 0, "v": 1, "ts": 10},  # seq0 partition 1: c0 -> b
        {"type": "A", "p": 0, "v": 2, "ts": 5},   # seq1 partition 2: earlier ts is fine
        {"type": "B", "p": 0, "v": 1, "ts": 9},   # seq2 partition 1: 9 < 10 -> rejected
        {"type": "B", "p": 0, "v": 1, "ts": 10},  # seq3 partition 1: c0 accepts (0..3)
    ])
    interp = MatchInterpreter(query)
    out = []
    for event in stream:
        out.extend(interp.process(event))
    # The rejected event neither kills c0 nor counts as part of the partition.
    assert out == [match("back", seq=3, start_seq=0, key=1)]
    assert interp.dead_letters == [(stream[2], "event time goes backwards in partition 1")]
    assert interp.punctuate(100) == [] and interp.flush() == []
