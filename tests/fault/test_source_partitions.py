"""A source topic with several partitions: the seqs follow consumption order, which a
restarted splitter would take differently; it takes the logged order again
(services/splitter_order.py), so every record keeps its seq and the INTO topics equal the
reference interpreter run on the stream as stamped."""

from __future__ import annotations

import random
import time
from collections import Counter

import orjson
import pytest

from cep_core import reference
from services.pipeline import wait_for
from tests.fault.harness import Pipeline, after_released, restart


@pytest.mark.parametrize("lateness_ms", [0, 5000])
def test_splitter_killed_with_three_source_partitions(kafka_bootstrap, tmp_path, lateness_ms):
    """With a lateness, each source partition goes through the reorder buffer (the trades'
    times increase in each, so none is late) and seqs follow release order."""
    rng = random.Random(3)
    # checkpoints 4 s apart, steps every ~0.4 s: a kill finds steps since the checkpoint
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=4000,
                    source_partitions=3, CEP_ALLOWED_LATENESS_MS=str(lateness_ms))
    try:
        pipe.start_all()
        wait_for(lambda: pipe.log_events("worker0", "partitions_assigned"), 90, "worker0 up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.4)
        for count in sorted(rng.sample(range(3, 40), 2)):
            after_released(pipe, count)
            assert producing.is_alive()  # killed while the source is being written
            restart(pipe, "splitter", "splitter_started")
        wait_for(pipe.ended, 120, "end of input released", interval_s=0.5)
        time.sleep(1.0)  # anything repeated would land now
        replays = pipe.log_events("splitter", "splitter_replaying")
        assert any(r["steps"] > 0 for r in replays)  # logged steps were taken again

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
