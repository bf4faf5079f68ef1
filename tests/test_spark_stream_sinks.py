"""The Spark streaming job's pieces that need no Spark: the Kafka sink writes a micro-batch
once however often it is run (a run cut short, a run again after a restart), places keys
where librdkafka's murmur2 partitioner does; the sequencer's carry; a snapshot cut down to
the queries kept across a change of queries restores into engines made for them; the
packed rows (routing in the source, back in order)."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pyarrow as pa

from cep_core.checker import load_queries
from cep_core.composite_batch import to_dicts
from cep_core.event_reader import read_table
from cep_core.runner import new_engines
from cep_service.spark_stream.keyed_state import kept_snapshot
from cep_service.spark_stream.sequencer import Carry, CarryStore, Sequencer
from cep_service.spark_stream.sinks import KafkaSink, murmur2_partition

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _rows(n: int, query: str = "q") -> pa.Table:
    keys = [orjson.dumps(f"k{i % 7}").decode() for i in range(n)]
    return pa.table({
        "kind": ["composite"] * n, "query": [query] * n,
        "query_index": pa.array([0] * n, pa.int32()), "key": keys,
        "seq": pa.array(range(n), pa.int64()), "start_seq": pa.array(range(n), pa.int64()),
        "reason": pa.nulls(n, pa.string()),
        "body": [orjson.dumps({"query": query, "key": orjson.loads(k), "seq": i}).decode()
                 for i, k in enumerate(keys)]})


def test_kafka_sink_writes_each_batch_once(kafka_bootstrap):
    from cep_service.stream.kafka import KafkaSettings, ensure_topics, read_all

    settings = KafkaSettings.from_env(kafka_bootstrap)
    topic = f"sink_{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {topic: 3})
    sink = KafkaSink(kafka_bootstrap, {"q": topic})
    batch = _rows(40)
    sink.write(batch.slice(0, 11), 5)  # a run of batch 5 cut short after 11 rows
    sink.write(batch, 5)  # batch 5 again, whole
    sink.write(batch, 5)
    sink.write(batch.slice(0, 3), 4)  # an older batch: all there already
    messages = read_all(settings, topic)
    assert sorted(m.value() for m in messages) == sorted(b.encode() for b in
                                                          batch.column("body").to_pylist())
    sink.write(_rows(5), 6)  # the next batch goes out
    assert len(read_all(settings, topic)) == 45
    for m in messages:  # where librdkafka's murmur2 partitioner puts the key
        assert m.partition() == murmur2_partition(m.key(), 3)


def test_murmur2_as_librdkafka(kafka_bootstrap):
    from cep_service.stream.kafka import KafkaSettings, ensure_topics, read_all

    settings = KafkaSettings.from_env(kafka_bootstrap)
    topic = f"murmur_{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, {topic: 5})
    producer = settings.producer()  # partitioner murmur2_random, as the service's
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b'"AAPL"', b"null", b'["x",1]',
            "ünïcode".encode()] + [f"key-{i}".encode() for i in range(40)]
    for key in keys:
        producer.produce(topic, b"v", key=key)
    producer.flush(30)
    for m in read_all(settings, topic):
        assert m.partition() == murmur2_partition(m.key() or b"", 5), m.key()


def test_carry_goes_on_from_step_to_step(tmp_path):
    queries = load_queries(EXAMPLES / "finance.cep")
    store = CarryStore(str(tmp_path))
    store.put({"0": 0}, Carry())
    lines = (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
    first = Sequencer(queries[0].schema, store.get({"0": 0}))
    one = first.messages(lines[:5] + [b"{bad"], None, 0, "trades")
    store.put({"0": 6}, first.carry)
    second = Sequencer(queries[0].schema, store.get({"0": 6}))
    two = second.messages(lines[5:8], None, 0, "trades")
    assert one.column("seq").to_pylist() == [0, 1, 2, 3, 4, 5]
    assert one.column("__cep_kind").to_pylist() == ["event"] * 5 + ["dead"]
    assert two.column("seq").to_pylist() == [6, 7, 8]
    assert second.carry.time == orjson.loads(lines[7])["ts"]
    assert second.end(0, 2) is None and second.end(1, 2).column("seq").to_pylist() == [9]


def test_kept_snapshot_restores_the_kept_queries():
    queries = load_queries(EXAMPLES / "finance.cep")  # mshape (MATCH), activity (WINDOW)
    table, _ = read_table(EXAMPLES / "data" / "trades.jsonl", queries[0].schema)
    whole, encoder = new_engines(queries)
    want = to_dicts(whole.process_columns(encoder.from_arrow(table)))
    want += to_dicts(whole.flush_columns())
    for kept in (["activity"], ["mshape"]):
        first, encoder = new_engines(queries)
        to_dicts(first.process_columns(encoder.from_arrow(table.slice(0, 500))))
        chosen = [q for q in queries if q.name in kept]
        after, encoder = new_engines(chosen)
        groupings = set(after.windows.groupings) if after.windows is not None else set()
        after.restore(kept_snapshot(first.snapshot(), set(kept), groupings))
        got = to_dicts(after.process_columns(encoder.from_arrow(table.slice(500))))
        got += to_dicts(after.flush_columns())
        assert got and not after.failed
        assert sorted(map(orjson.dumps, got)) == sorted(
            orjson.dumps(c) for c in want if c["query"] in kept and c["seq"] >= 500)


def test_fingerprint_is_the_query_text():
    from cep_service.spark_stream.keyed_state import fingerprint

    text = "QUERY a FROM trades PATTERN ( . up+ )\nDEFINE up AS price > Last(price);"
    same = "-- a comment line\nQUERY a  FROM trades\n  PATTERN ( . up+ )\n" \
           "DEFINE up AS price > Last(price);\n-- the next query's comment"
    assert fingerprint(text) == fingerprint(same)
    assert fingerprint(text) != fingerprint(text.replace("up+", "up*"))


def test_packed_rows_route_and_come_back_in_order():
    """The source's packing (packed.py): each event to one shard of each group by its keys
    (the same shard for the same key), an end of input to every shard, dead letters to
    their own key; a shard's packed rows read back in the sequencer's order; results
    through IPC and back."""
    from cep_service.spark_stream.packed import (
        DEAD_GROUP, GROUP, SHARD, SLOT, Packer, Route, from_ipc, pack_results,
        unpack_results, unpack_rows)

    queries = load_queries(EXAMPLES / "finance.cep")
    lines = (EXAMPLES / "data" / "trades.jsonl").read_bytes().splitlines()
    sequencer = Sequencer(queries[0].schema, Carry())
    packer = Packer([Route('["symbol"]', ("symbol",), 2, (5, 7)), Route("[]", (), 1)])
    batches = [packer.pack(sequencer.messages(lines[:40] + [b"{bad"], None, 0, "trades")),
               packer.pack(sequencer.end(0, 1)),
               packer.pack(sequencer.messages(lines[40:90], None, 0, "trades"))]
    by_key: dict = {}
    for batch in reversed(batches):  # any order: the part numbers decide
        frame = batch.to_pandas()
        assert set(frame[SLOT]) <= {0, 5, 7}
        for i in range(len(frame)):
            key = (frame[GROUP][i], int(frame[SHARD][i]))
            by_key.setdefault(key, []).append(frame.iloc[[i]])
    assert set(by_key) == {('["symbol"]', 0), ('["symbol"]', 1), ("[]", 0), (DEAD_GROUP, 0)}
    everything = unpack_rows(by_key[("[]", 0)])
    assert everything.column("__cep_kind").to_pylist() == ["event"] * 40 + ["end"] + ["event"] * 50
    assert everything.column("seq").to_pylist() == [*range(40), 41, *range(41, 91)]
    shards = {s: unpack_rows(by_key[('["symbol"]', s)]) for s in (0, 1)}
    symbols = [set(t.filter(pa.compute.equal(t.column("__cep_kind"), "event"))
                   .column("symbol").to_pylist()) for t in shards.values()]
    assert not symbols[0] & symbols[1]
    assert sum(t.num_rows for t in shards.values()) == 90 + 2  # the end in both
    for table in shards.values():
        seqs = table.column("seq").to_pylist()
        assert seqs == sorted(seqs)
    dead = unpack_rows(by_key[(DEAD_GROUP, 0)])
    assert dead.column("seq").to_pylist() == [40]
    rows = _rows(5)
    packed = pa.Table.from_pandas(pack_results(rows), preserve_index=False)
    back = unpack_results(packed)
    assert back.to_pylist() == rows.cast(back.schema).to_pylist()
    assert unpack_results(packed.slice(0, 0)).num_rows == 0
    assert from_ipc(packed.column(0)[0].as_py()).num_rows == 5
