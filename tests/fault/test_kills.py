"""SIGKILL the services of a real `cep serve` pipeline (distributed, and chained)
mid-stream, restart them, and check that every INTO topic equals the reference
interpreter's composite events exactly: nothing lost, nothing repeated, same order
(docs/reliability.md, "Checkpoints and effectively-once output"). The producer stops at
fixed points of the source until the test lets it go on, and a kill comes at such a point
once the INTO topics hold a seeded random number of records that the events written so
far surely give: so every kill comes while the source is being written and after output
was released, whatever the machine's speed; the producer goes on while the killed process
is down. Checkpoints are 2 s apart, so restarts replay output that was already released."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cep_service.stream.broker import free_port
from tests.fault.harness import ROOT, Pipeline, after_released, assert_exact, restart


def kill_point(rng: random.Random, pipe: Pipeline, held: int, low: int = 1) -> int:
    """A seeded random number of composite events (at least `low`) that the first `held`
    events surely give."""
    high = pipe.released_by(held)
    assert high >= 1, held
    return rng.randint(min(low, high), high)


# Deliberately like test_splitter_and_coordinator_killed below: each fault test sets up its
# own pipeline (workers, seed) and kills its own process
def test_worker_killed_three_times(kafka_bootstrap, tmp_path):
    rng = random.Random(20261121)
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=2, checkpoint_ms=2000)
    try:
        pipe.start_all()
        pipe.wait_until(lambda: pipe.log_events("worker0", "partitions_assigned"), "worker0 up")
        mine = pipe.log_events("worker0", "partitions_assigned")[-1]["partitions"]
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[300, 600, 900])
        recoveries = []  # each kill comes before the last composite events are out
        low = 1
        for _ in range(3):
            held = producing.wait_held()
            after_released(pipe, kill_point(rng, pipe, held, low))
            if not recoveries:  # so that worker1 takes over from a snapshot
                pipe.wait_until(lambda: set(mine) <= pipe.snapshotted(),
                                "snapshots of worker0's partitions")
            low = pipe.released_by(held) + 1
            recoveries.append(restart(pipe, "worker0", "partitions_assigned",
                                      while_down=producing.release))
        assert_exact(pipe)
        restored = [o for e in pipe.log_events("worker0", "partitions_assigned")
                    + pipe.log_events("worker1", "partitions_assigned") for o in e["offsets"]]
        assert any(o > 0 for o in restored)  # some partitions resumed from a checkpoint
        print(f"worker kill -> partitions assigned again: {[round(r, 2) for r in recoveries]} s")
    finally:
        pipe.stop_all()


# Deliberately like test_worker_killed_three_times above: its own pipeline and kills
def test_splitter_and_coordinator_killed(kafka_bootstrap, tmp_path):
    rng = random.Random(11)
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=2000)
    try:
        pipe.start_all()
        pipe.wait_until(lambda: pipe.log_events("worker0", "partitions_assigned"), "worker0 up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[600, 900])
        held = producing.wait_held()
        after_released(pipe, kill_point(rng, pipe, held))
        coordinator = [restart(pipe, "coordinator", "coordinator_restored")]
        # killed while the source is being written: the producer waits until it is down
        splitter = restart(pipe, "splitter", "splitter_started", while_down=producing.release)
        second = producing.wait_held()
        after_released(pipe, kill_point(rng, pipe, second, pipe.released_by(held) + 1))
        coordinator.append(restart(pipe, "coordinator", "coordinator_restored",
                                   while_down=producing.release))
        assert_exact(pipe)
        restored = pipe.log_events("coordinator", "coordinator_restored")
        assert any(r["checkpoint"] for r in restored[1:])
        resumed = pipe.log_events("splitter", "splitter_started")
        assert resumed[-1]["next_position"] > 0  # resumed from its checkpoint
        print(f"coordinator kill -> restored: {[round(r, 2) for r in coordinator]} s; "
              f"splitter kill -> started: {splitter:.2f} s")
    finally:
        pipe.stop_all()


@pytest.mark.parametrize("mode", ["distributed", "chained"])
def test_serve_all_restarts_a_killed_worker(kafka_bootstrap, tmp_path, mode):
    """`cep serve all` restarts a process that dies (a worker; the chained process); the
    restarted one resumes from its checkpoint and the result is still exact."""
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=2000)
    role, ready = ("worker", "partitions_assigned") if mode == "distributed" else \
        ("chained", "chained_started")
    log = open(tmp_path / "all.log", "wb")
    serve = subprocess.Popen([sys.executable, "-m", "cep_service.cli.main", "serve", "all",
                              "--workers", "1", "--web-port", str(free_port())]
                             + (["--distributed"] if mode == "distributed" else []),
                             env=pipe.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    codes = []

    def stop() -> None:  # `cep serve all` stops its children itself
        serve.send_signal(signal.SIGTERM)
        pipe.wait_until(lambda: serve.poll() is not None, "cep serve all to stop")
        codes.append(serve.returncode)

    try:
        pipe.wait_until(lambda: pipe.log_events("all", ready), f"{role} up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[600])
        held = producing.wait_held()
        after_released(pipe, kill_point(random.Random(3), pipe, held))
        started = pipe.log_events("all", "started_all")[0]["processes"]
        victim = next(p["pid"] for p in started if p["role"] == role)
        os.killpg(victim, signal.SIGKILL)
        killed = time.time()
        producing.release()
        pipe.wait_until(lambda: pipe.log_events("all", ready, killed), f"{role} restarted")
        assert pipe.log_events("all", "process_restarted", killed)[0]["role_of"] == role
        assert_exact(pipe, stop)
    finally:
        if not codes:
            stop()
        log.close()
    assert codes == [0]


def test_chained_killed_three_times(kafka_bootstrap, tmp_path):
    """The chained pipeline (one process: every core and the source offsets in one cut)
    SIGKILLed three times while the source is written and after output was released:
    each restart restores the newest cut, replays the source from its offsets, and drops
    the composite events already out, so the INTO topics equal the reference exactly."""
    rng = random.Random(33)
    pipe = Pipeline(kafka_bootstrap, tmp_path, mode="chained", checkpoint_ms=2000)
    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3, holds=[300, 600, 900])
        recoveries = []
        low = 1
        for _ in range(3):
            held = producing.wait_held()
            after_released(pipe, kill_point(rng, pipe, held, low))
            if not recoveries:  # so that the first restart has a cut to restore
                pipe.wait_until(lambda: pipe.splitter_checkpoint() is not None, "a cut")
            low = pipe.released_by(held) + 1
            # Deliberately like tests/fault/test_recognize_kill.py's kill loop: each test states its
            # own cut and count of restores
            recoveries.append(restart(pipe, "chained", "chained_started",
                                      while_down=producing.release))
        assert_exact(pipe)
        restored = pipe.log_events("chained", "chained_restored")
        assert len(restored) == 4 and all(r["checkpoint"] for r in restored[1:])
        print(f"chained kill -> started: {[round(r, 2) for r in recoveries]} s")
    finally:
        pipe.stop_all()
