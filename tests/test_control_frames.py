"""Control frames (services/stream/frames.py): one typed model, `ChangeFrame` or
`LiveSetFrame`, encoded by the router and decoded once by the partition core and the merge.
Their payloads are the bytes the splitter always sent (a change's names, then the live
set's entry of it), so a keyed topic written before reads the same; and no module but the
live set's own edits `LiveSet.live`."""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
import pytest

from cep_core.control_message import ControlMessage, LiveSet, validate
from cep_service.stream import frames
from cep_service.stream.frames import ChangeFrame, FrameError, LiveSetFrame
from cep_service.stream.status import change_of

ROOT = Path(__file__).resolve().parent.parent
QUOTES = {"stream": "quotes2", "attributes": {"sym": "string", "bid": "float", "ask": "float",
                                               "t": "timestamp"}, "time": "t"}
SPREAD = """QUERY wide FROM quotes2 PARTITION BY sym
PATTERN ( w ) DEFINE w AS ask - bid > 1.5
EMIT sym = sym"""


def applied(live: LiveSet, key: bytes, value: dict, offset: int) -> tuple[bytes, ChangeFrame]:
    """The payload the splitter sent before the model (the change's names, then the entry),
    and the model's frame of the same change."""
    change = validate(orjson.dumps(value), key, live.registry, "quotes2")
    entry = live.apply(change, offset + 1)
    named = change_of(key, offset, change)
    body = {"op": change.op, "name": change.name, **named}
    if entry is not None:
        body.update(entry.to_json())
    return orjson.dumps(body), ChangeFrame.applied(named, entry)


def test_payloads_are_the_bytes_sent_before():
    live = LiveSet("quotes2")
    schema = orjson.dumps(QUOTES).decode()
    wider = orjson.dumps({**QUOTES, "attributes": {**QUOTES["attributes"], "x": "int"}})
    changes = [(b"stream/quotes2", {"op": "add", "name": "quotes2", "text": schema}),
               (b"query/wide", {"op": "add", "name": "wide", "text": SPREAD}),
               (b"query/wide", {"op": "update", "name": "wide", "text": SPREAD + " "}),
               (b"stream/quotes2", {"op": "update", "name": "quotes2",
                                    "text": wider.decode()}),
               (b"query/wide", {"op": "remove", "name": "wide"}),
               (b"stream/quotes2", {"op": "remove", "name": "quotes2"})]
    seen = set()
    for offset, (key, value) in enumerate(changes):
        before, frame = applied(live, key, value, offset)
        assert orjson.dumps(frame.to_payload()) == before
        decoded = frames.control_of(frames.control_frame(frame, at=3))
        assert decoded == frame
        seen.add((decoded.kind, decoded.op, decoded.removes, decoded.of_stream))
    assert seen == {("stream", "add", False, True), ("query", "add", False, False),
                    ("query", "update", False, False), ("stream", "update", False, True),
                    ("query", "remove", True, False), ("stream", "remove", True, True)}


def test_a_live_set_frame_round_trips_and_reads_the_short_forms():
    whole = LiveSetFrame(({"name": "a", "text": "t", "index": 0},),
                         ({"name": "s", "text": "{}", "version": 2},),
                         ({"key": "query/a", "offset": 0, "kind": "query", "op": "add",
                           "name": "a"},))
    frame = frames.control_frame(whole, at=0)
    assert orjson.loads(frame.payload) == {"op": "set", "queries": list(whole.queries),
                                           "streams": list(whole.streams),
                                           "changes": list(whole.changes)}
    assert frames.control_of(frame) == whole
    short = frames.json_frame(frames.CONTROL, {"op": "set", "queries": []})
    assert frames.control_of(short) == LiveSetFrame()
    removal = frames.control_of(frames.json_frame(frames.CONTROL, {"op": "remove",
                                                                    "name": "q"}))
    assert removal == ChangeFrame("remove", "q") and removal.key is None


@pytest.mark.parametrize("payload", [b"", b"[1]", b'{"name": "q"}', b'{"op": "set"}',
                                     b"not json"])
def test_a_frame_that_is_no_change_is_refused(payload):
    with pytest.raises(FrameError, match="control frame"):
        frames.control_of(frames.Frame(frames.CONTROL, {}, payload))


def test_live_set_put_remove_clear():
    live = LiveSet("quotes2")
    live.apply(validate(orjson.dumps({"op": "add", "name": "quotes2",
                                      "text": orjson.dumps(QUOTES).decode()}),
                        b"stream/quotes2"))
    live.apply(ControlMessage("add", "wide", SPREAD))
    live.apply(ControlMessage("add", "narrow", SPREAD.replace("wide", "narrow")))
    put = live.put({"name": "wide", "text": SPREAD + " ", "index": 0})
    assert put.text == SPREAD + " " and list(live.live) == ["narrow", "wide"]
    assert live.remove("narrow").index == 1 and live.remove("narrow") is None
    live.clear()
    assert live.live == {} and live.registry.get("quotes2") is not None
    assert live.apply(ControlMessage("add", "again", SPREAD.replace("wide", "again"))).index \
        == 2


def test_only_the_live_set_edits_its_queries():
    """No `x.live[...] = `, `del x.live[...]`, `x.live = ` or `x.live.pop(...)` on a
    LiveSet outside cep_core/control_message.py."""
    found = []
    for path in [*ROOT.glob("services/**/*.py"), *ROOT.glob("cep_core/**/*.py")]:
        if path.name == "control_message.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
                [node.func.value] if isinstance(node, ast.Call) and \
                isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "pop", "clear", "update", "setdefault", "popitem") else []
            for target in targets:
                base = target.value if isinstance(target, ast.Subscript) else target
                if isinstance(base, ast.Attribute) and base.attr == "live" and \
                        isinstance(base.value, ast.Attribute) and base.value.attr == "queries":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
