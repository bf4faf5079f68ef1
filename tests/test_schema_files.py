"""User schemas from files (--schema, CEP_SCHEMA_PATH), where each came from, and JSON Schema
import (cep_core/schema_import.py, `cep schemas import`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pathlib import Path

import pytest

from cep_core.schema import SCHEMA_DIR, SchemaError, SchemaRegistry, StreamSchema
from cep_core.schema_import import SchemaImportError, stream_schema_from_json_schema

ROOT = Path(__file__).resolve().parent.parent
ORDERS = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "orders",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "amount": {"type": "number"},
        "qty": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "paid": {"type": "boolean"},
        "kind": {"enum": ["new", "cancel"]},
    },
    "required": ["id", "amount", "qty", "at", "paid", "kind"],
}


def _cep(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "cep_service.cli.main", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          cwd=cwd)


def test_built_in_schemas_live_in_the_package():
    assert SCHEMA_DIR.parent.name == "cep_core"
    assert (SCHEMA_DIR / "trades.json").is_file()
    assert (SCHEMA_DIR / "control_message.json").is_file()
    registry = SchemaRegistry()
    assert registry.origin("trades") == str(SCHEMA_DIR / "trades.json")
    assert registry.origin("no_such_stream") is None


def test_schema_path_variable_adds_files_and_directories(tmp_path, monkeypatch):
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "orders.json").write_text(json.dumps(
        stream_schema_from_json_schema(ORDERS).to_dict()))
    single = tmp_path / "trades_v2.json"
    single.write_text(json.dumps({"stream": "trades", "attributes": {"p": "int", "t": "int"},
                                  "time": "t"}))
    monkeypatch.setenv("CEP_SCHEMA_PATH", os.pathsep.join([str(folder), str(single)]))
    registry = SchemaRegistry()
    assert registry.origin("orders") == str(folder / "orders.json")
    assert registry.get("trades").attributes == {"p": "int", "t": "int"}  # before built-in
    assert registry.origin("trades") == str(single)
    assert "orders" in registry.names() and "abc" in registry.names()


def test_options_come_before_the_variable(tmp_path, monkeypatch):
    def trades(where, price):
        where.mkdir(exist_ok=True)
        path = where / "trades.json"
        path.write_text(json.dumps({"stream": "trades", "attributes": {
            "price": price, "t": "int"}, "time": "t"}))
        return path

    from_env = trades(tmp_path / "env", "float")
    monkeypatch.setenv("CEP_SCHEMA_PATH", str(from_env))  # a file on the variable
    registry = SchemaRegistry()
    registry.add_path(trades(tmp_path / "option", "string").parent)  # a folder by option
    assert registry.get("trades").attributes["price"] == "string"
    assert registry.origin("trades") == str(tmp_path / "option" / "trades.json")


def test_schema_path_variable_naming_nothing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CEP_SCHEMA_PATH", str(tmp_path / "missing"))
    with pytest.raises(SchemaError, match="CEP_SCHEMA_PATH.*missing"):
        SchemaRegistry()


def test_explicit_directories_ignore_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("CEP_SCHEMA_PATH", str(tmp_path / "missing"))
    assert SchemaRegistry([tmp_path]).names() == []


def test_json_schema_maps_to_a_stream_schema():
    schema = stream_schema_from_json_schema(ORDERS, type_attribute="kind")
    assert schema == StreamSchema(
        "orders", {"id": "string", "amount": "float", "qty": "int", "at": "timestamp",
                   "paid": "bool", "kind": "string"}, "at", "ms", "kind", ("new", "cancel"))


def test_integer_time_property_becomes_a_timestamp_in_the_given_unit():
    document = {"type": "object", "properties": {"v": {"type": "integer"},
                                                  "t": {"type": "integer"}},
                "required": ["v", "t"]}
    schema = stream_schema_from_json_schema(document, "ints", time="t", time_unit="s")
    assert schema.attributes == {"v": "int", "t": "timestamp"}
    assert (schema.time, schema.time_unit) == ("t", "s")


@pytest.mark.parametrize("spec, reason", [
    ({"type": "object", "properties": {"x": {"type": "integer"}}}, "nested object"),
    ({"type": "array", "items": {"type": "integer"}}, "an array"),
    ({"type": ["integer", "null"]}, "union of types"),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "anyOf"),
    ({"$ref": "#/$defs/money"}, r"\$ref"),
    ({"description": "anything"}, "no type"),
])
def test_what_cannot_map_is_named(spec, reason):
    document = {**ORDERS, "properties": {**ORDERS["properties"], "bad": spec},
                "required": [*ORDERS["required"], "bad"], "$defs": {"money": {}}}
    with pytest.raises(SchemaImportError, match=f"bad: .*{reason}"):
        stream_schema_from_json_schema(document)


def test_optional_properties_are_an_error_unless_skipped():
    document = {**ORDERS, "properties": {**ORDERS["properties"], "note": {"type": "string"}}}
    with pytest.raises(SchemaImportError, match="note: not in required"):
        stream_schema_from_json_schema(document)
    assert "note" not in stream_schema_from_json_schema(document, skip_optional=True).attributes


@pytest.mark.parametrize("document, message", [
    ({"type": "string"}, '"type": "object"'),
    ({**ORDERS, "title": "my orders"}, "not an identifier"),
    ({**ORDERS, "properties": {**ORDERS["properties"], "at": {"type": "string"}}},
     "no date-time property.*qty"),
    ({**ORDERS, "type": 5}, "not a valid JSON Schema"),
])
def test_documents_that_cannot_be_a_stream(document, message):
    with pytest.raises(SchemaImportError, match=message):
        stream_schema_from_json_schema(document)


def test_cli_import_then_use_the_schema(tmp_path):
    source = tmp_path / "orders.schema.json"
    source.write_text(json.dumps(ORDERS))
    out = tmp_path / "schemas" / "orders.json"
    out.parent.mkdir()
    made = _cep("schemas", "import", str(source), "--out", str(out), "--type-attribute", "kind")
    assert made.returncode == 0, made.stderr
    assert json.loads(out.read_text())["types"] == ["new", "cancel"]
    queries = tmp_path / "big.cep"
    queries.write_text("QUERY big FROM orders INTO big_orders\nPATTERN ( big )\n"
                       "DEFINE big AS amount > 100.0 AND paid\nEMIT id = id;\n")
    events = tmp_path / "orders.jsonl"
    events.write_text("\n".join(json.dumps(
        {"id": f"o{i}", "amount": 50.0 * i, "qty": 1, "at": f"2026-11-25T10:00:0{i}Z",
         "paid": i != 3, "kind": "new"}) for i in range(5)) + "\n")
    by_env = _cep("run", str(queries), "--events", str(events),
                  env={"CEP_SCHEMA_PATH": str(out.parent)})
    assert by_env.returncode == 0, by_env.stderr
    assert [json.loads(line)["id"] for line in by_env.stdout.splitlines()] == ["o4"]
    by_option = _cep("check", str(queries), "--schema", str(out))
    assert by_option.returncode == 0, by_option.stderr
    listed = _cep("schemas", "--json", env={"CEP_SCHEMA_PATH": str(out)})
    rows = {row["stream"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows["orders"]["origin"] == str(out)
    assert rows["trades"]["origin"] == str(SCHEMA_DIR / "trades.json")


def test_cli_import_names_what_cannot_map(tmp_path):
    source = tmp_path / "nested.json"
    source.write_text(json.dumps({**ORDERS, "properties": {
        **ORDERS["properties"], "who": {"type": "object"}}, "required": [*ORDERS["required"],
                                                                        "who"]}))
    result = _cep("schemas", "import", str(source))
    assert result.returncode == 1
    assert "who: a nested object" in result.stderr


def test_check_json_reports_each_file(tmp_path):
    bad = tmp_path / "bad.cep"
    bad.write_text("QUERY q FROM nowhere INTO x\nPATTERN ( a )\nDEFINE a AS v > 1;\n")
    result = _cep("check", "--json", "examples/finance.cep", str(bad), cwd=ROOT)
    assert result.returncode == 1
    good, failed = map(json.loads, result.stdout.splitlines())
    assert good == {"file": "examples/finance.cep", "ok": True, "queries": [
        {"name": "mshape", "stream": "trades", "into": "double_tops"},
        {"name": "activity", "stream": "trades", "into": "trade_stats"}]}
    assert failed["ok"] is False and "nowhere" in failed["error"]


def test_serve_and_query_refuse_missing_schema_paths(tmp_path):
    missing = tmp_path / "missing"
    served = _cep("serve", "worker", "--bootstrap", "127.0.0.1:1",
                  env={"CEP_SCHEMA_PATH": str(missing)})
    assert served.returncode == 1
    assert f"CEP_SCHEMA_PATH: {missing}: no such file or directory" in served.stderr
    added = _cep("query", "add", "examples/finance.cep", "--schema", str(missing), cwd=ROOT)
    assert added.returncode == 2 and f"schema {missing}" in added.stderr
