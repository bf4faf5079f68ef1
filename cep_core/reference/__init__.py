"""The reference interpreter: plain Python that follows docs/semantics.md line by line.

It is the oracle every faster engine is tested against, so it favours clarity over speed.
Each query kind has one module; all share the `Interpreter` shape:

    process(event) -> composite events released by this event
    punctuate(ts)  -> composite events released because event time reached ts
    flush()        -> composite events still pending at the end of the stream
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from cep_core.checked import CheckedQuery
from cep_core.composite import sort_key
from cep_core.events import Event, Punctuation
from cep_core.reference.match import MatchInterpreter
from cep_core.reference.recognize import RecognizeInterpreter
from cep_core.reference.seq import SeqInterpreter
from cep_core.reference.window import WindowInterpreter


class Interpreter(Protocol):
    def process(self, event: Event) -> list[dict[str, Any]]: ...

    def punctuate(self, ts: int) -> list[dict[str, Any]]: ...

    def flush(self) -> list[dict[str, Any]]: ...

    dead_letters: list[tuple[Event, str]]  # (event, reason) for each event the interpreter rejected


def interpreter_for(checked: CheckedQuery) -> Interpreter:
    kinds: dict[str, Callable[[CheckedQuery], Interpreter]] = {
        "match": MatchInterpreter, "seq": SeqInterpreter, "window": WindowInterpreter,
        "recognize": RecognizeInterpreter}
    return kinds[checked.query.kind](checked)


def run(queries: list[CheckedQuery], stream: Iterable[Event | Punctuation],
        flush: bool = True, rejected: list[tuple[CheckedQuery, Event, str]] | None = None,
        ) -> list[dict[str, Any]]:
    """Every composite event of `queries` over a finite stream, in deterministic order.

    All queries must read the same stream. With `flush`, the end of the stream closes
    whatever is pending (open windows, matches waiting for a trailing negation).
    Events an interpreter rejected (time going backwards, late for a window) are appended
    to `rejected` as (query, event, reason)."""
    interpreters = [(q, interpreter_for(q)) for q in queries]
    found: list[tuple[tuple[object, ...], dict[str, Any]]] = []
    for item in stream:
        for q, interp in interpreters:
            out = interp.process(item) if isinstance(item, Event) else interp.punctuate(item.ts)
            found.extend((sort_key(c, q.index), c) for c in out)
    if flush:
        for q, interp in interpreters:
            found.extend((sort_key(c, q.index), c) for c in interp.flush())
    found.sort(key=lambda pair: pair[0])
    if rejected is not None:
        for q, interp in interpreters:
            rejected.extend((q, event, reason) for event, reason in interp.dead_letters)
    return [c for _, c in found]
