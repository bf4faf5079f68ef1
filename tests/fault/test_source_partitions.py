"""A source topic with several partitions: the seqs follow consumption order, which a
restarted splitter would take differently; it takes the logged order again
(services/stream/splitter_order.py), so every record keeps its seq and the INTO topics equal the
reference interpreter run on the stream as stamped."""

from __future__ import annotations

import time
from collections import Counter

import orjson
import pytest

from cep_core import reference
from tests.fault.harness import Pipeline, restart


@pytest.mark.parametrize("mode,lateness_ms", [("distributed", 0), ("distributed", 5000),
                                              ("chained", 0)])
def test_splitter_killed_with_three_source_partitions(kafka_bootstrap, tmp_path, mode,
                                                      lateness_ms):
    """With a lateness, each source partition goes through the reorder buffer (the trades'
    times increase in each, so none is late) and seqs follow release order.

    Every fault point is set by the pipeline's progress, not by timing. The splitter's
    periodic checkpoints are off (it checkpoints when stopped), and the producer stops
    after 300, 600 and 900 events until the test lets it go on. Once the splitter has
    taken the first 300 (its keyed frames log them), a graceful restart checkpoints there
    (with a lateness, with events waiting in the reorder buffer). Once it has taken 600
    it is killed: every step since the checkpoint is logged and not checkpointed. Once it
    has taken 900 it is killed again, and while it is down the producer writes the rest
    and every partition's end-of-input marker: the restarted splitter takes the logged
    steps of both earlier lives again, then a backlog of all three partitions up to their
    markers (which the consumer returns a partition at a time). The chained pipeline logs
    its steps' order on the keyed topic too (and nothing else goes there)."""
    splitter, started = ("chained", "chained_started") if mode == "chained" else \
        ("splitter", "splitter_started")
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=1000,
                    source_partitions=3, CEP_ALLOWED_LATENESS_MS=str(lateness_ms), mode=mode,
                    role_env={splitter: {"CEP_CHECKPOINT_MS": "3600000"}})
    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=30, pause_s=0.1, holds=[300, 600, 900])

        held = producing.wait_held()
        pipe.wait_until(lambda: pipe.has_taken(held), f"the splitter took {held} events")
        assert pipe.stop(splitter) == 0
        stopped = time.time()
        checkpoint = pipe.splitter_checkpoint()
        assert checkpoint["position"] == held and checkpoint["steps"] > 0
        pipe.start(splitter)
        pipe.wait_until(lambda: pipe.log_events(splitter, started, stopped),
                        "splitter back")
        producing.release()

        held = producing.wait_held()
        pipe.wait_until(lambda: pipe.has_taken(held), f"the splitter took {held} events")
        restart(pipe, splitter, started)
        producing.release()

        held = producing.wait_held()
        pipe.wait_until(lambda: pipe.has_taken(held), f"the splitter took {held} events")
        restart(pipe, splitter, started,
                while_down=lambda: (producing.release(), producing.join_done()))

        pipe.wait_until(pipe.ended, "end of input released", interval_s=0.5)
        pipe.stop_gracefully()  # anything repeated has landed once they have exited
        replays = pipe.log_events(splitter, "splitter_replaying")
        assert len(replays) == 2 and all(r["steps"] > 0 for r in replays)
        assert replays[1]["after_step"] == replays[0]["after_step"] == checkpoint["steps"]
        if lateness_ms:
            restored = pipe.log_events(splitter, "reorder_buffer_restored")
            assert len(restored) == 3 and all(r["waiting"] > 0 for r in restored)

        stamped = pipe.stamped()
        source = Counter(orjson.loads(line)["seqNum"] for line in pipe.lines)
        assert Counter(e.attrs["seqNum"] for e in stamped) == source  # each record once
        assert [e.seq for e in stamped] == list(range(len(stamped)))
        interleaved = [e.attrs["seqNum"] for e in stamped]
        assert interleaved != sorted(interleaved)  # the partitions really were interleaved

        found = reference.run(pipe.queries, stamped)
        got = pipe.outputs()
        for q in pipe.queries:
            want = [c for c in found if c["query"] == q.name]
            assert len(want) > 5
            assert got[q.query.output] == want, q.query.output
    finally:
        pipe.stop_all()
