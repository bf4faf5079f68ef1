"""The one place that makes an engine for a checked query: the compiler builds the query's
program (once per checked query, shared), the engine gets it and holds the state.

`create_engine(checked, strings, placement="cpu", **options)` is what every caller uses
(`StreamEngines`, the CLI, the Python API, the workers, the backfill). It decides where the
query runs and picks the engine: on the CPU the MATCH, SEQ (CDP or AIP) or WINDOW engine for
the query's kind; with placement "gpu" or "auto", the installed placement policy decides and
builds the GPU engine (`cep_core.placement.placement_policy`: this project's is
`cep_accel.gpu.policy`, registered as an entry point, so the core never imports it). The
engine's `placement` attribute says where it went and why (a `Placement`). `match_engine`,
`seq_engine` (CDP), `seq_aip_engine`, `window_engine` and `recognize_engine` make one CPU
engine of a given kind. Options meant for other kinds or for the GPU are ignored.
Each kind's compiler and engine are imported when first asked for (they load numba and
generate code), so a run imports only the kinds it uses; the GPU policy (numba.cuda) only
for placement "gpu" or "auto".
"""

from __future__ import annotations

# Deferred imports: each query kind's compiler and engine (numba kernels built at import) load
# when the first engine of that kind is made.

from typing import TYPE_CHECKING, Any

from cep_core.ast import QueryKind, SeqQuery, Strategy
from cep_core.batch import StringDictionary
from cep_core.checked import CheckedQuery
from cep_core.engine.base import Engine
from cep_core.placement import (
    PLACEMENTS,
    Algorithm,
    Placement,
    Target,
    check_placement,
    placement_policy,
)

if TYPE_CHECKING:
    from cep_core.compiler.match import Program as MatchProgram
    from cep_core.compiler.recognize import RecognizeProgram
    from cep_core.compiler.seq_programs import SeqProgram
    from cep_core.compiler.window import WindowProgram
    from cep_core.reference.recognize import Nfa

    # What compile_program gives: the program of the query's kind (Flink's automaton, `Nfa`,
    # for a MATCH_RECOGNIZE query the jitted kernels do not evaluate).
    Program = MatchProgram | RecognizeProgram | Nfa | SeqProgram | WindowProgram

__all__ = ["PLACEMENTS", "Placement", "create_engine", "cpu_engine", "match_engine",
           "recognize_engine", "seq_engine", "seq_aip_engine", "window_engine"]


def create_engine(checked: CheckedQuery, strings: StringDictionary, placement: str = "cpu",
                  **options: Any) -> Engine:
    """The engine for the query, where `placement` puts it (the placement policy);
    `engine.placement` says where and why. Options `gpu_cost_threshold`, `expected_keys`
    and `gpu_min_keys` steer "auto"; the rest go to the engine."""
    target = check_placement(placement)
    gpu_cost_threshold = options.pop("gpu_cost_threshold", None)
    if target is Target.CPU:
        where = Placement(checked.name, Target.CPU, "placement cpu")
    else:
        gpu = placement_policy("gpu")
        where = gpu.place(checked, placement, gpu_cost_threshold,
                          expected_keys=options.get("expected_keys"),
                          gpu_min_keys=options.get("gpu_min_keys"))
    engine: Engine
    if where.target is Target.GPU:
        engine = gpu.gpu_engine(checked, strings, **options)
    else:
        engine = cpu_engine(checked, strings, **options)
    engine.placement = where
    return engine


def cpu_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
    """The CPU engine for the query's kind."""
    kind = checked.query.kind
    if kind is QueryKind.RECOGNIZE:
        return recognize_engine(checked, strings, **options)
    if kind is QueryKind.MATCH:
        return match_engine(checked, strings, **options)
    if kind is QueryKind.SEQ:
        if _seq_uses_aip(checked, options.get("algorithm", Algorithm.AUTO)):
            return seq_aip_engine(checked, strings, **options)
        return seq_engine(checked, strings, **options)
    return window_engine(checked, strings, **options)


def _seq_uses_aip(checked: CheckedQuery, algorithm: str) -> bool:
    """The planner: runs (skip-till-next-match, strict contiguity) and a forced "aip" go
    to incremental automata; the rest to column-based delayed processing."""
    body = checked.query.body
    assert isinstance(body, SeqQuery)  # asked for SEQ queries only
    algorithm = Algorithm.of(algorithm)
    return algorithm is Algorithm.AIP or (algorithm is Algorithm.AUTO and
                                          body.strategy is not Strategy.SKIP_TILL_ANY_MATCH)


def compile_program(checked: CheckedQuery) -> Program:
    """The program the CPU engine of the query's kind runs (the compilers' work, shared by
    every engine of the query; no numba compilation, which happens at a kernel's first
    call). Raises what those compilers refuse: `cep_core.admission` runs it as part of
    the one check."""
    kind = checked.query.kind
    if kind is QueryKind.RECOGNIZE:  # the jitted kernels, else Flink's automaton
        jitted = recognize_program(checked)
        if jitted is not None:
            return jitted
        from cep_core.reference.recognize import program
        return program(checked)
    if kind is QueryKind.MATCH:
        from cep_core.compiler.match import compile_match
        return compile_match(checked)
    if kind is QueryKind.WINDOW:
        from cep_core.compiler.window import compile_window
        return compile_window(checked)
    from cep_core.compiler.seq_programs import AipUnsupported, compile_aip, compile_cdp
    from cep_core.engine.seq import NotSupportedError

    if not _seq_uses_aip(checked, Algorithm.AUTO):
        return compile_cdp(checked)
    try:
        return compile_aip(checked)
    except AipUnsupported as e:
        raise NotSupportedError(
            f"query {checked.name!r}: the AIP SEQ kernel does not evaluate {e}") from None


def match_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
    from cep_core.compiler.match import compile_match
    from cep_core.engine.match import MatchEngine

    return MatchEngine(compile_match(checked), strings, **options)


def recognize_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
    """A MATCH_RECOGNIZE query's engine, planned: the jitted engine
    (`cep_core.engine.recognize`) where its compiler takes the query, else the reference
    interpreter over columnar batches (`cep_core.engine.recognize_interpreter`, Flink's
    NFA in plain Python). Both give the reference's answers."""
    program = recognize_program(checked)
    if program is not None:
        from cep_core.engine.recognize import RecognizeEngine

        return RecognizeEngine(program, strings, **options)
    from cep_core.engine.recognize_interpreter import RecognizeInterpreterEngine

    return RecognizeInterpreterEngine(checked, strings, **options)


def recognize_program(checked: CheckedQuery) -> RecognizeProgram | None:
    """The jitted program of a MATCH_RECOGNIZE query, or None where its compiler does not
    evaluate something the query uses (`RecognizeUnsupported`: the interpreter runs it)."""
    from cep_core.compiler.recognize import RecognizeUnsupported, compile_recognize

    try:
        return compile_recognize(checked)
    except RecognizeUnsupported:
        return None


def seq_engine(checked: CheckedQuery, strings: StringDictionary,
               algorithm: str = Algorithm.AUTO,
               **options: Any) -> Engine:
    """The CDP engine; `NotSupportedError` for algorithm "aip" or a query that needs runs."""
    from cep_core.compiler.seq_programs import CdpUnsupported, compile_cdp
    from cep_core.engine.seq import NotSupportedError, SeqEngine

    try:
        if Algorithm.of(algorithm) is Algorithm.AIP:
            raise CdpUnsupported("algorithm 'aip'")
        program = compile_cdp(checked)
    except CdpUnsupported as why:
        raise NotSupportedError(
            f"query {checked.name!r}: {why} is evaluated by incremental automata "
            "(cep_core.engine.seq_aip.SeqAipEngine; create_engine plans it), not by "
            "the CDP engine") from None
    return SeqEngine(program, strings, **options)


def seq_aip_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
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


def window_engine(checked: CheckedQuery, strings: StringDictionary, **options: Any) -> Engine:
    from cep_core.compiler.window import compile_window
    from cep_core.engine.window import WindowEngine

    return WindowEngine(compile_window(checked), strings, **options)
