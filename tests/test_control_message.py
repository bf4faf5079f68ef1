"""Control-topic messages: the schema, the checked query, and malicious payloads refused."""

import orjson
import pytest

from cep_core import ast
from cep_core.compiler.match import compile_match
from cep_core.control_message import (
    MAX_MESSAGE_BYTES,
    ControlMessageError,
    control_schema,
    validate,
)

RISE = """QUERY rise FROM trades PARTITION BY symbol PATTERN (a up+)
DEFINE a AS price > 0, up AS price > Last(price) EMIT symbol = symbol, n = Count()"""


def message(**fields) -> bytes:
    return orjson.dumps(fields)


def test_add_gives_the_checked_query():
    m = validate(message(op="add", name="rise", text=RISE), b"rise", stream="trades")
    assert (m.op, m.name, m.text) == ("add", "rise", RISE)
    assert m.checked.name == "rise" and isinstance(m.checked.query.body, ast.MatchQuery)
    assert orjson.loads(m.to_json()) == {"op": "add", "name": "rise", "text": RISE}


def test_remove_and_tombstone():
    assert validate(message(op="remove", name="rise")).op == "remove"
    m = validate(None, b"rise")
    assert (m.op, m.name, m.checked) == ("remove", "rise", None)
    with pytest.raises(ControlMessageError, match="without a key"):
        validate(None, None)
    with pytest.raises(ControlMessageError, match="does not match"):
        validate(None, b"../../etc/passwd")


@pytest.mark.parametrize("value,reason", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "message must be a JSON object, got an array"),
    (message(name="rise", text=RISE), "message lacks the field 'op'"),
    (message(op="drop", name="rise"), "field 'op' must be one of add, update, remove"),
    (message(op="add", name=7, text=RISE), "field 'name' must be a JSON string, got a number"),
    (message(op="add", name="", text=RISE), "field 'name' must not be empty"),
    (message(op="add", name="a b", text=RISE), "field 'name' 'a b' does not match"),
    (message(op="add", name="rise"), "message lacks the field 'text'"),
    (message(op="update", name="rise", text=""), "field 'text' must not be empty"),
    (message(op="add", name="rise", text=["QUERY"]), "field 'text' must be a JSON string"),
    (message(op="add", name="rise", text=RISE, exec="rm -rf /"),
     "message has an unknown field 'exec'"),
    (message(op="add", name="r" * 200, text=RISE), "field 'name' is longer than 128"),
    (message(op="add", name="rise", text="x" * 70_000), "field 'text' is longer than 65536"),
    (b" " * (MAX_MESSAGE_BYTES + 1), "over the limit"),
])
def test_bad_shapes_are_refused(value, reason):
    with pytest.raises(ControlMessageError, match=reason.replace("(", r"\(").replace("[", r"\[")):
        validate(value)


def test_key_must_name_the_query():
    with pytest.raises(ControlMessageError, match="has the key 'other'"):
        validate(message(op="add", name="rise", text=RISE), b"other")


PYTHON_PAYLOADS = [
    "__import__('os').system('touch {marker}')",
    "QUERY rise FROM trades PATTERN (a) DEFINE a AS __import__('os').system('touch {marker}')",
    "QUERY rise FROM trades PATTERN (a) DEFINE a AS price > 1; import os; os.system('touch "
    "{marker}')",
    "QUERY rise FROM trades PATTERN (a) DEFINE a AS eval('open(\"{marker}\", \"w\")') = 1",
    "exec(compile('open(\"{marker}\", \"w\")', 'x', 'exec'))",
]


@pytest.mark.parametrize("payload", PYTHON_PAYLOADS)
def test_python_in_the_query_text_is_refused_and_never_run(tmp_path, payload):
    marker = tmp_path / "pwned"
    text = payload.format(marker=marker)
    with pytest.raises(ControlMessageError) as refused:
        validate(message(op="add", name="rise", text=text))
    assert "<query rise>:" in str(refused.value)  # a file:line:col message
    assert not marker.exists()


def test_string_literals_never_reach_generated_code(tmp_path):
    marker = tmp_path / "pwned"
    evil = f'x" or __import__("os").system("touch {marker}") or "\\'

    text = (f"QUERY rise FROM trades PATTERN (a) DEFINE a AS symbol = '{evil}' "
            "EMIT symbol = symbol")
    m = validate(message(op="add", name="rise", text=text))
    program = compile_match(m.checked)
    assert evil not in program.source and "__import__" not in program.source
    assert evil in program.constants.values  # the literal is data, read by its code
    assert not marker.exists()


def test_the_query_must_be_one_query_of_that_name_and_stream():
    with pytest.raises(ControlMessageError, match="defines query 'rise', not 'fall'"):
        validate(message(op="add", name="fall", text=RISE))
    with pytest.raises(ControlMessageError, match="holds 2 queries"):
        validate(message(op="add", name="rise", text=RISE + ";\n" + RISE.replace("rise",
                                                                                   "fall")))
    with pytest.raises(ControlMessageError, match="reads stream 'trades'"):
        validate(message(op="add", name="rise", text=RISE), stream="bids")
    with pytest.raises(ControlMessageError, match="unknown stream"):
        validate(message(op="add", name="rise", text=RISE.replace("trades", "nosuch")))


def test_schema_file_names_the_fields_the_service_sends():
    schema = control_schema()
    assert set(schema["properties"]) == {"op", "name", "text"}
    assert schema["properties"]["op"]["enum"] == ["add", "update", "remove"]
