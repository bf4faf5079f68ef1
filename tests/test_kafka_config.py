"""CEP_KAFKA_* variables and `--kafka-config` files reach every Kafka client the services
build (services/stream/kafka.py: producer, consumer, admin; the Faust app's credentials). A real
librdkafka client refuses an unknown value of a setting at construction, which proves the
setting reached it; valid SASL settings construct."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException

from cep_service.stream.kafka import KafkaSettings

SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.username": "cep", "sasl.password": "secret"}
FACTORIES = {"producer": lambda s: s.producer(), "consumer": lambda s: s.consumer("g"),
             "admin": lambda s: s.admin()}


def test_env_and_file_settings_are_read(tmp_path, monkeypatch):
    config = tmp_path / "client.properties"
    config.write_text("# comment\nsasl.mechanism = SCRAM-SHA-512\nsasl.username=cep\n")
    monkeypatch.setenv("CEP_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CEP_KAFKA_SASL_PASSWORD", "secret")
    settings = KafkaSettings.from_env("h:9092", config)
    assert settings.extra == {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "cep",
                              "security.protocol": "SASL_SSL", "sasl.password": "secret"}
    assert settings.base()["security.protocol"] == "SASL_SSL"


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("key,bad", [("security.protocol", "NOT_A_PROTOCOL"),
                                     ("sasl.mechanism", "NOT_A_MECHANISM")])
def test_every_client_factory_gets_the_settings(factory, key, bad, monkeypatch):
    if key.startswith("sasl."):
        monkeypatch.setenv("CEP_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("CEP_KAFKA_" + key.upper().replace(".", "_"), bad)
    settings = KafkaSettings.from_env("127.0.0.1:1")
    with pytest.raises(KafkaException, match=bad):
        FACTORIES[factory](settings)


@pytest.mark.parametrize("factory", FACTORIES)
def test_every_client_factory_builds_with_sasl(factory, tmp_path, monkeypatch):
    monkeypatch.setenv("CEP_BROKER", "kafka")  # no broker there to ask which it is
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in SASL.items()))
    client = FACTORIES[factory](KafkaSettings.from_env("127.0.0.1:1", config))
    if factory == "consumer":
        client.close()


def test_faust_app_gets_sasl_and_ssl_credentials():
    from faust.auth import SASLCredentials, SSLCredentials

    sasl = KafkaSettings("h:9092", dict(SASL)).faust_credentials()
    assert isinstance(sasl, SASLCredentials)
    assert (sasl.username, sasl.password, sasl.mechanism.value) == ("cep", "secret", "PLAIN")
    tls = KafkaSettings("h:9092", {"security.protocol": "SSL"}).faust_credentials()
    assert isinstance(tls, SSLCredentials)
    assert KafkaSettings("h:9092").faust_credentials() is None
    with pytest.raises(ValueError, match="not supported"):
        KafkaSettings("h:9092", {"security.protocol": "BOGUS"}).faust_credentials()


def test_tansu_gets_its_own_client_defaults(kafka_bootstrap, monkeypatch):
    """On tansu (cluster id tansu_cluster) producers linger 200 ms and fetches wait 100 ms
    (services/stream/kafka.py: a fetch lists every stored batch of its partitions); other
    brokers keep the low-latency defaults; CEP_KAFKA_* values win over both."""
    from cep_service.stream.kafka import TANSU_CONSUMER_DEFAULTS, TANSU_PRODUCER_DEFAULTS

    monkeypatch.delenv("CEP_BROKER", raising=False)
    settings = KafkaSettings(kafka_bootstrap)
    tansu = settings.broker_kind() == "tansu"
    linger = settings.producer_config()["linger.ms"]
    wait = settings.consumer_config("g")["fetch.wait.max.ms"]
    if tansu:
        assert (linger, wait) == (TANSU_PRODUCER_DEFAULTS["linger.ms"],
                                  TANSU_CONSUMER_DEFAULTS["fetch.wait.max.ms"])
    kafka = KafkaSettings(kafka_bootstrap, broker="kafka")
    assert kafka.producer_config()["linger.ms"] == KafkaSettings.PRODUCER_DEFAULTS["linger.ms"]
    assert kafka.consumer_config()["fetch.wait.max.ms"] == \
        KafkaSettings.CONSUMER_DEFAULTS["fetch.wait.max.ms"]
    monkeypatch.setenv("CEP_BROKER", "tansu")
    monkeypatch.setenv("CEP_KAFKA_LINGER_MS", "7")
    chosen = KafkaSettings.from_env("127.0.0.1:1")
    assert chosen.broker_kind() == "tansu"
    assert chosen.producer_config()["linger.ms"] == "7"
    assert chosen.consumer_config()["fetch.wait.max.ms"] == 100
