"""A durable embedded broker for fault tests: tansu with `s3://tansu/` storage on a
`moto_server` (in-memory S3 on loopback), so the broker can be killed and restarted on the
same port without losing topics, records or committed offsets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.stream.broker import EmbeddedBroker, free_port, wait_for_port


@pytest.fixture
def durable_broker(tmp_path):
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    store = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                             stdout=open(tmp_path / "moto.log", "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, 30)
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
