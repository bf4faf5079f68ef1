"""The one place that makes an engine for a checked query: the compiler builds the query's
program (once per checked query, shared), the engine gets it and holds the state.

`create_engine(checked, strings, **options)` picks the MATCH, SEQ (CDP or AIP) or WINDOW
engine for the query's kind; `match_engine`, `seq_engine` (CDP), `seq_aip_engine` and
`window_engine` make one of a given kind. Options meant for other kinds are ignored.
Each kind's compiler and engine are imported when first asked for (they load numba and
generate code), so a run imports only the kinds it uses.
"""

from __future__ import annotations

# Deferred imports: each query kind's compiler and engine (numba kernels built at import) load when
# the first engine of that kind is made: a run of MATCH queries never imports SEQ or WINDOW code.

from cep_core.ast import Strategy
from cep_core.batch import StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.engine.base import Engine


def create_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    kind = checked.query.kind
    if kind == "match":
        return match_engine(checked, strings, **options)
    if kind == "seq":
        # The planner: runs (skip-till-next-match, strict contiguity) and a forced "aip" go
        # to incremental automata; the rest to column-based delayed processing.
        algorithm = options.get("algorithm", "auto")
        if algorithm == "aip" or (algorithm == "auto" and checked.query.body.strategy
                                  is not Strategy.SKIP_TILL_ANY_MATCH):
            return seq_aip_engine(checked, strings, **options)
        return seq_engine(checked, strings, **options)
    return window_engine(checked, strings, **options)


def match_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    from cep_core.compiler.match import compile_match
    from cep_core.engine.match import MatchEngine

    return MatchEngine(compile_match(checked), strings, **options)


def seq_engine(checked: CheckedQuery, strings: StringDictionary, algorithm: str = "auto",
               **options) -> Engine:
    """The CDP engine; `NotSupportedError` for algorithm "aip" or a query that needs runs."""
    from cep_core.compiler.seq_programs import CdpUnsupported, compile_cdp
    from cep_core.engine.seq import ALGORITHMS, NotSupportedError, SeqEngine

    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown SEQ algorithm {algorithm!r} (one of "
                         f"{', '.join(ALGORITHMS)})")
    try:
        if algorithm == "aip":
            raise CdpUnsupported("algorithm 'aip'")
        program = compile_cdp(checked)
    except CdpUnsupported as why:
        raise NotSupportedError(
            f"query {checked.name!r}: {why} is evaluated by incremental automata "
            "(cep_core.engine.seq_aip.SeqAipEngine; create_engine plans it), not by "
            "the CDP engine") from None
    return SeqEngine(program, strings, **options)


def seq_aip_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    """The AIP engine; `NotSupportedError` for what its kernel does not evaluate."""
    from cep_core.compiler.seq_programs import AipUnsupported, compile_aip
    from cep_core.engine.seq import NotSupportedError
    from cep_core.engine.seq_aip import SeqAipEngine

    try:
        program = compile_aip(checked)
    except AipUnsupported as e:
        raise NotSupportedError(
            f"query {checked.name!r}: the AIP SEQ kernel does not evaluate {e}") from None
    return SeqAipEngine(program, strings, **options)


def window_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    from cep_core.compiler.window import compile_window
    from cep_core.engine.window import WindowEngine

    return WindowEngine(compile_window(checked), strings, **options)
