"""atheris (libFuzzer) harnesses for the event decoder and the query parser + checker.

    .venv/bin/python tests/fuzz/fuzz_targets.py events -runs=100000
    .venv/bin/python tests/fuzz/fuzz_targets.py queries -max_total_time=600 -timeout=5

Any libFuzzer option works after the target name (-runs, -max_total_time, -timeout for a
per-input time limit, a corpus directory). A crash is an exception other than the
documented ones; libFuzzer writes the input as crash-<hash> in the working directory.
"""

import sys

import atheris

with atheris.instrument_imports():
    import numpy as np
    import orjson

    from cep_core.checker import load_query_text
    from cep_core.errors import QueryError, QueryErrors
    from cep_core.json_batch import decode_messages
    from cep_core.schema import SchemaRegistry, StreamSchema

SCHEMA = StreamSchema(
    stream="things",
    attributes={"kind": "string", "n": "int", "x": "float", "ok": "bool", "ts": "timestamp"},
    time="ts", time_unit="ns", type_attribute="kind", types=("A", "B"))
REGISTRY = SchemaRegistry()


def events(data: bytes) -> None:
    """Cut the input into up to 4 messages; every one is a good row or a dead letter."""
    raws = data.split(b"\n")[:4]
    offsets = np.arange(len(raws), dtype=np.int64)
    decoded = decode_messages(raws, SCHEMA, offsets, offsets=offsets, max_bytes=256)
    assert len(decoded.rows) + len(decoded.dead) == len(raws)
    for letter in decoded.dead:
        assert letter.reason and letter.raw == raws[letter.offset][:256]
        orjson.dumps(letter.to_json())


def queries(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(4096)
    try:
        load_query_text(text, REGISTRY, "<fuzz>")
    except (QueryError, QueryErrors):
        pass


TARGETS = {"events": events, "queries": queries}


def main(argv: list[str]) -> None:
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
