"""A chained `cep serve` pipeline running a MATCH_RECOGNIZE query (the Flink M-shape, whose
matches may wait behind earlier partial ones) beside examples/finance.cep's MATCH and
WINDOW queries, SIGKILLed twice while the source is written (once a cut is taken where
the source waits, with matches partial across it) and after output was released: each
restart restores that cut (the MATCH_RECOGNIZE engine's state, what the merge holds back)
and every INTO topic equals the reference interpreter's composite events exactly:
nothing lost, nothing repeated."""

from __future__ import annotations

import random

from tests.fault.harness import Pipeline, after_released, assert_exact, restart
from tests.fault.test_kills import kill_point
from tests.test_recognize_service import MR


def test_chained_killed_twice_with_a_match_recognize_query(kafka_bootstrap, tmp_path):
    rng = random.Random(32)
    pipe = Pipeline(kafka_bootstrap, tmp_path, mode="chained", checkpoint_ms=2000,
                    extra_queries="\n" + MR.format(output="mr_tops_{run}"))
    [mine] = [topic for topic in pipe.expected if topic.startswith("mr_tops_")]
    assert len(pipe.expected[mine]) > 20
    holds = [300, 900]  # matches of the MATCH_RECOGNIZE query span both (a cut's state)
    assert all(any(c["start_seq"] < hold <= c["seq"] for c in pipe.expected[mine])
               for hold in holds)
    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=holds)
        recoveries = []
        low = 1
        for _ in range(2):
            held = producing.wait_held()
            after_released(pipe, kill_point(rng, pipe, held, low))
            # a cut at the hold (the source waits there): the restart restores partial
            # matches that end after it
            pipe.wait_until(lambda held=held: (pipe.splitter_checkpoint() or {}).get(
                "position", -1) >= held, f"a cut at {held}")
            low = pipe.released_by(held) + 1
            # Deliberately like tests/fault/test_kills.py's chained kill loop: each test states its
            # own cut and count of restores
            recoveries.append(restart(pipe, "chained", "chained_started",
                                      while_down=producing.release))
        assert_exact(pipe)
        restored = pipe.log_events("chained", "chained_restored")
        assert len(restored) == 3 and all(r["checkpoint"] for r in restored[1:])
    finally:
        pipe.stop_all()
