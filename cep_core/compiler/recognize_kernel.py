"""The generated module of a MATCH_RECOGNIZE query (`module_source`): its DEFINEs, TAKEs
and MEASURES as functions, `release`, `advance` and `tick`, and the kernel that steps a
batch's rows, in the computations layout (one record per Flink computation state, stepped
per automaton state: `_step_lines`) or the runs layout (`recognize_runs`)."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from cep_core import ast
from cep_core.compiler.expressions import STRING_TABLE_PARAMS
from cep_core.compiler.recognize_automaton import edges_of
from cep_core.compiler.recognize_codegen import (
    CELL,
    INT,
    Generator,
    MeasureSpec,
    Tag,
    alloc,
    indent,
)
from cep_core.compiler.recognize_runs import (
    RUNS_STEP,
    Runs,
    run_functions,
    run_step_lines,
)
from cep_core.kernels import recognize_runtime as rt
from cep_core.kernels.recognize_runtime import RunRows
from cep_core.kernels.match_runtime import PREFETCH



def emit_args(measures: list[MeasureSpec]) -> list[str]:
    """The output arrays of MEASURES, after out_key, out_start, out_end."""
    args = []
    for j, m in enumerate(measures):
        args.append(f"e{j}")
        if m.nullable:
            args.append(f"e{j}n")
    return args


STATE_ARGS = rt.STATE_ARGS


def flat_cells(lines: list[str], flat: dict[str, tuple[str, int]],
               places: dict[str, dict[int, int]] | None = None) -> list[str]:
    """`lines` with each cell `array[row, column]` of an array in `flat` (its flat view's
    name and its rows' width) as `view[U((row) * width + column)]`: numba then neither
    wraps a negative index nor multiplies by a stride it reads from the array (records,
    key rows and columns are never negative; 1.07-1.09x on the M-shape in either layout).
    An array in `places` has its record columns elsewhere in its rows (`RunRows`)."""
    def cell(m: re.Match[str]) -> str:
        if m[1] not in flat:
            return m[0]
        view, width = flat[m[1]]
        column = m[3]
        if places is not None and m[1] in places:
            assert column != "c_" and int(column) in places[m[1]], \
                f"column {column} of {m[1]}: not in its rows"
            column = str(places[m[1]][int(column)])
        assert column == "c_" or int(column) < width, f"column {column} of {m[1]}: past {width}"
        return f"{view}[U(({m[2]}) * {width} + {column})]"
    return [CELL.sub(cell, line) for line in lines]


def _copy(src: str | None, dst: str, gen: Generator, src_arrays: str = "rec_i, rec_f",
          dst_arrays: str = "rec_i, rec_f") -> list[str]:
    """Record `dst` := record `src`, column by column (no slices: no array views made), of
    the int and float arrays named (the runs layout's runs are rows of `ph, pf`). `src`
    None: the start computation's record 0 as its TAKE reads it, zeros (its START, NEVER,
    is written by every TAKE from it), as constants: the compiler cannot tell record 0
    from `dst`, so copying it is a load and a store per column."""
    si, sf = src_arrays.split(", ") if src is not None else ("", "")
    di, df = dst_arrays.split(", ")
    ints, floats = ("0", "0.0") if src is None else (f"{si}[{src}, c_]", f"{sf}[{src}, c_]")
    lines = [f"for c_ in range({len(rt.REC_FIXED) + len(gen.rec.ints) - 1}):",
             f"    {di}[{dst}, c_] = {ints}"]
    if gen.rec.floats:
        lines += [f"for c_ in range({len(gen.rec.floats)}):",
                  f"    {df}[{dst}, c_] = {floats}"]
    return lines


Walk = tuple[int, list[str], list[tuple[int, int]]]  # (state, code, its TAKEs: var, target)


def _walks(tables: dict[str, npt.NDArray[np.int64]], gen: Generator, row: str,
           tab: str) -> list[Walk]:
    """Per state a partial match can be in, the code that evaluates every condition of its
    step on record `c` as it is (each DEFINE once, memoized in `m<v>`: -1 not yet, 0 false,
    1 true): which TAKE edges fire (`f<i>`) and whether each target PROCEEDs to the final
    state (`r<i>`), and the TAKEs in the walk's order. Flink's decision graph: a state has
    one PROCEED edge at most, so its depth-first walk is a chain (the state's edges in
    order, then those of the state its open PROCEED edge leads to) known here, with every
    table read a constant."""
    st_var, st_final = tables["st_var"].tolist(), tables["st_final"].tolist()
    tr_n = tables["tr_n"].tolist()
    tr_act, tr_tgt = tables["tr_act"].tolist(), tables["tr_tgt"].tolist()
    tr_var, tr_unl = tables["tr_var"].tolist(), tables["tr_unl"].tolist()
    nvars = len(gen.variables)
    defined = gen.defined

    source = -1  # the state of the record whose step is being generated

    def holds(v: int) -> list[str]:  # m<v> := the DEFINE of variable v, once
        if v not in defined:
            return [f"m{v} = 1"]
        name = gen.define_names[(v, source)]
        return [f"if m{v} < 0:",
                f"    m{v} = 1 if {name}(rif, rff, c, {row}, {tab}) else 0"]

    def edge_ok(e: int, flag: str, body: list[str]) -> list[str]:
        """`body` where edge e's condition holds (its variable's DEFINE and none of its
        `unless` variables'); `flag` is set False where it does not."""
        v, u = tr_var[e], tr_unl[e]
        tests = [] if v < 0 else [(v, 1)]
        tests += [(w, 0) for w in range(nvars) if (u >> w) & 1]
        lines: list[str] = []
        depth = 0
        for w, want in tests:
            lines += indent(holds(w), depth)
            lines += indent([f"if m{w} == {want}:"], depth)
            depth += 1
        lines += indent(body or ["pass"], depth)
        return lines

    def reaches(tg: int, flag: str) -> list[str]:
        """`flag` := target tg PROCEEDs to the final state (conditions on `c` and the row)."""
        lines: list[str] = []
        depth, q, seen = 0, tg, set()
        while q not in seen:
            seen.add(q)
            proceed = [e for e in edges_of(tables, q) if tr_act[e] == 1]
            if not proceed:
                break
            [e] = proceed
            nq = tr_tgt[e]
            if st_final[nq] == 1:
                lines += indent(edge_ok(e, flag, [f"{flag} = True"]), depth)
                break
            inner = edge_ok(e, flag, ["pass"])
            lines += indent(inner[:-1], depth)  # the chain goes on where the edge holds
            depth += _depth(inner[-1])
            q = nq
        return lines

    takes: list[tuple[int, int]] = []  # (variable of the state taking the row, target)

    def walk(s: int, depth: int, seen: frozenset[int]) -> list[str]:
        assert s not in seen, "a cycle of PROCEED edges"  # never from compile_nfa
        lines: list[str] = []
        follow = None
        for e in edges_of(tables, s):
            if tr_act[e] == 1:
                follow = e
                continue
            i = len(takes)
            takes.append((st_var[s], tr_tgt[e]))
            body = [f"f{i} = True"]
            if st_final[tr_tgt[e]] == 2:
                body += reaches(tr_tgt[e], f"r{i}")
            lines += edge_ok(e, f"f{i}", body)
        if follow is not None:
            lines += edge_ok(follow, "", walk(tr_tgt[follow], 0, seen | {s}))
        return lines

    branches: list[tuple[int, list[str], list[tuple[int, int]]]] = []
    for s in range(len(st_var)):
        if st_final[s] == 1 or tr_n[s] == 0 or gen.facts[s] is None:
            continue  # no partial match is ever in state s
        takes = []
        source = s
        evaluate = walk(s, 0, frozenset())
        branches.append((s, evaluate, takes))
    return branches


def _step_lines(tables: dict[str, npt.NDArray[np.int64]], gen: Generator, row: str,
                tab: str, final: int, start: int) -> tuple[list[str], list[str]]:
    """One computation `c` (partial match j of the key's queue) on the current row, its
    code unrolled per state; and the step of the start computation (always the queue's
    last, in the start state: below), which the kernel makes after the loop over the
    others.

    First every condition is evaluated on `c` as it is (`_walks`). Then the TAKEs are made
    in the walk's order, the
    same queue adds as Flink's: each into a new record, except the last, which reuses `c`'s
    (no copy; `c` is dropped after its step anyway) unless `c` is the start computation,
    whose new records are zeroed (`_copy` of None) instead of copied from its record 0.

    A key's queue of partial matches is always sorted by start (its heap then needs no
    sifting): the kernel steps it in order, each computation's new ones start where it did,
    the start computation (start NEVER, always last) adds a match starting on this row
    (after every other) and then itself; pruning keeps the order. So the new queue is
    appended to (`lp`), as Java's PriorityQueue.add would place each one."""
    S = rt
    st_final = tables["st_final"].tolist()
    nvars = len(gen.variables)
    branches = _walks(tables, gen, row, tab)

    def block(s: int, evaluate: list[str], its_takes: list[tuple[int, int]],
              fresh: bool = False) -> list[str]:  # fresh: `c` is the start computation
        n = len(its_takes)
        lines = ["kept = False"]
        lines += [f"f{i} = False" for i in range(n)] + [f"r{i} = False" for i in range(n)]
        lines += evaluate
        for i, (var, tg) in enumerate(its_takes):
            copy, here = gen.take_names[(s, var, tg)]
            later = " or ".join(f"f{j}" for j in range(i + 1, n))
            lines.append(f"if f{i}:")
            act = []
            reuse = f"c != 0 and not ({later})" if later else "c != 0"
            if fresh:
                act += [*alloc("d"), *_copy(None, "d", gen),
                        f"{here}(rif, rff, d, idx, sq, {row})"]
            else:
                act += [f"if {reuse}:",
                        "    d = c",
                        "    kept = True",
                        f"    {here}(rif, rff, d, idx, sq, {row})",
                        "else:",
                        *indent(alloc("d")),
                        f"    {copy}(rif, rff, c, d, idx, sq, {row})"]
            if st_final[tg] == 1:  # a TAKE into the final state: completed now
                act.append("nlc = heap_add(lc, 0, nlc, d, rec_i)")
            else:
                act += ["lp[nlp] = d", "nlp += 1"]
                if st_final[tg] == 2:
                    act += [f"if r{i}:",
                            *indent(alloc("m")),
                            *indent(_copy("d", "m", gen)),
                            f"    rec_i[m, {S.STATE}] = {final}",
                            "    nlc = heap_add(lc, 0, nlc, m, rec_i)"]
            lines += indent(act)
        return lines

    memo = [f"m{v} = -1" for v in range(nvars)]
    # the partial matches (the queue but its last entry, the start computation)
    step = ["c = ph[pb + j]", f"s = rec_i[c, {S.STATE}]", *memo]
    for number, (s, evaluate, its_takes) in enumerate(branches):
        step.append(f"{'if' if number == 0 else 'elif'} s == {s}:")
        step += indent(block(s, evaluate, its_takes))
    if not branches:
        step.append("kept = False")
    else:
        step += ["else:", "    kept = False"]
    step += ["if not kept:",
             "    free[free_top] = c",
             "    free_top += 1"]
    # the start computation: its state is the start state, its record 0 (never written)
    first = ["c = 0", *memo]
    for s, evaluate, its_takes in branches:
        if s == start:
            first += block(s, evaluate, its_takes, fresh=True)
    first += ["lp[nlp] = 0", "nlp += 1"]
    return step, first


def _earliest_end(places: RunRows | None) -> list[str]:
    """`advance`'s search for the earliest end of a partial match by WITHIN (`end`), and
    the end of those that end then; it returns where none ends by `ts`."""
    S = rt
    if places is not None and S.START_TS not in places.ints:  # (no WITHIN: not called)
        return [f"return {S.DONE}"]
    if places is not None:  # the runs are in order of start, so of start time
        start_ts = places.ints[S.START_TS]
        return ["if npart == 0:", f"    return {S.DONE}",
                f"end = ph[pb + 1, {start_ts}] + within",
                "if end > ts:", f"    return {S.DONE}",
                f"key_i[k, {S.K_NPART}] = drop_runs(ph, pf, pb + 1, npart, {start_ts}, "
                "end - within)"]
    return ["found = False",
            "end = 0",
            "for j in range(npart):",
            "    h = ph[pb + j]",
            "    if h != 0:",
            f"        e = rec_i[h, {S.START_TS}] + within",
            "        if not found or e < end:",
            "            end = e",
            "            found = True",
            "if not found or end > ts:",
            f"    return {S.DONE}",
            f"key_i[k, {S.K_NPART}] = prune(ph, pb, npart, rec_i, {S.START_TS}, "
            "end - within, True, free, ctr)"]


def _depth(line: str) -> int:
    """The indentation depth (4 spaces) of a generated line."""
    return (len(line) - len(line.lstrip(" "))) // 4


def _row_functions(gen: Generator, runs: Runs | None, dfn: dict[str, str],
                   take: dict[str, tuple[bool, list[str]]], emit: list[str], row: str,
                   tab: str, outs: str, widths: tuple[int, int],
                   places: RunRows | None) -> list[str]:
    """The functions of a record and the current row: the DEFINEs, the TAKEs (computations
    layout) or the run functions (runs layout), and `emit`. `widths`: the rows of the
    arrays the DEFINEs read (records, or in the runs layout the runs' rows, `places`)."""

    def flat_body(code: list[str]) -> list[str]:
        """DEFINEs, TAKEs and run functions take their records' arrays as flat views."""
        flat = {"rec_i": ("rec_i", widths[0]), "rec_f": ("rec_f", widths[1])}
        moved = None if places is None else {"rec_i": places.ints, "rec_f": places.floats}
        return ["U = np.uint64", *flat_cells(code, flat, moved)]

    return [
        *[line for name, condition in dfn.items() for line in (
            "@njit(cache=True, error_model='numpy')",
            f"def {name}(rec_i, rec_f, r, {'' if runs is None else 'kr, '}{row}, {tab}):",
            *indent(flat_body([f"return {condition}"])), "", "")],
        *[line for name, (copies, body) in (take.items() if runs is None else [])
          for line in (
            "@njit(cache=True, error_model='numpy')",
            f"def {name}(rec_i, rec_f, {'src, ' if copies else ''}dst, idx, sq, {row}):",
            *indent(flat_body((_copy("src", "dst", gen) if copies else []) + body)), "", "")],
        *[line for name, code in (run_functions(gen, runs) if runs is not None else [])
          for line in ("@njit(cache=True, error_model='numpy')",
                       f"def {name}(rec_i, rec_f, dst, idx, sq, {row}):",
                       *indent((code if name == "run_end" else flat_body(code)) or ["pass"]),
                       "", "")],
        _inline(f"rec_i, rec_f, r, now, no, {outs}, {tab}", runs is not None),
        f"def emit(rec_i, rec_f, r, now, no, {outs}, {tab}):",
        *indent(emit or ["pass"]), "", "",
    ]


def _queue_functions(gen: Generator, body: ast.RecognizeQuery, places: RunRows | None,
                     common: str, rows: str, outs: str, tab: str) -> list[str]:
    """`release` (Flink's completed matches leave while none that started earlier is
    alive), `advance` (WITHIN: partial matches whose interval ends by `ts` end, in order of
    their end) and `tick` (`advance` for every key)."""
    S = rt
    skip = body.skip
    if skip is ast.SkipTo.PAST_LAST_ROW:
        bound = [f"limit = rec_i[m, {S.LAST_IDX}]", "inclusive = True"]
    elif skip is ast.SkipTo.NEXT_ROW:
        bound = [f"limit = rec_i[m, {S.START}]", "inclusive = True"]
    else:
        which = Tag.FIDX if skip is ast.SkipTo.FIRST else Tag.LIDX
        bound = [f"if {gen.rec.count(body.skip_var, 'm')} == 0:",
                 f"    ctr[{S.ERR_START}] = rec_i[m, {S.START_SEQ}]",
                 f"    ctr[{S.ERR_END}] = rec_i[m, {S.LAST_SEQ}]",
                 f"    return {S.SKIP_MISSING}",
                 f"limit = {gen.rec.read((which, body.skip_var), INT, 'm')}",
                 f"if limit == rec_i[m, {S.START}]:",
                 f"    ctr[{S.ERR_START}] = rec_i[m, {S.START_SEQ}]",
                 f"    ctr[{S.ERR_END}] = rec_i[m, {S.LAST_SEQ}]",
                 f"    return {S.SKIP_FIRST}",
                 "inclusive = False"]
    if places is None:  # the queue's first handle: its earliest partial match, or record 0
        earliest = f"rec_i[ph[pb], {S.START}]"
        drop = f"npart = prune(ph, pb, npart, rec_i, {S.START}, limit, inclusive, free, ctr)"
    else:  # the key's first run, the earliest (a key's rows: the key's row, its runs)
        start = places.ints[S.START]
        earliest = f"(ph[pb + 1, {start}] if npart > 0 else {S.NEVER})"
        drop = f"npart = drop_runs(ph, pf, pb + 1, npart, {start}, limit)"  # inclusive
    return [
        _inline(f"k, now, {common}", places is not None),
        f"def release(k, now, {common}):",
        f"    pb = k * {rows}",
        "    cb = k * ccap",
        f"    npart = key_i[k, {S.K_NPART}]",
        f"    nc = key_i[k, {S.K_NCOMP}]",
        f"    while nc > 0 and rec_i[ch[cb], {S.START}] <= {earliest}:",
        "        m = ch[cb]",
        "        nc = heap_poll(ch, cb, nc, rec_i)",
        *indent(bound, 2),
        f"        {drop}",
        f"        nc = prune(ch, cb, nc, rec_i, {S.START}, limit, inclusive, free, ctr)",
        f"        key_i[k, {S.K_NPART}] = npart",
        f"        key_i[k, {S.K_NCOMP}] = nc",
        f"        no = ctr[{S.OUT_N}]",
        "        out_key[no] = k",
        f"        out_start[no] = rec_i[m, {S.START_SEQ}]",
        f"        out_end[no] = rec_i[m, {S.LAST_SEQ}]",
        f"        emit(rec_i, rec_f, m, now, no, {outs}, {tab})",
        f"        ctr[{S.OUT_N}] = no + 1",
        f"        free[ctr[{S.FREE_TOP}]] = m",
        f"        ctr[{S.FREE_TOP}] += 1",
        f"    key_i[k, {S.K_NPART}] = npart",
        f"    key_i[k, {S.K_NCOMP}] = nc",
        f"    return {S.DONE}", "", "",
        # WITHIN: partial matches whose interval ends by `ts` end, in order of their end
        _inline(f"k, ts, within, {common}", places is not None),
        f"def advance(k, ts, within, {common}):",
        f"    pb = k * {rows}",
        "    while True:",
        f"        npart = key_i[k, {S.K_NPART}]",
        *indent(_earliest_end(places), 2),
        f"        status = release(k, end, {common})",
        f"        if status != {S.DONE}:",
        "            return status", "", "",
        "@njit(cache=True, error_model='numpy')",
        f"def tick(k0, nkeys, ts, within, pcap, ccap, out_cap, pt, {', '.join(STATE_ARGS)}, "
        f"{outs}):",
        "    for k in range(k0, nkeys):",
        f"        if ctr[{S.OUT_N}] + key_i[k, {S.K_NCOMP}] > out_cap:",
        f"            return {S.FULL_OUTPUT}, k",
        f"        status = advance(k, ts, within, {common})",
        f"        if status != {S.DONE}:",
        "            return status, k",
        f"    return {S.DONE}, nkeys", "", "",
    ]


def _group_function(ncols: int) -> list[str]:
    """`group`: rows first..last - 1 of a batch, key by key (a stable counting sort; each
    key's ids are filled in after the rows, in one sequential pass)."""
    cols = ", ".join(f"col{j}" for j in range(ncols))
    grouped = ", ".join(["g_kid", "g_seq", "g_ts"] + [f"g{j}" for j in range(ncols)])
    return [
        "@njit(cache=True, error_model='numpy')",
        f"def group(first, last, nkeys, kid, seq, ts, {cols}{', ' if cols else ''}order, "
        f"{grouped}, start):",
        "    for k in range(nkeys + 1):",
        "        start[k] = 0",
        "    for i in range(first, last):",
        "        start[kid[i] + 1] += 1",
        "    for k in range(nkeys):",
        "        start[k + 1] += start[k]",
        "    for i in range(first, last):",
        "        k = kid[i]",
        "        at = start[k]",
        "        start[k] = at + 1",
        "        order[at] = i",
        "        g_seq[at] = seq[i]",
        "        g_ts[at] = ts[i]",
        *[f"        g{j}[at] = col{j}[i]" for j in range(ncols)],
        "    at = 0",  # start[k]: where key k's rows end
        "    for k in range(nkeys):",
        "        while at < start[k]:",
        "            g_kid[at] = k",
        "            at += 1", "", "",
    ]


def module_source(gen: Generator, body: ast.RecognizeQuery,
                   tables: dict[str, npt.NDArray[np.int64]], start: int, max_takes: int,
                   dfn: dict[str, str], take: dict[str, tuple[bool, list[str]]],
                   emit: list[str], measures: list[MeasureSpec], runs: Runs | None,
                   widths: tuple[int, int], places: RunRows | None = None) -> str:
    """The module of a query. `widths`: its records' (ints, floats); in the runs layout
    (`runs`, `places`) the functions on a run's row read the rows of ph/pf instead."""
    if places is not None:
        widths = places.widths
    moved = None if places is None else {"ph": places.ints, "pf": places.floats}
    row = ", ".join(["t"] + [f"a{j}" for j in range(len(gen.columns))])
    tab = "sc, " + STRING_TABLE_PARAMS + ", pt"  # pt: MATCH_PROCTIME (the call's clock)
    outs = ", ".join(["out_key", "out_start", "out_end"] + emit_args(measures))
    final = int(np.flatnonzero(tables["st_final"] == 1)[0])
    S = rt
    # the key's completed matches after the WITHIN block (`advance` may release some)
    completed = "ncomp" if body.within is None else f"key_i[k, {S.K_NCOMP}]"
    lines = [
        *([] if runs is None else ["from cep_core.kernels.match_runtime import prefetch", "",
                                   "INLINE_RUNTIME = True  # (recognize_runtime.inlined_here)"]),
        "from cep_core.kernels.recognize_runtime import drop_runs, heap_add, heap_poll, jdiv, "
        "jmod, prune",
        "", "",
        *_row_functions(gen, runs, dfn, take, emit, row, tab, outs, widths, places),
    ]
    if runs is not None and runs.step is not None:  # the states layout's step (a constant)
        lines += [f"STEP = np.array({list(runs.step.table)!r}, np.int64)", "", ""]
    skip = body.skip
    common = f"key_i, ph, pf, ch, pcap, ccap, rec_i, rec_f, free, ctr, {outs}, {tab}"
    rows = "pcap" if runs is None else "(pcap + 1)"  # a key's rows of `ph`
    lines += _queue_functions(gen, body, places, common, rows, outs, tab)
    cols = ", ".join(f"col{j}" for j in range(len(gen.columns)))

    if runs is None:
        step, first_step = _step_lines(tables, gen, row, tab, final, start)
        queue = ["for j in range(npart - 1):", *indent(step), *first_step,
                 "for j in range(nlp):", "    ph[pb + j] = lp[j]",
                 f"key_i[k, {S.K_NPART}] = nlp"]
        room = [f"need = npart * {max_takes}",
                "if need + 1 > pcap or ncomp + need > ccap:",
                f"    status = {S.FULL_QUEUE}",
                "    break",
                "if free_top + pool - high < 2 * need:",
                f"    status = {S.FULL_POOL}",
                "    break"]
    else:  # a run's partial matches may each complete on every TAKE edge
        step, first_step = run_step_lines(tables, gen, row, tab, start, runs,
                                          skip is ast.SkipTo.PAST_LAST_ROW)
        runs_flat = {"ph": ("phf", widths[0]), "pf": ("pff", widths[1])}
        waiting = [f"waiting = {completed}"]
        # (the states layout's inlined by numba: LLVM leaves the loop by conjuncts a call)
        lines += [_inline(f"{RUNS_STEP}, {row}, {tab}", runs.step is not None),
                  f"def step_runs({RUNS_STEP}, {row}, {tab}):",
                  *indent(flat_cells(step, runs_flat, moved)), "", ""]
        if runs.step is None:
            queue = ["kr = pb", *waiting,
                     f"w, branches, ncq, gone = step_runs({RUNS_STEP}, {row}, {tab})",
                     *first_step, f"key_i[k, {S.K_NPART}] = w",
                     f"key_i[k, {S.K_BRANCHES}] = branches"]
            room = [f"need = (key_i[k, {S.K_BRANCHES}] + 1) * {max_takes}",
                    "if npart + 1 > pcap:",
                    f"    status = {S.FULL_QUEUE}",
                    "    break",
                    "if ncomp + need > ccap:",
                    f"    status = {S.FULL_COMPLETED}",
                    "    break",
                    "if free_top + pool - high < need:",
                    f"    status = {S.FULL_POOL}",
                    "    break"]
        else:  # the states layout: no partial matches to count; each run (and the start
            # computation) completes one match at most on a row; the tests in one branch,
            # as MATCH's kernel makes them
            queue = ["kr = pb", *waiting, f"w, ncq, gone = step_runs({RUNS_STEP}, {row}, {tab})",
                     *first_step, f"key_i[k, {S.K_NPART}] = w"]
            full = {S.FULL_QUEUE: "npart + 1 > pcap", S.FULL_COMPLETED: "ncomp + need > ccap",
                    S.FULL_POOL: "free_top + pool - high < need",
                    S.FULL_OUTPUT: "no + ncomp + need > out_cap"}
            room = ["need = npart + 1", f"if {' or '.join(full.values())}:",
                    "    status = " + " else ".join(f"{status} if {test}" for status, test in
                                                    list(full.items())[:-1]) +
                    f" else {S.FULL_OUTPUT}", "    break"]
    if runs is None or runs.step is None:
        room += ["if no + ncomp + need > out_cap:",
                 f"    status = {S.FULL_OUTPUT}", "    break"]
    ncols = len(gen.columns)
    grouped = ", ".join(["g_kid", "g_seq", "g_ts"] + [f"g{j}" for j in range(ncols)])
    # a chunk's rows key by key (a key's records stay in the cache), in the computations
    # layout
    by_key = runs is None
    lines += _group_function(ncols) if by_key else []
    stopping: list[str] = []
    if by_key and skip in (ast.SkipTo.FIRST, ast.SkipTo.LAST):
        # a key whose skip stops the query stops: the other keys go on, so that the batch
        # stops on its first row that stops (the rows are stepped key by key)
        stopping = [f"if status == {S.SKIP_MISSING} or status == {S.SKIP_FIRST}:",
                    f"    if ctr[{S.STOP}] == {S.DONE} or i < ctr[{S.STOP_ROW}]:",
                    f"        ctr[{S.STOP}] = status",
                    f"        ctr[{S.STOP_ROW}] = i",
                    f"        ctr[{S.STOP_START}] = ctr[{S.ERR_START}]",
                    f"        ctr[{S.STOP_END}] = ctr[{S.ERR_END}]",
                    f"    key_i[k, {S.K_LAST_TS}] = {S.NEVER}",
                    f"    status = {S.DONE}",
                    "    p += 1",
                    "    continue"]
    if by_key:
        rows_in = ["if p == 0:",
                   # every key id of the batch is below key_i's length (the engine made them)
                   f"    group(first, last, key_i.shape[0], kid, seq, ts, {cols}"
                   f"{', ' if cols else ''}order, {grouped}, counts)",
                   "while p < last - first:",
                   "    i = order[p]", "    k = g_kid[p]", "    t = g_ts[p]", "    sq = g_seq[p]"]
        loads = [f"a{j} = g{j}[p]" for j in range(ncols)]
    else:  # in their order, as MATCH's kernel (the runs layout: a key's runs are its rows),
        # with the key's row and first run fetched into the cache some rows ahead
        width, fields, half = widths[0], len(S.KEY_FIELDS), PREFETCH // 2
        rows_in = ["while p < last - first:", "    i = first + p",
                   f"    if i + {PREFETCH} < n:",
                   f"        prefetch(kif, U(kid[U(i + {PREFETCH})] * {fields}))",
                   f"    if i + {half} < n:",
                   f"        prefetch(phf, U((kid[U(i + {half})] * (pcap + 1) + 1) * {width}))",
                   "    k = kid[U(i)]", "    t = ts[U(i)]", "    sq = seq[U(i)]"]
        loads = [f"a{j} = col{j}[U(i)]" for j in range(ncols)]
    kernel = [
        "@njit(cache=True, error_model='numpy')",
        f"def kernel(c0, p0, n, within, pcap, ccap, out_cap, pt, kid, seq, ts, {cols}"
        f"{', ' if cols else ''}order, {grouped}, counts, "
        f"{', '.join(STATE_ARGS)}, {outs}, out_row, dead):",
        "    U = np.uint64",  # flat views of the key rows, the records and a key's runs
        "    kif, rif, rff = key_i.reshape(-1), rec_i.reshape(-1), rec_f.reshape(-1)",
        *([] if by_key else ["    phf, pff = ph.reshape(-1), pf.reshape(-1)"]),
        f"    status = {S.DONE}",
        "    pool = rec_i.shape[0]",
        # the free list's top and the pool's high-water mark in locals (the compiler cannot
        # tell `ctr` from the record arrays), in `ctr` while `advance` or `release` runs
        f"    free_top = ctr[{S.FREE_TOP}]",
        f"    high = ctr[{S.HIGH}]",
        f"    no = ctr[{S.OUT_N}]",  # (`release` alone adds to it: 1.01-1.02x on the M-shape)
        "    first = c0",
        "    p = p0",
        "    while first < n:",
        "        last = min(n, first + len(order))",
        *indent(rows_in, 2),
        f"            if t < key_i[k, {S.K_LAST_TS}]:",
        f"                dead[ctr[{S.DEAD_N}]] = i",
        f"                ctr[{S.DEAD_N}] += 1",
        "                p += 1",
        "                continue",
        f"            npart = key_i[k, {S.K_NPART}]",
        f"            ncomp = key_i[k, {S.K_NCOMP}]",
        *indent(room, 3),
        *indent(loads, 3),
        f"            key_i[k, {S.K_LAST_TS}] = t",
        *([f"            o0 = ctr[{S.OUT_N}]"] if by_key else []),
        *([] if body.within is None else [  # (`within`: the query's, never -1 then)
            f"            ctr[{S.FREE_TOP}] = free_top",
            f"            ctr[{S.HIGH}] = high",
            f"            status = advance(k, t, within, {common})",
            f"            free_top = ctr[{S.FREE_TOP}]",
            f"            no = ctr[{S.OUT_N}]",
            *indent(stopping, 3),
            f"            if status != {S.DONE}:",
            "                break"]),
        f"            idx = key_i[k, {S.K_ROWS}]",
        f"            npart = key_i[k, {S.K_NPART}]",
        f"            pb = k * {rows}",
        "            nlp = 0",
        "            nlc = 0",
        *indent(queue, 3),
        f"            nc = {completed}",
        "            if nlc > 0:",
        "                cb = k * ccap",
        "                for j in range(nlc):",
        "                    nc = heap_add(ch, cb, nc, lc[j], rec_i)",
        f"                key_i[k, {S.K_NCOMP}] = nc",
        f"            key_i[k, {S.K_ROWS}] = idx + 1",
        "            if nc > 0:",
        f"                ctr[{S.FREE_TOP}] = free_top",
        f"                ctr[{S.HIGH}] = high",
        f"                status = release(k, t, {common})",
        f"                free_top = ctr[{S.FREE_TOP}]",
        f"                no = ctr[{S.OUT_N}]",
        *indent(stopping, 4),
        f"                if status != {S.DONE}:",
        "                    break",
        *([f"            for q in range(o0, ctr[{S.OUT_N}]):",  # (the rows key by key)
           "                out_row[q] = i"] if by_key else []),
        "            p += 1",
        f"        if status != {S.DONE}:",
        "            break",
        "        first = last",
        "        p = 0",
        f"    ctr[{S.FREE_TOP}] = free_top",
        f"    ctr[{S.HIGH}] = high",
        *([f"    if status == {S.DONE} and ctr[{S.STOP}] != {S.DONE}:",
           f"        ctr[{S.ERR_START}] = ctr[{S.STOP_START}]",
           f"        ctr[{S.ERR_END}] = ctr[{S.STOP_END}]",
           f"        return ctr[{S.STOP}], first, p"] if stopping else []),
        "    return status, first, p", "",
    ]
    flat = {"key_i": ("kif", len(S.KEY_FIELDS))}
    flat.update({"ph": ("phf", widths[0]), "pf": ("pff", widths[1])} if runs is not None else
                {"rec_i": ("rif", widths[0]), "rec_f": ("rff", widths[1])})
    kernel = flat_cells(kernel, flat, moved)
    # nothing allocates (the engine gives the kernel its scratch): no reference counts kept
    # across calls (numba's atomic increments and decrements of each array argument)
    return "\n".join(lines + kernel).replace(_NJIT, _NJIT[:-1] + ", _nrt=False)").replace(
        _INLINE, _INLINE[:-1] + ", _nrt=False)")


_NJIT = "@njit(cache=True, error_model='numpy')"
# what the kernel calls on a row, inlined (numba's, before LLVM sees it): a call left in
# the kernel's loop over rows, even one never made, costs every row (the M-shape's 0.87x of
# MATCH -> 0.92x with these and no WITHIN block; docs/benchmarks.md)
_INLINE = "@njit(cache=True, error_model='numpy', inline='always')"


def _inline(params: str, runs: bool) -> str:
    """The decorator of a function the kernel calls on a row with these parameters:
    inlined in the runs and states layouts, unless a call passes more than 30 arguments,
    which CPython compiles as a call with *args (its STACK_USE_GUIDELINE), a call numba
    cannot inline (many MEASURES). The computations layout keeps its calls: inlined, some
    of its kernels took 1.5x as long to compile, for a speed not measured."""
    return _INLINE if runs and params.count(",") + 1 <= 30 else _NJIT
