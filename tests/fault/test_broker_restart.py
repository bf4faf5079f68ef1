"""Restart the broker mid-stream on the same port, its storage being durable (S3 on a moto
server): the services reconnect by themselves and every INTO topic equals the reference
interpreter's composite events exactly.

The restart comes at a quiet point of the stream (half of it processed, no write in flight):
tansu 0.6.0 on S3 restarted while records were being written served no fetch afterwards in
our runs (docs/reliability.md), which no client can work around."""

from __future__ import annotations

import time

from services.pipeline import wait_for
from tests.fault.harness import Pipeline, assert_exact



def test_broker_restart_mid_stream(durable_broker, tmp_path):
    # every record costs the S3-backed broker several requests to moto: few partitions,
    # no pulses (the end of input releases the windows), idle fetches that wait, 400 events
    pipe = Pipeline(durable_broker.bootstrap, tmp_path, workers=1, partitions=2,
                    checkpoint_ms=1000, limit=400, CEP_PULSE_MS="600000",
                    CEP_KAFKA_FETCH_WAIT_MAX_MS="200")
    try:
        pipe.start_all()
        wait_for(lambda: pipe.log_events("worker0", "partitions_assigned"), 90, "worker0 up")
        pipe.produce_slowly(chunk=50, pause_s=0.2, stop=200, end=False).join()
        wait_for(lambda: pipe.released() > 0, 60, "first composite events out")
        time.sleep(3.0)  # checkpoints and commits written, nothing in flight
        down = time.monotonic()
        durable_broker.stop()
        durable_broker.start()
        pipe.produce_slowly(chunk=50, pause_s=0.2, start=200)
        assert_exact(pipe)
        assert all(p.poll() is None for p in pipe.processes.values())  # nobody restarted
        print(f"broker restart -> exact result after {time.monotonic() - down:.2f} s")
    finally:
        pipe.stop_all()
