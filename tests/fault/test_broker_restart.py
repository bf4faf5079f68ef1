"""Restart the broker mid-stream on the same port, its storage being durable (S3 on a moto
server): the services (distributed, and chained) reconnect by themselves and every INTO
topic equals the reference interpreter's composite events exactly.

The broker is stopped (SIGTERM) and started again while the source is being written and the
services are sending frames and checkpoints: the producer stops after the first half of the
events until the first composite events are out, and writes the second half (and the end
of input) once the broker is down, so that holds whatever the machine's speed.

Pulses are off: tansu 0.6.0 on S3 restarted under the services' 100 ms pulses, or
SIGKILLed, served no fetch of some topics afterwards in most runs, to any consumer, new
ones included (docs/reliability.md), which no client can work around."""

from __future__ import annotations

import os
import time

import pytest

from tests.fault.harness import Pipeline, assert_exact



# the chained variant in `make test-full` (CEP_TEST_FULL=1): each run on the S3-backed
# broker takes half a minute
@pytest.mark.parametrize("mode", ["distributed", pytest.param("chained", marks=pytest.mark.skipif(
    os.environ.get("CEP_TEST_FULL") != "1", reason="CEP_TEST_FULL=1 (make test-full)"))])
def test_broker_restart_mid_stream(durable_broker, tmp_path, mode):
    # every record costs the S3-backed broker several requests to moto: few partitions,
    # no pulses (the end of input releases the windows), idle fetches that wait, 400 events
    pipe = Pipeline(durable_broker.bootstrap, tmp_path, workers=1, partitions=2,
                    checkpoint_ms=1000, limit=400, mode=mode, CEP_PULSE_MS="600000",
                    CEP_KAFKA_FETCH_WAIT_MAX_MS="200")
    try:
        pipe.start_all()
        pipe.wait_up()
        producing = pipe.produce_slowly(chunk=20, pause_s=0.3, holds=[200])
        held = producing.wait_held()
        assert pipe.released_by(held) > 0
        pipe.wait_until(lambda: pipe.released() > 0, "first composite events out")
        down = time.monotonic()
        durable_broker.stop()
        producing.release()  # written while the broker is down and coming back
        durable_broker.start()
        # every service still runs (none restarted) and stops with exit code 0
        assert_exact(pipe)
        print(f"broker restart -> exact result after {time.monotonic() - down:.2f} s")
    finally:
        pipe.stop_all()
