"""Two coordinator shards on a real broker: SIGKILL the shard that releases composite events
while the source is written (twice, restarts replaying from its checkpoint), and every
INTO topic still equals the reference interpreter's composite events exactly; the other
shard runs on undisturbed. Kills come at the producer's holds once the INTO topics hold a
seeded number of records the events so far surely give (tests/fault/test_kills.py)."""

from __future__ import annotations

import random

from cep_service.stream.control import horizon
from tests.fault.harness import Pipeline, after_released, assert_exact, restart
from tests.fault.test_kills import kill_point


def test_one_of_two_coordinator_shards_killed(kafka_bootstrap, tmp_path):
    rng = random.Random(16)
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=2, checkpoint_ms=2000, coordinators=2)
    try:
        assert pipe.roles[-2:] == ["coordinator0", "coordinator1"]
        shards = {q.query.output: pipe.topics.shard_of(q.query.output) for q in pipe.queries}
        assert sorted(shards.values()) == [0, 1]
        eager = next(q.query.output for q in pipe.queries if horizon(q) == 0)
        victim = f"coordinator{shards[eager]}"  # the shard that releases while input flows
        pipe.start_all()
        pipe.wait_until(lambda: pipe.log_events("worker0", "partitions_assigned"), "worker0 up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[600, 900])
        held = producing.wait_held()
        after_released(pipe, kill_point(rng, pipe, held))
        restart(pipe, victim, "coordinator_restored", while_down=producing.release)
        second = producing.wait_held()
        after_released(pipe, kill_point(rng, pipe, second, pipe.released_by(held) + 1))
        restart(pipe, victim, "coordinator_restored", while_down=producing.release)
        assert_exact(pipe)
        restored = pipe.log_events(victim, "coordinator_restored")
        assert any(r["checkpoint"] for r in restored[1:])
        assert {r["shard"] for r in restored} == {shards[eager]}
        survivor = f"coordinator{1 - shards[eager]}"
        assert len(pipe.log_events(survivor, "coordinator_restored")) == 1
    finally:
        pipe.stop_all()
