"""MATCH_RECOGNIZE queries -> one generated numba module per query, answering as Flink 2.3
does (docs/semantics.md, MATCH_RECOGNIZE), exactly as the reference interpreter
(`cep_core.reference.recognize`) does.

The automaton is the reference's `compile_nfa` (Flink's NFACompiler) from the checked
pattern (`cep_core.recognize_pattern`), flattened into tables: per state its variable and
its edges (TAKE or PROCEED, the variable whose DEFINE must hold, the greedy `unless` set
as a bit mask of variables). Each state has at most one PROCEED edge, so a state's decision
graph is a chain and a computation makes at most `max_takes` new ones per row.

A computation (partial or completed match) is a record: its state, where and when it
started, its last row, its row count and what the DEFINEs and MEASURES read of its rows,
kept incrementally per variable (or over all rows): the last and first few values of an
attribute (`v.a`, `LAST(v.a, k)`, `FIRST(v.a, k)`, `PREV(a)`), SUM, MIN, MAX and the row
count, and for AFTER MATCH SKIP TO FIRST/LAST v the first and last row of v. A DEFINE sees
the record plus the current row as its variable's; MEASURES see the record.

Generated per query: `d<v>_<s>(...)` (the DEFINE of variable number v on the current row,
for a record in automaton state s; `d<v>` where that state tells nothing), `take<n>` (a copy
of a record plus the row as one variable, into one state) and `take_here<n>` (a record plus
the row, in place), `emit` (MEASURES of a released match), and the kernels that run Flink's
NFA over a batch (`kernel`, a chunk of rows at a time grouped by key by `group`) or end
partial matches at a time (`tick`), replaying `java.util.PriorityQueue`'s order
(`cep_core.kernels.recognize_runtime`). The kernel's step of a computation is unrolled
per automaton state (`recognize_kernel._step_lines`): the tables are constants there,
every condition is evaluated once, and the last TAKE reuses the computation's record
instead of copying it. The automaton bounds the row counts of a record in each state
(`recognize_automaton.count_facts`: after S of `S R1+ ...` S has one row and R1 none), so
the DEFINEs and TAKEs made for that state (`_specialise`) have most of their NULL and
first-row tests as constants.

That is the computations layout: one record per Flink computation state. A match's rows
are consecutive rows of its partition, so the partial matches of one start have the same
rows, only mapped to other variables; where what the DEFINEs and MEASURES read of them is
the same for all of them (`recognize_runs.runs_plan`: the first row, the row before, what
is kept over all rows), the query gets the runs layout instead: one record (a run) per
start, with how many of its partial matches are in each automaton state, stepped without a
branch per state (`recognize_runs.run_step_lines`), as MATCH's kernel steps a candidate.
Where no run ever stands for more than one partial match (Flink's greedy quantifiers make
most patterns so: `recognize_states`), a run keeps its one state's number instead of the
counts, and a row steps it by one lookup in a table (the states layout).
Both give Flink's answers.

Expressions follow SQL's three-valued logic (a NULL comes from a variable without rows,
PREV before the first row, an aggregate of no rows, a division by zero); int `/` and `%`
and AVG of ints are Java's. What this compiler does not evaluate raises
`RecognizeUnsupported`, naming the construct (`engine_factory` then runs the query on the
interpreter engine).

Code is generated from the checked AST only: identifiers are made up here, numbers come
from `repr` of parsed values, strings are codes (`cep_core.compiler.expressions`).

This module compiles a query; the parts are modules of their own: the automaton's tables
and what it bounds (`recognize_automaton`), records and the code of expressions over them
(`recognize_codegen`), the runs layout (`recognize_runs`) and the generated module's source
(`recognize_kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.checked import CheckedQuery
from cep_core.compiler.expressions import STRING_TABLE_PARAMS, StringConstants
from cep_core.compiler.modules import load_module
from cep_core.compiler.programs import once_per_query
from cep_core.compiler.recognize_automaton import (
    MAX_VARIABLES,
    RecognizeUnsupported,
    automaton_tables,
    chain,
    completed_facts,
    count_facts,
    edges_of,
)
from cep_core.compiler.recognize_codegen import FLOAT, INT, Generator, MeasureSpec, Tag
from cep_core.compiler.recognize_kernel import module_source
from cep_core.compiler.recognize_states import by_conjuncts, state_table
from cep_core.compiler.recognize_runs import (
    Runs,
    check_columns,
    edge_literals,
    end_columns,
    run_rows,
    runs_plan,
)
from cep_core.kernels import recognize_runtime as rt
from cep_core.kernels.recognize_runtime import RunRows
from cep_core.kernels.match_runtime import dtype_of
from cep_core.recognize_pattern import recognize_elements
from cep_core.reference.recognize import compile_nfa
from cep_core.schema import AttrType

__all__ = ["RecognizeProgram", "RecognizeUnsupported", "compile_recognize"]




@dataclass(frozen=True, eq=False)
class RecognizeProgram:
    """A compiled MATCH_RECOGNIZE query: its module and the layout of the arrays its
    kernels work on. Built once per checked query, shared by its engines."""

    checked: CheckedQuery
    module: object
    columns: list[tuple[str, str]]  # (attribute, dtype) of col0, col1, ...
    rec_ints: int  # record widths
    rec_floats: int
    string_columns: list[int]  # int columns of a record that hold string codes
    rows: RunRows | None  # the runs layout's: where ph/pf's rows keep a record's columns
    layout: str  # rt.COMPUTATIONS, RUNS or STATES: what a partial match's record stands for
    record: str  # what each record column keeps, as text (a snapshot's must be the same)
    tables: dict[str, np.ndarray]  # the automaton: tr_* per edge, st_* per state
    start_state: int
    max_takes: int
    within: int  # -1: no WITHIN
    measures: list[MeasureSpec]
    outputs: list[str]  # the composite's fields after start_seq (PARTITION BY and MEASURES)
    constants: StringConstants
    uses_tables: bool
    source: str = field(repr=False, default="")


Generated = tuple["Generator", dict[str, str], dict[str, tuple[bool, list[str]]], list[str],
                  list[MeasureSpec]]


def _generate(checked: CheckedQuery, variables: list[str],
              tables: dict[str, npt.NDArray[np.int64]], start: int,
              runs: Runs | None = None, facts_of_completed: bool = True) -> Generated:
    """The code of the query's DEFINEs (per state, `_specialise`), TAKEs and MEASURES; in
    the runs layout, with the record columns `runs` keeps as one, those of the row before
    read by DEFINEs at the key's row."""
    body = checked.query.body
    assert isinstance(body, ast.RecognizeQuery)
    gen = Generator(checked, variables)
    if runs is not None:
        gen.rec.aliases, gen.rec.key_row = runs.aliases(), set(runs.columns(first=False))
        for key, kind in runs.columns_first():
            gen.rec.col(key, kind)
    defines = {d.name: d.condition for d in body.defines}
    dfn = {}  # variable number -> its DEFINE (the body of d<number>)
    for number, var in enumerate(variables):
        if var in defines:
            with gen.defining():
                dfn[number] = gen.compiler(var).condition(defines[var])
    gen.defined = set(dfn)

    gen.facts = count_facts(tables, start, variables)
    measures: list[MeasureSpec] = []
    emit = []
    # what is known of a completed match's counts: the runs layout's plan needs the MEASURES
    # without the count tests it decides; the computations layout numbers its columns as
    # the releases before (their snapshots restore) without it
    with gen.knowing(completed_facts(tables, gen.facts) if facts_of_completed else None):
        for j, item in enumerate(body.measures):
            code = gen.compiler(None).compile(item.expr)
            kind = checked.types[item.expr] or "int"
            measures.append(MeasureSpec(item.name, kind, code.nullable))
            emit.append(f"e{j}[no] = {code.value}")
            if code.nullable:
                emit.append(f"e{j}n[no] = {code.null}")
    if body.skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        gen.rec.col((Tag.CNT, body.skip_var))
        gen.rec.col((Tag.FIDX if body.skip is ast.SkipTo.FIRST else Tag.LIDX, body.skip_var))
    defs, take = _specialise(gen, tables, defines, dfn)
    return gen, defs, take, emit, measures


@once_per_query
def compile_recognize(checked: CheckedQuery) -> RecognizeProgram:
    """The program of a checked MATCH_RECOGNIZE query (generated and loaded once, then
    shared); `RecognizeUnsupported` for what the jitted engine does not evaluate."""
    body = checked.query.body
    if not isinstance(body, ast.RecognizeQuery):
        raise TypeError(f"query {checked.name} is not a MATCH_RECOGNIZE query")
    elements = recognize_elements(body.pattern)
    variables = [e.var for e in elements]
    if len(variables) > MAX_VARIABLES:
        raise RecognizeUnsupported(f"more than {MAX_VARIABLES} pattern variables")
    nfa = compile_nfa(elements)
    tables, start, max_takes = automaton_tables(nfa.start, variables)
    gen, defs, take, emit, measures = _generate(checked, variables, tables, start)
    runs = runs_plan(gen, tables, start, body.skip, emit, body.within is not None)
    if runs is not None:  # again, in the runs layout's columns
        gen, defs, take, emit, measures = _generate(checked, variables, tables, start, runs)
        for t in runs.states:
            gen.rec.col((Tag.MULT, t))
        step = state_table(tables, gen, runs.states, start, defs,
                           lambda s: edge_literals(tables, s))
        if step is not None:
            ints = {"t", *(f"a{j}" for j, a in enumerate(gen.columns)
                           if dtype_of(gen.kind(a)) != "float64")}
            step = by_conjuncts(step, defs, ints)
            defs = {**defs, **dict(step.functions)}
        runs = replace(runs, step=step)  # None: a run may stand for two partial matches
    else:
        gen, defs, take, emit, measures = _generate(checked, variables, tables, start,
                                                    facts_of_completed=False)

    outputs = [a.name for a in checked.query.partition_by] + [m.name for m in measures]
    if body.select is not None:
        wanted = {a.name for a in body.select}
        outputs = [name for name in outputs if name in wanted]
    within = checked.time_units(body.within) if body.within is not None else -1
    rec_ints, rec_floats = len(rt.REC_FIXED) + len(gen.rec.ints) - 1, max(1, len(gen.rec.floats))
    if runs is not None:  # the columns `Runs.columns_first` numbered first
        used = runs.columns_first()
        rec_ints = len(rt.REC_FIXED) + sum(kind != FLOAT for _, kind in used)
        rec_floats = max(1, sum(kind == FLOAT for _, kind in used))
    places = None if runs is None else run_rows(gen, runs)
    source = module_source(gen, body, tables, start, max_takes, defs, take, emit, measures,
                            runs, (rec_ints, rec_floats), places)
    if places is not None:
        check_columns(source, (rec_ints, rec_floats), places.widths)
    module = load_module(source)
    uses_tables = any(f"{t}[" in source for t in STRING_TABLE_PARAMS.split(", "))
    kept = set(gen.rec.ints.values())  # the runs layout's: a run's, its key row's and
    if places is not None:  # those a completed match takes from its last row
        assert runs is not None
        kept = set(places.run_ints + places.key_ints) | end_columns(gen, runs)
    string_columns = [column for key, column in gen.rec.ints.items()
                      if len(key) > 2 and key[0] in (Tag.LAST, Tag.FIRST, Tag.MIN, Tag.MAX)
                      and isinstance(key[2], str) and gen.kind(key[2]) == AttrType.STRING
                      and column in kept]
    return RecognizeProgram(
        checked=checked, module=module,
        columns=[(a, dtype_of(gen.kind(a))) for a in gen.columns],
        rec_ints=rec_ints, rec_floats=rec_floats, string_columns=string_columns,
        rows=places,
        layout=rt.COMPUTATIONS if runs is None else rt.RUNS if runs.step is None else rt.STATES,
        record=" ".join(sorted(f"{'/'.join(map(str, key))}={kind}{column}" for kinds, kind in
                               ((gen.rec.ints, INT), (gen.rec.floats, FLOAT))
                               for key, column in kinds.items())),
        tables=tables, start_state=start, max_takes=max_takes, within=within,
        measures=measures, outputs=outputs, constants=gen.constants,
        uses_tables=uses_tables, source=source)


def _specialise(gen: Generator, tables: dict[str, npt.NDArray[np.int64]],
                defines: dict[str, ast.Expr], dfn: dict[int, str]
                ) -> tuple[dict[str, str], dict[str, tuple[bool, list[str]]]]:
    """The DEFINEs and TAKEs the kernel's step calls, each generated for the records of
    one automaton state, where what `count_facts` knows of their counts makes count tests
    constants (the same text for several states: one function). Returns the DEFINE bodies
    and the TAKE bodies (with whether it copies `src` first) by function name, and fills
    in gen.define_names and gen.take_names."""
    st_final, st_var = tables["st_final"].tolist(), tables["st_var"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()
    defs: dict[str, str] = {}
    named: dict[str, str] = {}  # DEFINE body -> its function
    takes: dict[str, tuple[bool, list[str]]] = {}
    take_named: dict[str, tuple[str, str]] = {}  # TAKE body -> its functions

    def tested(e: int) -> list[int]:  # the variables whose DEFINEs edge e's condition reads
        return ([tr_var[e]] if tr_var[e] >= 0 else []) + \
            [w for w in range(len(gen.variables)) if (tr_unl[e] >> w) & 1]

    for s, facts in enumerate(gen.facts):
        if facts is None or st_final[s] == 1:
            continue  # never a partial match's state
        wanted: set[int] = set()
        for q in chain(tables, s):
            for e in edges_of(tables, q):
                wanted.update(tested(e))
                if tr_act[e] == 1:
                    continue
                tg = tr_tgt[e]
                for r in chain(tables, tg):  # whether tg PROCEEDs to the final state
                    wanted.update(w for e2 in edges_of(tables, r) if tr_act[e2] == 1
                                  for w in tested(e2))
                with gen.knowing(facts):
                    body = gen.take_lines(st_var[q], tg)
                text = "\n".join(body)
                if text not in take_named:
                    n = len(take_named)
                    take_named[text] = (f"take{n}", f"take_here{n}")
                    takes[f"take{n}"], takes[f"take_here{n}"] = (True, body), (False, body)
                gen.take_names[(s, st_var[q], tg)] = take_named[text]
        for v in sorted(wanted & set(dfn)):
            var = gen.variables[v]
            with gen.knowing(facts), gen.defining():
                condition = gen.compiler(var).condition(defines[var])
            gen.state_defines.setdefault(s, []).append(condition)
            if condition not in named:
                named[condition] = f"d{v}" if condition == dfn[v] else f"d{v}_{s}"
                defs[named[condition]] = condition
            gen.define_names[(v, s)] = named[condition]
    return defs, takes
