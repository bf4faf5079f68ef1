"""The one place that picks an engine for a checked query: `create_engine(checked, strings,
**options)` gives the MATCH, SEQ (CDP or AIP) or WINDOW engine for the query's kind."""

from __future__ import annotations

from cep_core.batch import StringDictionary
from cep_core.checker import CheckedQuery
from cep_core.engine.base import Engine


def create_engine(checked: CheckedQuery, strings: StringDictionary, **options) -> Engine:
    kind = checked.query.kind
    if kind == "match":
        from cep_core.engine.match import MatchEngine
        return MatchEngine(checked, strings, **options)
    if kind == "seq":
        # The planner: runs (skip-till-next-match, strict contiguity) and a forced "aip" go
        # to incremental automata; the rest to column-based delayed processing.
        from cep_core.ast import Strategy
        algorithm = options.get("algorithm", "auto")
        if algorithm == "aip" or (algorithm == "auto" and checked.query.body.strategy
                                  is not Strategy.SKIP_TILL_ANY_MATCH):
            from cep_core.engine.seq_aip import SeqAipEngine
            return SeqAipEngine(checked, strings, **options)
        from cep_core.engine.seq import SeqEngine
        return SeqEngine(checked, strings, **options)
    from cep_core.engine.window import WindowEngine
    return WindowEngine(checked, strings, **options)
