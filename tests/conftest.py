"""Shared fixtures. `kafka_bootstrap`: a real Kafka-protocol broker for the session:
the one named by KAFKA_BOOTSTRAP, else a testcontainers Kafka where a Docker engine is
reachable, else the embedded tansu broker (services/stream/broker.py). `spark`: one local
Spark session for the backfill tests."""

from __future__ import annotations

import os

import pytest


def _docker_reachable() -> bool:
    if not (os.path.exists("/var/run/docker.sock") or os.environ.get("DOCKER_HOST")):
        return False
    try:
        import docker
        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap():
    named = os.environ.get("KAFKA_BOOTSTRAP")
    if named:
        yield named
        return
    if _docker_reachable():
        from testcontainers.kafka import KafkaContainer
        with KafkaContainer() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from cep_service.stream.broker import EmbeddedBroker
    broker = EmbeddedBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.kill()  # in-memory storage: nothing to lose, and a graceful stop takes ~5 s


@pytest.fixture(scope="session")
def spark():
    from cep_service.backfill.job import spark_session
    session = spark_session("local[2]", shuffle_partitions=2,
                            **{"spark.sql.files.maxPartitionBytes": "16384",
                               "spark.sql.files.openCostInBytes": "0"})
    yield session
    session.stop()
