"""The runs layout of MATCH_RECOGNIZE's partial matches: whether a query can keep one
record per start (`runs_plan`), and the code of the kernel's step of a key's runs on a row
(`run_step_lines`) and of the functions it calls on a run (`run_functions`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.compiler.recognize_automaton import (
    MAX_VARIABLES,
    Facts,
    chain,
    completed_facts,
    edges_of,
)
from cep_core.compiler.recognize_codegen import (
    CELL,
    INT,
    Generator,
    RecKey,
    Tag,
    alloc,
    indent,
)
from cep_core.compiler.recognize_states import EdgeLiterals, Literal, StateTable
from cep_core.kernels import recognize_runtime as rt
from cep_core.kernels.recognize_runtime import RunRows



# the runs layout's loop over a key's runs on a row (`run_step_lines`): what it takes
# before the row's values and the string tables
RUNS_STEP = "phf, pff, lp, lq, pb, npart, waiting, kr, idx, sq"  # (waiting: the key's
# completed matches that wait for an earlier partial one)


@dataclass(frozen=True)
class Runs:
    """The runs layout of a query's partial matches (`runs_plan`)."""

    states: list[int]  # the automaton states a run's partial matches can be in
    firsts: list[RecKey]  # LAST(v.a)/FIRST(v.a) columns read as the match's first row's
    lasts: list[RecKey]  # LAST(v.a) columns read as the row before the current one
    kinds: dict[RecKey, str]  # those and what is kept over all rows, by storage kind
    step: StateTable | None = None  # the states layout's (`recognize_states`)
    timed: bool = True  # a run keeps its start time (START_TS): WITHIN ends it by that

    def columns_first(self) -> list[tuple[RecKey, str]]:
        """The columns a run and its key's row use, to be numbered before any other (which
        only the computations layout's code uses): a run's counts, what it keeps of its
        first row and over all rows, then the row before."""
        aliases = self.aliases()
        keys: list[tuple[RecKey, str]] = [((Tag.MULT, t), INT) for t in self.states]
        keys += [(aliases[k], self.kinds[k]) for k in self.firsts]
        keys += [(k, kind) for k, kind in self.kinds.items() if k[1] is None]
        keys += [(aliases[k], self.kinds[k]) for k in self.lasts]
        return list(dict(keys).items())

    def aliases(self) -> dict[RecKey, RecKey]:
        """A run keeps each attribute of the first row and of the row before once: these
        columns of the computations layout are those (var ROW)."""
        return {**{key: (Tag.FIRST, ROW, key[2], 0) for key in self.firsts},
                **{key: (Tag.LAST, ROW, key[2], 0) for key in self.lasts}}

    def columns(self, first: bool) -> list[RecKey]:
        """The columns a run keeps of its first row (`first`), or those of the row before,
        which its key's row keeps for all its runs."""
        keys = self.firsts if first else self.lasts
        return sorted(set(self.aliases()[key] for key in keys), key=str)


ROW = "*"  # the variable of a run's columns of a row (no pattern variable's name)


def runs_plan(gen: Generator, tables: dict[str, npt.NDArray[np.int64]], start: int,
               skip: ast.SkipTo, emit: list[str], within: bool) -> Runs | None:
    """Whether the query can keep its partial matches as runs (rt.RUNS): one record per
    start with how many of its partial matches are in each automaton state (a MULT column
    each), since what the DEFINEs and MEASURES read of a record is the same for all the
    partial matches of one start. None: it cannot (rt.COMPUTATIONS).

    A match's rows are consecutive rows of its partition, so two partial matches of one
    start have the same rows, only mapped to other variables. They read alike what is kept
    over all rows (var None), and a variable's FIRST or LAST where that is the match's
    first row (every first TAKE is v's and, for LAST, v has one row in the reading state)
    or, for LAST(v.a), the last row (every TAKE into the reading state is v's). Count tests
    `count_facts` decides read nothing; any other read (a variable's count, LAST(v.a, 1),
    SUM(v.a), the rows of v for AFTER MATCH SKIP TO) keeps the computations layout. A run
    keeps its start time only for WITHIN (`within`): nothing else reads it."""
    if skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        return None
    st_var, st_final = tables["st_var"].tolist(), tables["st_final"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    names = gen.variables
    entering: dict[int, set[str]] = {}  # state -> the variables of the TAKEs into it
    for s, facts in enumerate(gen.facts):
        if facts is None or st_final[s] == 1:
            continue
        for q in chain(tables, s):
            for e in edges_of(tables, q):
                if tr_act[e] == 0:
                    entering.setdefault(tr_tgt[e], set()).add(names[st_var[q]])
    first = {names[st_var[q]] for q in chain(tables, start) for e in edges_of(tables, q)
             if tr_act[e] == 0}
    completed = completed_facts(tables, gen.facts)
    readers = [(code, entering[s], gen.facts[s]) for s, code in gen.state_defines.items()
               if s in entering]  # (the start computation's record 0 is all zeros)
    readers.append((emit, set().union(*[v for t, v in entering.items() if st_final[t]]),
                    completed))
    ways: dict[RecKey, set[Tag]] = {}  # how a column reads alike: as FIRST or as LAST
    for code, last, facts in readers:
        assert facts is not None
        for key in _reads(gen, code):
            tag, var = key[0], key[1]
            if var is None and tag in (Tag.CNT, Tag.LAST, Tag.FIRST, Tag.SUM, Tag.MIN,
                                       Tag.MAX):
                continue
            if tag not in (Tag.LAST, Tag.FIRST) or key[3] != 0:
                return None
            assert isinstance(var, str)
            here = set()
            if first == {var} and (tag is Tag.FIRST or facts[var] == (1, 1)):
                here.add(Tag.FIRST)
            if tag is Tag.LAST and last == {var}:
                here.add(Tag.LAST)
            ways[key] = ways.get(key, here) & here
            if not ways[key]:
                return None
    states = sorted(t for t in entering if st_final[t] != 1)
    firsts = sorted((key for key, way in ways.items() if Tag.FIRST in way), key=str)
    lasts = sorted((k for k in ways if k not in firsts), key=str)
    kinds = {key: gen.rec.kind_of[key] for key in firsts + lasts}
    kinds |= {key: kind for key, kind in gen.rec.kind_of.items()
              if key[1] is None and key != (Tag.CNT, None)}  # kept over all rows
    return Runs(states, firsts, lasts, kinds, timed=within)


_READ = re.compile(r"rec_([if])\[r, (\d+)\]")


def _reads(gen: Generator, code: list[str]) -> set[RecKey]:
    """The record columns `code` reads of record `r`, by key (a fixed column but the
    count: ("fixed",), which no `runs_plan` test allows)."""
    keys = {("i", column): key for key, column in gen.rec.ints.items()}
    keys.update({("f", column): key for key, column in gen.rec.floats.items()})
    return {keys.get(found, ("fixed",)) for text in code for found in
            ((array, int(column)) for array, column in _READ.findall(text))}


def check_columns(source: str, records: tuple[int, int], rows: tuple[int, int]) -> None:
    """The runs layout's records are `records` (ints, floats) columns wide and its runs'
    rows `rows`: its code reads and writes none beyond (a column a plan missed is a
    compiler bug, not a wrong answer; the cells `flat_cells` rewrote it checked then)."""
    for array, _, column in CELL.findall(source):
        if array != "key_i" and column != "c_":
            widths = rows if array in ("ph", "pf") else records
            width = widths[1] if array in ("rec_f", "pf") else widths[0]
            assert int(column) < width, f"column {column} of {array}: past {width}"


def run_rows(gen: Generator, runs: Runs) -> RunRows:
    """The places of the runs' and their keys' columns in the rows of ph/pf (`RunRows`)."""
    ints, floats, key_ints, key_floats = run_columns(gen, runs)
    S = rt
    firsts = [S.START_SEQ, S.START]
    run_i = firsts + sorted(ints - set(firsts))
    places = {c: j for j, c in enumerate(run_i)}
    places.update({c: len(firsts) + j for j, c in enumerate(sorted(key_ints))})
    fplaces = {c: j for j, c in enumerate(sorted(floats))}
    fplaces.update({c: j for j, c in enumerate(sorted(key_floats))})
    counts = () if runs.step is None else \
        tuple(gen.rec.col((Tag.MULT, t))[1] for t in runs.step.states)
    return RunRows(places, fplaces, tuple(run_i), tuple(sorted(floats)),
                   tuple(sorted(key_ints)), tuple(sorted(key_floats)), counts,
                   padded=runs.step is not None)


def run_step_lines(tables: dict[str, npt.NDArray[np.int64]], gen: Generator, row: str,
                    tab: str, start: int, runs: Runs, past_last_row: bool
                    ) -> tuple[list[str], list[str]]:
    """`_step_lines` in the runs layout (`runs_plan`): run `c` (row j of the key's runs in
    `ph`/`pf`) on the current row, and then the start computation, without a branch per
    state: every DEFINE the run's states evaluate is evaluated once (`p<n>`: one per
    generated function, so states whose DEFINEs read alike share it), then each firing TAKE
    edge adds the state's partial matches (`x<s>`) to its target's count (`n<t>`) or to the
    matches completed on this row (`done`), as a sum of products (`_edge_tests`). A run some
    partial match goes on in moves down over the runs that ended (`w`: the key's runs stay
    in order of start, packed) and takes the row there (`run_next`). Every run is written
    at `w`, and `w` steps when it lives, without a branch (a run that ended is written over
    by the next; 1.18x on the M-shape: whether a run lives is a coin toss to the branch
    predictor). Each completed match is a record of the pool, a copy of the run after the
    row (`run_end`; all alike: what MEASURES read is the same for all of them), in the
    completed queue as many times as Flink's has it. Those are made after the runs' loop
    from the runs themselves (where they are: `lq`, how many: `lp`), so a run whose
    partial matches all completed stays until then and leaves after (`gone`: the first
    such run's place). The loop is a function of its own (`step_runs`, `RUNS_STEP`), which
    LLVM inlines into the kernel again: written in the kernel, the same loop ran 1.2x
    slower with one kernel argument fewer (register allocation); written this way it ran at
    its best with `lq` alone (measured, not a guarantee: docs/benchmarks.md).

    In the states layout (`runs.step`, `recognize_states`) a run is one partial match: its
    state's number replaces the counts, and the sum of products is one lookup in the
    module's STEP table by that number and the DEFINEs' values (bit j: `p<j>`). With AFTER
    MATCH SKIP PAST LAST ROW (`past_last_row`), a run that completes a match with no run
    before it and no completed match waiting (`waiting`) ends the loop, as MATCH's kernel
    ends it on its first match: that match leaves on this row (`release`) and every run of
    the key with it, the runs after it unstepped (1.02-1.06x on the M-shape)."""
    st_final = tables["st_final"].tolist()
    states = runs.states
    column = {t: gen.rec.col((Tag.MULT, t))[1] for t in states}
    table = runs.step  # the states layout: a run's number of its state, in column[states[0]]
    total = " + ".join(f"n{t}" for t in states) or "0"
    ints, floats, _, _ = run_columns(gen, runs)
    calls: dict[str, str] = {}  # DEFINE function -> its value's local

    def held(v: int, s: int) -> str:
        if v not in gen.defined:
            return "True"
        name = gen.define_names[(v, s)]
        return calls.setdefault(name, f"p{len(calls)}")

    def adds(sources: list[int], weight: dict[int, str]) -> list[str]:
        into: dict[str, list[str]] = {}
        for s in sources:
            def held_here(v: int, s: int = s) -> str:
                return held(v, s)
            for test, tg, completes in _edge_tests(tables, s, held_here):
                target = "done" if st_final[tg] == 1 else f"n{tg}"
                into.setdefault(target, []).append(f"{weight[s]} * ({test})")
                if completes:
                    into.setdefault("done", []).append(f"{weight[s]} * ({test} & {completes})")
        return [f"{target} = " + " + ".join(into.get(target, ["0"]))
                for target in [f"n{t}" for t in states] + ["done"]]

    def copy(src: str, dst: str, arrays: str, int_columns: set[int] = ints) -> list[str]:
        """Run `src`'s columns into `dst` of `arrays` (all of them, or `int_columns`)."""
        di, df = arrays.split(", ")
        return [f"{di}[{dst}, {c}] = ph[{src}, {c}]" for c in sorted(int_columns)] + \
            [f"{df}[{dst}, {c}] = pf[{src}, {c}]" for c in sorted(floats)]

    def complete(src: str, times: str) -> list[str]:
        return [f"for u_ in range({times}):", *indent(alloc("m")),
                *indent(copy(src, "m", "rec_i, rec_f")),
                f"    run_end(rec_i, rec_f, m, idx, sq, {row})",
                "    nlc = heap_add(lc, 0, nlc, m, rec_i)"]

    def after(run: str, state: str) -> list[str]:  # `run` took the row: its counts (its
        # state: `state`) and completed matches
        if table is not None:
            return [f"ph[{run}, {column[states[0]]}] = {state}"]
        return [*[f"ph[{run}, {column[t]}] = n{t}" for t in states], "branches += tot"]

    def evaluate(arrays: str, record: str, key_row: str) -> list[str]:
        return [f"{local} = {name}({arrays}, {record}, {key_row}, {row}, {tab})"
                for name, local in calls.items()]

    moved = copy("c", "dw", "ph, pf", ints - set(column.values()))  # (the counts are new)
    if table is None:
        body = adds(states, {t: f"x{t}" for t in states})
        take = ["c = pb + 1 + j", *[f"x{t} = ph[c, {column[t]}]" for t in states],
                *evaluate("phf, pff", "c", "kr"), *body, f"tot = {total}"]
    else:  # one lookup of the run's state and the DEFINEs' (or conjuncts') values
        on_run = len(table.calls) - table.row_calls
        calls.update({name: f"p{j}" for j, name in enumerate(table.calls[:on_run])})
        bits = " | ".join([f"(p{j} << {j})" if j else "p0" for j in range(on_run)])
        row_bits = " + ".join(f"q{j} * {1 << (on_run + j)}" for j in range(table.row_calls))
        take = ["c = pb + 1 + j", f"x = ph[c, {column[states[0]]}]",
                *evaluate("phf, pff", "c", "kr"),
                f"v = STEP[U(x * {1 << len(table.calls)} + {'base + ' if row_bits else ''}"
                f"({bits or 0}))]",
                f"nxt = v & {(1 << table.shift) - 1}", f"done = v >> {table.shift}",
                "tot = nxt != 0"]
    completed = ["if done != 0:", "    lp[ncq] = done", "    lq[ncq] = w", "    ncq += 1",
                 "    if tot == 0 and gone == npart:", "        gone = w"]
    if table is not None and past_last_row:
        completed += ["    if w == 0 and waiting == 0:", "        w = 1", "        break"]
    once = []  # the conjuncts that read no run, once per row (the table's row: `base`)
    if table is not None and table.row_calls:
        once = [f"q{j} = {name}(phf, pff, kr, kr, {row}, {tab})"
                for j, name in enumerate(table.calls[on_run:])] + [f"base = {row_bits}"]
    step = ["U = np.uint64", "w = 0", *(["branches = 0"] if table is None else []),
            "ncq = 0", "gone = npart", *once,
            "for j in range(npart):", *indent(take), "    dw = pb + 1 + w",
            *indent(moved), *indent(after("dw", "nxt")),
            f"    run_next(phf, pff, dw, idx, sq, {row})",
            *indent(completed), "    w += (tot + done) != 0",
            "return w, branches, ncq, gone" if table is None else "return w, ncq, gone"]
    partial_matches = (" + ".join(f"ph[c, {column[t]}]" for t in states) or "0"
                       if table is None else f"ph[c, {column[states[0]]}]")
    leave = ["if gone < npart:  # the runs whose partial matches all completed leave",
             "    live = gone", "    for j in range(gone, w):", "        c = pb + 1 + j",
             f"        if {partial_matches} != 0:", "            dw = pb + 1 + live",
             *indent(copy("c", "dw", "ph, pf"), 3), "            live += 1", "    w = live"]
    calls.clear()
    body = adds([start], {start: "1"})
    # the start computation: its state is the start state, its record the pool's record 0
    # a new run's columns `run_first` adds to (its row count, SUMs) or reads are zeros
    written = {(a, int(c)) for a, c in _ASSIGN.findall("\n".join(_run_lines(gen, runs, True)))}
    written |= {("i", c) for c in column.values()}
    zero = [f"ph[d, {c}] = 0" for c in sorted(ints) if ("i", c) not in written] + \
        [f"pf[d, {c}] = 0.0" for c in sorted(floats) if ("f", c) not in written]
    first = ["for q_ in range(ncq):", "    c = pb + 1 + lq[q_]",
             *indent(complete("c", "lp[q_]")), *leave,
             *evaluate("rif, rff", "0", "0"), *body, f"tot = {total}",
             "if tot + done != 0:", "    d = pb + 1 + w", *indent(zero),
             f"    run_first(phf, pff, d, idx, sq, {row})",
             *indent(after("d", " + ".join(f"{table.number(t)} * n{t}" for t in states)
                           if table is not None else "")),
             *indent(complete("d", "done")),
             "    if tot != 0:", "        w += 1",
             f"run_key(phf, pff, kr, idx, sq, {row})"]
    return step, first


def _edge_tests(tables: dict[str, npt.NDArray[np.int64]], s: int,
                held: Callable[[int], str]) -> list[tuple[str, int, str | None]]:
    """`edge_literals` as boolean code of `held(v)`, the value of variable v's DEFINE."""
    def conj(literals: list[Literal]) -> str:
        tests = [held(v) if want else f"(not {held(v)})" for v, want in literals]
        return " & ".join(tests) if tests else "True"

    return [(conj(literals), tg, None if completes is None else conj(completes))
            for literals, tg, completes in edge_literals(tables, s)]


def edge_literals(tables: dict[str, npt.NDArray[np.int64]], s: int) -> EdgeLiterals:
    """The TAKE edges a computation in state s follows on a row, in Flink's order (the walk
    of `_walks`), each as (when it fires, its target, when the target PROCEEDs to the final
    state or None where it cannot), the conditions as conjunctions of DEFINEs that hold
    and that do not."""
    st_final = tables["st_final"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()

    def ok(e: int) -> list[Literal]:
        tests: list[Literal] = [] if tr_var[e] < 0 else [(tr_var[e], True)]
        return tests + [(w, False) for w in range(MAX_VARIABLES) if (tr_unl[e] >> w) & 1]

    def reaches(tg: int) -> list[Literal] | None:
        tests: list[Literal] = []
        q, seen = tg, set()
        while q not in seen:
            seen.add(q)
            proceed = [e for e in edges_of(tables, q) if tr_act[e] == 1]
            if not proceed:
                return None
            tests += ok(proceed[0])
            q = tr_tgt[proceed[0]]
            if st_final[q] == 1:
                return tests
        return None

    out: EdgeLiterals = []

    def walk(q: int, path: list[Literal], seen: frozenset[int]) -> None:
        for e in edges_of(tables, q):
            if tr_act[e] == 0:
                tg = tr_tgt[e]
                out.append((path + ok(e), tg, reaches(tg) if st_final[tg] == 2 else None))
        for e in edges_of(tables, q):
            if tr_act[e] == 1 and tr_tgt[e] not in seen:
                walk(tr_tgt[e], path + ok(e), seen | {q})

    walk(s, [], frozenset())
    return out


def run_functions(gen: Generator, runs: Runs) -> list[tuple[str, list[str]]]:
    """The runs layout's functions of a record `dst` and the current row (`row`): a run's
    first row, a later one, a completed match's end and the key's row."""
    return [("run_first", _run_lines(gen, runs, True)), ("run_next", _run_lines(gen, runs, False)),
            ("run_end", _run_end_lines(gen, runs)), ("run_key", _key_row_lines(gen, runs))]


def _run_lines(gen: Generator, runs: Runs, first: bool) -> list[str]:
    """Run `dst` takes the current row (`first`: its first): what is kept over all the
    match's rows and, on its first, the columns DEFINEs and MEASURES read as the match's
    first row (`runs_plan`). Not its last row (`run_end` writes it into a completed match)
    nor its row count where nothing reads it before (`run_end` works it out)."""
    everyone: Facts = {v: (0, 0 if first else None) for v in gen.variables}
    everyone[None] = (0, 0) if first else (1, None)
    with gen.knowing(everyone):
        lines = gen.take_lines(-1, 0)[1:]  # not the state: a run's are its MULT counts
    kept = {f"rec_i[dst, {rt.LAST_IDX}] = idx", f"rec_i[dst, {rt.LAST_SEQ}] = sq"}
    if not runs.timed:
        kept.add(f"rec_i[dst, {rt.START_TS}] = t")
    if not _run_counts_rows(gen, runs):
        kept.add(f"rec_i[dst, {rt.COUNT}] += 1")
    lines = [line for line in lines if line not in kept]
    for key in runs.columns(first=True) if first else []:
        assert isinstance(key[2], str)
        lines.append(f"{gen.rec.read(key, INT, 'dst')} = {gen.value(key[2])}")
    return lines


def _run_counts_rows(gen: Generator, runs: Runs) -> bool:
    """Whether a run keeps its row count (COUNT): a DEFINE reads it, or what a later row
    updates tests it."""
    everyone: Facts = {v: (0, None) for v in gen.variables}
    everyone[None] = (1, None)
    with gen.knowing(everyone):
        lines = gen.take_lines(-1, 0)
    count = f"rec_i[dst, {rt.COUNT}]"
    return any(count in line and line != f"{count} += 1" for line in lines) or \
        any((Tag.CNT, None) in _reads(gen, code) for code in gen.state_defines.values())


def _run_end_lines(gen: Generator, runs: Runs) -> list[str]:
    """A completed match `dst` copied from its run (`run_step_lines`): its last row (the
    current one), its row count where the run does not keep it, and the row's columns the
    MEASURES read (the key's row keeps them for the runs)."""
    S = rt
    lines = [f"rec_i[dst, {S.LAST_IDX}] = idx", f"rec_i[dst, {S.LAST_SEQ}] = sq"]
    if not _run_counts_rows(gen, runs):
        lines.append(f"rec_i[dst, {S.COUNT}] = idx - rec_i[dst, {S.START}] + 1")
    return lines + _row_lines(gen, runs, "dst")


def _row_lines(gen: Generator, runs: Runs, dst: str) -> list[str]:
    """Record `dst` := the current row's columns that are read as the row before."""
    lines = []
    for key in runs.columns(first=False):
        assert isinstance(key[2], str)
        lines.append(f"{gen.rec.read(key, INT, dst)} = {gen.value(key[2])}")
    return lines


def end_columns(gen: Generator, runs: Runs) -> set[int]:
    """The int columns a completed match takes from its last row (`run_end`)."""
    return {int(column) for array, column in _WRITE.findall("\n".join(
        _run_end_lines(gen, runs))) if array == "i"}


def _key_row_lines(gen: Generator, runs: Runs) -> list[str]:
    """The key's row `dst` := the current row's columns a DEFINE reads as the row before
    (those only MEASURES read, a completed match takes from its last row: `run_end`)."""
    read = {(array, int(column)) for codes in gen.state_defines.values() for code in codes
            for array, column in _KEY_READ.findall(code)}
    return [line for line in _row_lines(gen, runs, "dst")
            if (m := _WRITE.match(line)) is not None and (m[1], int(m[2])) in read]


_ASSIGN = re.compile(r"^rec_([if])\[dst, (\d+)\] = (?!.*\[dst, )", re.M)  # of the row alone
_WRITE = re.compile(r"rec_([if])\[dst, (\d+)\]")
_KEY_READ = re.compile(r"rec_([if])\[kr, (\d+)\]")


def run_columns(gen: Generator, runs: Runs) -> tuple[set[int], set[int], set[int], set[int]]:
    """The int and float columns of a run (where it started, what `run_first` and
    `run_next` write, its MULT counts), and those of its key's row (`_row_lines`)."""
    S = rt
    ints, floats = {S.START, S.START_SEQ} | ({S.START_TS} if runs.timed else set()), set[int]()
    for array, column in _WRITE.findall("\n".join(_run_lines(gen, runs, True) +
                                                   _run_lines(gen, runs, False))):
        (ints if array == "i" else floats).add(int(column))
    ints |= {gen.rec.col((Tag.MULT, t))[1] for t in runs.states[:1 if runs.step else None]}
    key_ints, key_floats = set[int](), set[int]()
    for array, column in _WRITE.findall("\n".join(_key_row_lines(gen, runs))):
        (key_ints if array == "i" else key_floats).add(int(column))
    return ints, floats, key_ints, key_floats
