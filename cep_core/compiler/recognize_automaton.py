"""The MATCH_RECOGNIZE automaton (the reference's `compile_nfa`, Flink's NFACompiler) as
the tables the generated kernels read, and what it bounds: per state, the row counts of
every record in it (`count_facts`), so that the code generated for a state has its count
tests as constants (`decide`)."""

from __future__ import annotations

import operator

import numpy as np
import numpy.typing as npt

from cep_core.reference.recognize import PROCEED, State, number_states



MAX_OFFSET = 3  # FIRST/LAST(v.a, k): the kernel keeps k + 1 values per variable
MAX_VARIABLES = 62  # variables are bits of an int64 (memo of DEFINE results, `unless`)


class RecognizeUnsupported(ValueError):
    """A MATCH_RECOGNIZE construct the jitted engine does not evaluate (`engine_factory`
    runs the query on the interpreter engine instead, or raises `NotSupportedError`)."""


def automaton_tables(start: State, variables: list[str]) -> tuple[dict[str, np.ndarray], int, int]:
    """Per state: its variable (-1: final), final flag (1: final, 2: PROCEED edges may lead
    there), first edge and edge count; per edge:
    action (1: PROCEED), target, variable (-1: none), `unless` mask. Returns the tables, the
    start state's number and the most TAKE edges one computation can follow on a row."""
    index, states = number_states(start)
    final = [i for i, s in enumerate(states) if s.final]
    if not final:
        raise RecognizeUnsupported("a pattern without a final state")  # compile_nfa makes one
    edges: list[tuple[int, int, int, int]] = []
    st_var, st_final, tr_off, tr_n = [], [], [], []
    for s in states:
        st_var.append(variables.index(s.var) if s.var else -1)
        st_final.append(1 if s.final else 0)
        tr_off.append(len(edges))
        tr_n.append(len(s.transitions))
        proceeds = sum(t.action == PROCEED for t in s.transitions)
        if proceeds > 1:
            raise RecognizeUnsupported("a state with two PROCEED edges")  # never from compile_nfa
        for t in s.transitions:
            var = -1 if t.condition.var is None else variables.index(t.condition.var)
            unless = sum(1 << variables.index(u) for u in set(t.condition.unless))
            edges.append((1 if t.action == PROCEED else 0, index[id(t.target)], var, unless))

    def reaches(s: State) -> bool:  # a PROCEED path to the final state (conditions aside)
        return any(t.action == PROCEED and (t.target.final or reaches(t.target))
                   for t in s.transitions)

    for number, s in enumerate(states):
        if not s.final and reaches(s):
            st_final[number] = 2

    def takes(s: State) -> int:
        return sum(takes(t.target) if t.action == PROCEED else 1 for t in s.transitions)

    tables = {
        "st_var": np.array(st_var, np.int64), "st_final": np.array(st_final, np.int64),
        "tr_off": np.array(tr_off, np.int64), "tr_n": np.array(tr_n, np.int64),
        "tr_act": np.array([e[0] for e in edges] or [0], np.int64),
        "tr_tgt": np.array([e[1] for e in edges] or [0], np.int64),
        "tr_var": np.array([e[2] for e in edges] or [0], np.int64),
        "tr_unl": np.array([e[3] for e in edges] or [0], np.int64),
    }
    return tables, index[id(start)], max(1, max(takes(s) for s in states))


Interval = tuple[int, int | None]  # a row count's bounds: lo (COUNT_CAP: at least that), hi
Facts = dict[str | None, Interval]  # per variable (None: the whole match)
COUNT_CAP = MAX_OFFSET + 2  # above every k a count is compared with (`_Leaves`, `take`)


def chain(tables: dict[str, npt.NDArray[np.int64]], s: int) -> list[int]:
    """The states whose edges a computation in state s follows on a row: s, then along
    its PROCEED edges (`_step_lines`' walk)."""
    chain = [s]
    while True:
        q = chain[-1]
        proceed = [int(tables["tr_tgt"][e]) for e in edges_of(tables, q)
                   if tables["tr_act"][e] == 1]
        if not proceed or proceed[0] in chain:
            return chain
        chain.append(proceed[0])


def edges_of(tables: dict[str, npt.NDArray[np.int64]], q: int) -> range:
    off = int(tables["tr_off"][q])
    return range(off, off + int(tables["tr_n"][q]))


def count_facts(tables: dict[str, npt.NDArray[np.int64]], start: int,
                variables: list[str]) -> list[Facts | None]:
    """Per state, the bounds of each variable's row count (and the match's) in every
    record in that state (None: no record is ever in it). The start computation has no
    rows; a record's state and counts change only where its computation TAKEs a row
    (`take`: the variable of the state whose edge it is and the match gain one row), and a
    PROCEED only moves the walk of a row on. Pruning, release, WITHIN and snapshots move
    handles or copy records whole, so they never put a record in a state with other counts.
    Counts saturate at COUNT_CAP (a fixed point of interval unions)."""
    def add(i: Interval) -> Interval:
        lo, hi = i
        return min(lo + 1, COUNT_CAP), None if hi is None or hi >= COUNT_CAP else hi + 1

    facts: list[Facts | None] = [None] * len(tables["st_var"])
    facts[start] = {v: (0, 0) for v in [None, *variables]}
    work = [start]
    while work:
        s = work.pop()
        here = facts[s]
        assert here is not None
        for q in chain(tables, s):
            var = int(tables["st_var"][q])
            for e in edges_of(tables, q):
                if tables["tr_act"][e] == 1:
                    continue
                after = dict(here)
                after[None] = add(here[None])
                if var >= 0:
                    after[variables[var]] = add(here[variables[var]])
                tg = int(tables["tr_tgt"][e])
                old = facts[tg]
                joined = after if old is None else {v: _join(old[v], after[v]) for v in old}
                if joined != old:
                    facts[tg] = joined
                    work.append(tg)
    return facts


def _join(a: Interval, b: Interval) -> Interval:
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return min(a[0], b[0]), hi


def completed_facts(tables: dict[str, npt.NDArray[np.int64]],
                     facts: list[Facts | None]) -> Facts | None:
    """The bounds of a completed match's counts: it is a record a TAKE put in the final
    state, or a copy of one in a state whose PROCEED edges reach it (`st_final` 2)."""
    joined: Facts | None = None
    for s, known in enumerate(facts):
        if known is not None and tables["st_final"][s] != 0:
            joined = known if joined is None else {v: _join(joined[v], known[v])
                                                   for v in joined}
    return joined


def decide(interval: Interval | None, op: str, k: int) -> bool | None:
    """`count op k` for every count in the interval (True or False), or None: not known."""
    if interval is None:
        return None
    assert 0 <= k < COUNT_CAP
    lo, hi = interval
    if op == "==":
        if lo == hi == k:
            return True
        return False if k < lo or (hi is not None and k > hi) else None
    test = _COMPARE[op]
    at_hi = test(hi, k) if hi is not None else op in (">", ">=")  # unbounded: large
    return at_hi if test(lo, k) == at_hi else None


_COMPARE = {"<=": operator.le, "<": operator.lt, ">": operator.gt, ">=": operator.ge}
