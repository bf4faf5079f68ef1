"""The jitted engine: checked queries run over columnar batches by numba kernels.

`create_engine(checked, strings)` picks the engine for the query's kind; `run()` is the
batch counterpart of `cep_core.reference.run` and gives identical composite events.
"""

from __future__ import annotations

from collections.abc import Iterable

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.composite import sort_key
from cep_core.engine.base import Engine
from cep_core.events import Event, Punctuation


def create_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    kind = checked.query.kind
    if kind == "match":
        from cep_core.engine.match import MatchEngine
        return MatchEngine(checked, strings, **options)
    if kind == "seq":
        from cep_core.engine.seq import SeqEngine
        return SeqEngine(checked, strings, **options)
    from cep_core.engine.window import WindowEngine
    return WindowEngine(checked, strings, **options)


def batches(stream: Iterable[Event | Punctuation], size: int):
    """Groups events into lists of at most `size`; a punctuation is yielded on its own."""
    pending: list[Event] = []
    for item in stream:
        if isinstance(item, Punctuation):
            if pending:
                yield pending
                pending = []
            yield item
            continue
        pending.append(item)
        if len(pending) >= size:
            yield pending
            pending = []
    if pending:
        yield pending


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        batch_size: int = 65536, flush: bool = True, rejected: list | None = None,
        **options) -> list[dict]:
    """Every composite event of `queries` over a finite stream, in deterministic order
    (the same list `cep_core.reference.run` gives). Rejected events are appended to
    `rejected` as (query, seq, reason)."""
    if not queries:
        return []
    strings = StringDictionary()
    encoder = BatchEncoder(queries[0].schema, strings)
    engines = [(q, create_engine(q, strings, **options)) for q in queries]
    found: list[tuple[tuple, dict]] = []
    for chunk in batches(stream, batch_size):
        if isinstance(chunk, Punctuation):
            for q, engine in engines:
                found.extend((sort_key(c, q.index), c) for c in engine.punctuate(chunk.ts))
            continue
        batch = encoder.from_events(chunk)
        for q, engine in engines:
            found.extend((sort_key(c, q.index), c) for c in engine.process(batch))
    if flush:
        for q, engine in engines:
            found.extend((sort_key(c, q.index), c) for c in engine.flush())
    found.sort(key=lambda pair: pair[0])
    if rejected is not None:
        for q, engine in engines:
            rejected.extend((q, seq, reason) for seq, reason in engine.dead_letters)
    return [c for _, c in found]
