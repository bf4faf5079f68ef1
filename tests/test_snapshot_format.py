"""The snapshot envelope (cep_core/snapshot_format.py): what is written, how unversioned
bytes are recognised, and the refusals with what was found and what to do."""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson
import pytest

import cep_core as cep
from cep_core import snapshot_format as fmt
from cep_core.snapshot_format import SnapshotError
from cep_service.stream.partition import PartitionState

V0 = Path(__file__).resolve().parent / "fixtures" / "snapshots" / "v0"
V1 = V0.parent / "v1"
RISE = """QUERY rise FROM trades PARTITION BY symbol PATTERN (. b+)
DEFINE b AS price > Last(price) EMIT symbol = symbol, n = Count();"""


def test_a_binary_snapshot_is_a_header_line_then_the_payload():
    data = fmt.pack("partition", b"\x00payload")
    before, after = b'{"cep_snapshot":"partition","format":2,"crc32":"', \
        b'","length":8}\n\x00payload'
    assert data == before + b"%08x" % zlib.crc32(before + after) + after  # all but itself
    assert fmt.describe(data) == ("partition", 2)
    assert bytes(fmt.unpack("partition", data)) == b"\x00payload"
    named = fmt.pack("partition", b"x", stream="trades", partition=3, generation=7)
    assert named.split(b"\n")[0].endswith(
        b'"length":1,"stream":"trades","partition":3,"generation":7}')
    assert fmt.read("partition", named, stream="trades", partition=3)[0] == fmt.Envelope(
        "partition", 2, True, "trades", 3, None, 7)


def test_a_json_checkpoint_stays_json_with_the_envelope_first():
    data = fmt.pack_json("splitter", {"position": 3, "offsets": {"0": 7}})
    assert data.startswith(b'{"cep_snapshot":"splitter","format":2,"crc32":"')
    assert data[55:] == b'","position":3,"offsets":{"0":7}}'
    assert orjson.loads(data)["offsets"] == {"0": 7}  # Kafka commit metadata: text
    assert fmt.unpack_json("splitter", data) == {"position": 3, "offsets": {"0": 7}}
    assert fmt.unpack_json("splitter", data.decode()) == {"position": 3, "offsets": {"0": 7}}


@pytest.mark.parametrize("name, kind", [
    ("engine-mshape.bin", "engine"), ("engine-activity.bin", "engine"),
    ("stream-finance.bin", "stream"), ("partition-0.bin", "partition")])
def test_unversioned_snapshots_are_version_0_with_the_same_layout(name, kind):
    old = (V0 / name).read_bytes()
    assert fmt.describe(old) is None
    assert bytes(fmt.unpack(kind, old)) == old  # 0 -> 1 changed nothing but the envelope
    assert fmt.describe((V1 / name).read_bytes()) == (kind, 1)


def test_unversioned_checkpoints_are_version_0():
    splitter = (V0 / "splitter.json").read_bytes()
    assert fmt.unpack_json("splitter", splitter) == orjson.loads(splitter)
    coordinator = (V0 / "coordinator.json").read_bytes()
    assert fmt.unpack_json("coordinator", coordinator) == orjson.loads(coordinator)
    with pytest.raises(SnapshotError, match="not a snapshot of kind 'coordinator': no envelope"):
        fmt.unpack_json("coordinator", splitter)  # each kind knows its own version 0


def test_a_snapshot_of_another_kind_is_refused():
    with pytest.raises(SnapshotError) as error:
        PartitionState(0, "trades", None).restore((V1 / "engine-mshape.bin").read_bytes())
    assert str(error.value) == ("expected a snapshot of kind 'partition', found one of kind "
                                "'engine' (format 1)")


def test_an_unknown_kind_is_refused_naming_the_kinds_this_release_reads():
    data = b'{"cep_snapshot":"gadget","format":1,"length":2}\nab'
    with pytest.raises(SnapshotError) as error:
        fmt.unpack("engine", data)
    assert str(error.value) == (
        "expected a snapshot of kind 'engine', found one of kind 'gadget' (format 1), which "
        "this release does not know (it reads engine, engines, stream, partition, splitter, "
        "coordinator; a newer release wrote it?)")
    with pytest.raises(ValueError, match="no binary snapshot kind 'splitter'"):
        fmt.unpack("splitter", data)  # a caller asking for a kind the wrong way


def test_a_newer_version_is_refused_with_what_to_do():
    stream = cep.compile(RISE).stream()
    newer = fmt.pack("stream", b"x").replace(b'"format":2', b'"format":3')
    with pytest.raises(SnapshotError) as error:
        stream.restore(newer)
    assert str(error.value) == (
        "this stream snapshot has format version 3; this release reads stream format "
        "versions 0 to 2. A newer release wrote it: run that release or a newer one, or "
        "replay the input from its beginning into new engines")
    newer = fmt.pack_json("coordinator", {"offsets": []}).replace(b'"format":2',
                                                                   b'"format":7')
    with pytest.raises(SnapshotError, match="coordinator snapshot has format version 7; .*"
                       "delete the topics and consumer groups cep.<stream>.*"):
        fmt.unpack_json("coordinator", newer)


def test_truncated_snapshots_are_refused():
    whole = (V1 / "partition-1.bin").read_bytes()
    with pytest.raises(SnapshotError) as error:
        PartitionState(1, "trades", None).restore(whole[:-10])
    size = len(whole) - whole.index(b"\n") - 1
    assert str(error.value) == (f"this partition snapshot is truncated: its header says "
                                f"{size} bytes follow it, {size - 10} do")
    with pytest.raises(SnapshotError, match="longer than its header says"):
        fmt.unpack("partition", whole + b"x")
    with pytest.raises(SnapshotError, match="its header ends without a length"):
        fmt.unpack("partition", whole[:45])
    with pytest.raises(SnapshotError, match="its header is incomplete"):
        fmt.unpack("partition", whole[:24])
    with pytest.raises(SnapshotError, match="truncated: 9 bytes, not even a whole header"):
        fmt.unpack("partition", whole[:9])
    with pytest.raises(SnapshotError, match="splitter checkpoint is truncated or damaged"):
        fmt.unpack_json("splitter", (V1 / "splitter.json").read_bytes()[:-3])


def test_a_header_whose_length_is_no_number_is_refused():
    # Its checksum holds (made to look so): the length is still checked, not compared.
    before = b'%s%s","format":%d,"crc32":"' % (fmt.MAGIC, b"engine", fmt.KINDS["engine"].version)
    for after, said in [(b'"}\n', "None"), (b'","length":"7"}\n', "'7'"),
                        (b'","length":true}\n', "True")]:
        with pytest.raises(SnapshotError, match=f"this engine snapshot is damaged: its "
                           f"header's length is {said}, not a number of bytes"):
            fmt.unpack("engine", fmt._sealed(before, after, b"payload"))


def test_bytes_that_are_no_snapshot_are_refused():
    with pytest.raises(SnapshotError) as error:
        fmt.unpack("engine", b"GARBAGE")
    assert str(error.value) == (
        "not a snapshot of kind 'engine': no envelope ({\"cep_snapshot\":\"...) and not the "
        "beginning of an unversioned one (first bytes b'GARBAGE', 7 bytes in all)")
    with pytest.raises(SnapshotError, match="not a snapshot of kind 'partition'"):
        fmt.unpack("partition", b"")
    with pytest.raises(SnapshotError, match="not a snapshot of kind 'partition'"):
        fmt.unpack("partition", b"\x00\x00\x00\xff{}")  # a length past the end


def test_migrations_run_in_order_from_the_version_found():
    steps = []
    kind = fmt.Kind("probe", 3, False, lambda data: False, fmt.REPLAY)
    fmt.KINDS["probe"] = kind
    try:
        for version in range(3):
            fmt.migration("probe", version)(
                lambda payload, v=version: steps.append(v) or payload + b"%d" % v)
        data = b'{"cep_snapshot":"probe","format":1,"length":1}\nx'
        assert bytes(fmt.unpack("probe", data)) == b"x12" and steps == [1, 2]
    finally:
        del fmt.KINDS["probe"]
        for version in range(3):
            fmt.MIGRATIONS.pop(("probe", version))
