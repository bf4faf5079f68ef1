"""A durable embedded broker for fault tests: tansu with `s3://tansu/` storage on a
`moto_server` (in-memory S3 on loopback), so the broker can be killed and restarted on the
same port without losing topics, records or committed offsets. moto_server is waited for
as long as it works (its CPU time moves), not for a fixed time (tests/fault/harness.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cep_service.stream.broker import EmbeddedBroker, free_port
from cep_service.stream.pipeline import wait_progressing
from tests.fault.harness import STALL_S


def cpu_ticks(pid: int) -> int | None:
    """CPU time (clock ticks, user and system) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def durable_broker(tmp_path):
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    store = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                             stdout=open(tmp_path / "moto.log", "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        wait_progressing(lambda: listening(port) or store.poll() is not None,
                         lambda: cpu_ticks(store.pid), "moto_server listening",
                         stall_s=STALL_S)
        assert store.poll() is None, f"moto_server exited ({store.returncode})"
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": f"http://127.0.0.1:{port}",
               "AWS_ALLOW_HTTP": "true"}
        import boto3
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT"], region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test"
                     ).create_bucket(Bucket="tansu")
        broker = EmbeddedBroker(storage="s3://tansu/", env=env, log=tmp_path / "broker.log")
        broker.start()
        try:
            yield broker
        finally:
            broker.kill()
    finally:
        store.kill()
        store.wait()
