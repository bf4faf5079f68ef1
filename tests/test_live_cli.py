"""`cep query` and `cep stream` as a new user meets them (issue 26): a refusal of a file's
query names the file and the line and column in it (the local check, and the splitter's
refusal read back from the status topic); `list` without --stream shows every stream's
live queries, not only those of `trades`; a file that is missing or not JSON is refused
before the broker is asked.

The broker is the session's `kafka_bootstrap`; no pipeline runs: the services' status
records a test needs are written by the test, before the command reads them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from cep_core.control_message import ControlMessageError
from cep_core.errors import Problem
from cep_service.cli.live import _in_file
from cep_service.stream.live_changes import query_changes

ROOT = Path(__file__).resolve().parent.parent
# A file whose second query starts on line 4, column 4, and misspells two attributes.
FILE = """-- overheating: the first query is fine, the second is not
QUERY fine FROM trades PATTERN ( a ) DEFINE a AS price > 1;

   QUERY bad FROM trades PATTERN ( a ) DEFINE a AS prize > 1
   EMIT s = symbl;
"""


def _at(word: str) -> tuple[int, int]:
    """Line and column of `word` in FILE, as an editor numbers them."""
    for number, line in enumerate(FILE.splitlines(), 1):
        if word in line:
            return number, line.index(word) + 1
    raise AssertionError(word)


def _expected_lines(path) -> list[str]:
    prize, symbl = _at("prize"), _at("symbl")
    return [f"{path}:{prize[0]}:{prize[1]}: error: stream 'trades' has no attribute 'prize'",
            FILE.splitlines()[prize[0] - 1], " " * (prize[1] - 1) + "^",
            f"{path}:{symbl[0]}:{symbl[1]}: error: ", FILE.splitlines()[symbl[0] - 1],
            " " * (symbl[1] - 1) + "^"]


def _assert_located(said: str, path) -> None:
    lines = [line.removeprefix("    ") for line in said.splitlines()]
    expected = _expected_lines(path)
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{path}:"))
    found = lines[first:first + 6]
    assert found[0].startswith(expected[0]) and found[3].startswith(expected[3]), said
    assert [found[1], found[2], found[4], found[5]] == \
        [expected[1], expected[2], expected[4], expected[5]], said
    assert "<query bad>" not in said


def test_the_checker_s_messages_on_a_query_s_text_are_located_in_its_file():
    """What `cep query add` does with the local check's refusal (no broker: an empty
    control topic)."""
    with pytest.raises(ControlMessageError) as refused:
        query_changes("add", None, FILE, "plant.cep", None, [])
    assert "<query bad>:1:" in str(refused.value)  # the line within the query's own text
    _assert_located(_in_file(refused.value.problems, "plant.cep", FILE), "plant.cep")
    # a problem of a query the file does not hold, or with no location at all: as the
    # checker says it
    for said, problem in (("<query elsewhere>:1:5: error: nope",
                           Problem("nope", "elsewhere", 1, 5)),
                          ("query 'bad' is live already",
                           Problem("query 'bad' is live already"))):
        assert _in_file([problem], "plant.cep", FILE) == said


def test_a_file_that_cannot_be_read_is_refused_before_the_broker_is_asked(tmp_path):
    """Port 1 has no broker: asking it would fail (after a time-out), not say this."""
    missing = cep_at("127.0.0.1:1", "", "query", "add", str(tmp_path / "absent.cep"))
    assert missing.returncode == 2 and f"{tmp_path / 'absent.cep'}: no such file" in \
        missing.stderr, missing.stderr
    schema = tmp_path / "plant.json"
    cut = '{"stream": "plant", "attributes": {"temp": "int", '
    schema.write_text(cut)
    broken = cep_at("127.0.0.1:1", "", "stream", "add", str(schema))
    assert broken.returncode == 1, broken.stderr
    assert broken.stderr.startswith(f"{schema}:1:{len(cut) + 1}: error: not valid JSON: "
                                    "unexpected end of data"), broken.stderr
    schema.write_text('["plant"]')
    other = cep_at("127.0.0.1:1", "", "stream", "add", str(schema))
    assert other.returncode == 1 and "not a stream schema" in other.stderr, other.stderr


# ---------------------------------------------------------------- with a broker


def cep_at(bootstrap: str, prefix: str, *args: str,
           env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("CEP_STREAM", "CEP_DEBUG", "CEP_TOPIC_PREFIX")}
    environment.update(KAFKA_BOOTSTRAP=bootstrap, COLUMNS="200", **(env or {}))
    if prefix:
        environment["CEP_TOPIC_PREFIX"] = prefix
    return subprocess.run([sys.executable, "-m", "cep_service.cli.main", *args], env=environment,
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.fixture
def broker(kafka_bootstrap):
    from cep_service.stream.kafka import KafkaSettings
    return KafkaSettings(kafka_bootstrap, session_timeout_ms=2000)


def _say(broker, topic: str, records: list[dict]) -> None:
    """Status records as services write them (`role@host:pid`)."""
    from cep_service.stream.kafka import ensure_topics, produce

    ensure_topics(broker, {topic: 1})
    producer = broker.producer()
    for record in records:
        produce(producer, topic, orjson.dumps(record))
    assert producer.flush(30) == 0


def test_query_add_refusals_name_the_file_line_and_column(broker, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:8]}"
    path = tmp_path / "plant.cep"
    path.write_text(FILE)
    local = cep_at(broker.bootstrap, prefix, "query", "add", str(path))
    assert local.returncode == 1, local.stdout + local.stderr
    _assert_located(local.stderr, path)

    # The same refusal from the splitter, over the status topic (--no-check publishes
    # `fine` at offset 0 and `bad` at offset 1 of a new control topic): located from its
    # problems (`errors`), as a splitter writes them.
    with pytest.raises(ControlMessageError) as refused:
        query_changes("add", None, FILE, "x", None, [])
    reason = str(refused.value)[str(refused.value).index("<query bad>"):]
    splitter = {"service": "splitter@host:1", "role": "splitter"}
    _say(broker, f"{prefix}.cep.trades.status", [
        {"event": "service", "state": "up", **splitter},
        {"event": "change", "key": "query/fine", "offset": 0, "outcome": "applied", "at": 0,
         **splitter},
        {"event": "change", "key": "query/fine", "offset": 0, "outcome": "applied",
         "partitions": 1, "service": "coordinator@host:2", "role": "coordinator"},
        {"event": "change", "key": "query/bad", "offset": 1, "outcome": "refused",
         "reason": reason, "errors": [p.to_json() for p in refused.value.problems],
         **splitter}])
    remote = cep_at(broker.bootstrap, prefix, "query", "add", str(path), "--no-check",
                    "--timeout", "60")
    assert remote.returncode == 1, remote.stdout + remote.stderr
    assert "query bad: add refused by splitter@host:1:" in remote.stdout
    _assert_located(remote.stdout, path)


def test_list_without_stream_shows_every_stream(broker, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:8]}"
    trades, sensors = tmp_path / "trades.cep", tmp_path / "sensors.cep"
    trades.write_text("QUERY ups FROM trades PATTERN ( a ) DEFINE a AS price > 1;\n")
    sensors.write_text("QUERY hot FROM sensors PATTERN ( h ) DEFINE h AS value > 50.0;\n")
    for path in (trades, sensors):  # no pipeline is up: each waits on the control topic
        added = cep_at(broker.bootstrap, prefix, "query", "add", str(path))
        assert added.returncode == 0, added.stdout + added.stderr
    empty = cep_at(broker.bootstrap, prefix, "query", "list")
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no live queries: no service is up on the status topics of sensors, trades" in \
        empty.stderr, empty.stderr
    for stream, name in (("trades", "ups"), ("sensors", "hot")):
        _say(broker, f"{prefix}.cep.{stream}.status", [
            {"event": "service", "state": "up", "service": f"splitter@{stream}:1",
             "role": "splitter", "live": {"queries": {name: 0}, "streams": {}}}])

    listed = cep_at(broker.bootstrap, prefix, "query", "list")
    assert listed.returncode == 0, listed.stderr
    items = [orjson.loads(line) for line in listed.stdout.splitlines()]
    assert [(i["stream"], i["name"], i["services"]) for i in items] == [
        ("sensors", "hot", ["splitter@sensors:1"]), ("trades", "ups", ["splitter@trades:1"])]
    as_json = cep_at(broker.bootstrap, prefix, "query", "list", "--json")
    objects = [orjson.loads(line) for line in as_json.stdout.splitlines()]
    assert [(o["stream"], o["status_topic"], [s["service"] for s in o["services"]])
            for o in objects] == [
        ("sensors", f"{prefix}.cep.sensors.status", ["splitter@sensors:1"]),
        ("trades", f"{prefix}.cep.trades.status", ["splitter@trades:1"])]

    # --stream (or CEP_STREAM) still lists that stream's alone, and says where it looked
    one = cep_at(broker.bootstrap, prefix, "query", "list", "--stream", "sensors")
    assert [orjson.loads(line)["name"] for line in one.stdout.splitlines()] == ["hot"]
    none = cep_at(broker.bootstrap, prefix, "query", "list", env={"CEP_STREAM": "rfid"})
    assert none.returncode == 0 and none.stdout == ""
    assert f"no live queries on stream 'rfid' (status topic {prefix}.cep.rfid.status)" in \
        none.stderr, none.stderr

    # `cep stream list`: a stream registered on the control topic, live in both pipelines
    for stream in ("trades", "sensors"):
        _say(broker, f"{prefix}.cep.{stream}.status", [
            {"event": "service", "state": "up", "service": f"splitter@{stream}:1",
             "role": "splitter", "live": {"queries": {}, "streams": {"plant": 3}}}])
    streams = cep_at(broker.bootstrap, prefix, "stream", "list")
    assert [orjson.loads(line) for line in streams.stdout.splitlines()] == [
        {"name": "plant", "version": 3, "services": ["splitter@sensors:1",
                                                     "splitter@trades:1"]}], streams.stderr
