"""The embedded broker starts, takes records and gives them back, and stops cleanly."""

from confluent_kafka import Consumer, Producer, TopicPartition

from cep_service.stream.broker import EmbeddedBroker, wait_for_port


def test_embedded_broker_round_trip_and_restart_on_same_port():
    broker = EmbeddedBroker().start()
    try:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(100):
            producer.produce("roundtrip", key=str(i % 3).encode(), value=str(i).encode())
        assert producer.flush(10) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t",
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition("roundtrip", p, 0) for p in range(4)])
        seen = []
        for _ in range(50):
            for m in consumer.consume(200, timeout=0.2):
                assert m.error() is None
                seen.append(int(m.value()))
            if len(seen) == 100:
                break
        consumer.close()
        assert sorted(seen) == list(range(100))
        port = broker.port
        broker.stop()
        broker = EmbeddedBroker(port=port).start()
        wait_for_port("127.0.0.1", port, 1)
    finally:
        broker.stop()
