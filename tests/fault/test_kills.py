"""SIGKILL the services of a real `cep serve` pipeline mid-stream, restart them, and check
that every INTO topic equals the reference interpreter's composite events exactly: nothing
lost, nothing repeated, same order (docs/reliability.md, "Checkpoints and effectively-once
output"). Kills come once the INTO topics hold a seeded random number of records, and
checkpoints are 2 s apart, so every restart replays output that was already released."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from services.broker import free_port
from services.pipeline import wait_for
from tests.fault.harness import ROOT, Pipeline, after_released, assert_exact, restart


def test_worker_killed_three_times(kafka_bootstrap, tmp_path):
    rng = random.Random(20261121)
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=2, checkpoint_ms=2000)
    try:
        pipe.start_all()
        wait_for(lambda: pipe.log_events("worker0", "partitions_assigned"), 90, "worker0 up")
        pipe.produce_slowly(chunk=30, pause_s=0.3)
        recoveries = []  # each kill comes before the last composite events are out
        for count in sorted(rng.sample(range(5, 110), 3)):
            after_released(pipe, count)
            recoveries.append(restart(pipe, "worker0", "partitions_assigned"))
        assert_exact(pipe)
        restored = [o for e in pipe.log_events("worker0", "partitions_assigned")
                    + pipe.log_events("worker1", "partitions_assigned") for o in e["offsets"]]
        assert any(o > 0 for o in restored)  # some partitions resumed from a checkpoint
        print(f"worker kill -> partitions assigned again: {[round(r, 2) for r in recoveries]} s")
    finally:
        pipe.stop_all()


def test_splitter_and_coordinator_killed(kafka_bootstrap, tmp_path):
    rng = random.Random(11)
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=2000)
    try:
        pipe.start_all()
        wait_for(lambda: pipe.log_events("worker0", "partitions_assigned"), 90, "worker0 up")
        producing = pipe.produce_slowly(chunk=30, pause_s=0.3)
        first, second = sorted(rng.sample(range(5, 100), 2))
        after_released(pipe, first)
        coordinator = [restart(pipe, "coordinator", "coordinator_restored")]
        assert producing.is_alive()
        splitter = restart(pipe, "splitter", "splitter_started")
        after_released(pipe, second)
        coordinator.append(restart(pipe, "coordinator", "coordinator_restored"))
        assert_exact(pipe)
        restored = pipe.log_events("coordinator", "coordinator_restored")
        assert any(r["checkpoint"] for r in restored[1:])
        resumed = pipe.log_events("splitter", "splitter_started")
        assert resumed[-1]["next_position"] > 0  # resumed from its checkpoint
        print(f"coordinator kill -> restored: {[round(r, 2) for r in coordinator]} s; "
              f"splitter kill -> started: {splitter:.2f} s")
    finally:
        pipe.stop_all()


def test_serve_all_restarts_a_killed_worker(kafka_bootstrap, tmp_path):
    """`cep serve all` restarts a process that dies; the restarted worker resumes from its
    checkpoint and the result is still exact."""
    pipe = Pipeline(kafka_bootstrap, tmp_path, workers=1, checkpoint_ms=2000)
    log = open(tmp_path / "all.log", "wb")
    serve = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "all",
                              "--workers", "1", "--web-port", str(free_port())],
                             env=pipe.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        wait_for(lambda: pipe.log_events("all", "partitions_assigned"), 90, "worker up")
        pipe.produce_slowly(chunk=30, pause_s=0.3)
        after_released(pipe, random.Random(3).randrange(10, 100))
        started = pipe.log_events("all", "started_all")[0]["processes"]
        worker = next(p["pid"] for p in started if p["role"] == "worker")
        os.killpg(worker, signal.SIGKILL)
        killed = time.time()
        wait_for(lambda: pipe.log_events("all", "partitions_assigned", killed), 60,
                 "worker restarted")
        assert pipe.log_events("all", "process_restarted", killed)[0]["role_of"] == "worker"
        assert_exact(pipe)
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(60)
        log.close()
    assert code == 0
