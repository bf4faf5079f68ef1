"""Which DEFINEs never hold together (`recognize_states.exclusive_pairs`), from the generated
conditions' top-level comparisons: what lets the states layout prove a run is one partial
match."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cep_core.compiler.recognize_states import StateTable, by_conjuncts, exclusive_pairs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("a, b, never", [
    ("(a0 >= rec_i[kr, 2])", "(a0 < rec_i[kr, 2])", True),  # complements
    ("(a0 > rec_i[r, 9])", "(a0 < rec_i[r, 9])", True),  # neither holds on a tie
    ("(a0 > rec_i[r, 9])", "(rec_i[r, 9] > a0)", True),  # the same, operands swapped
    ("(a1 == 3)", "(a1 != 3)", True),
    ("(a0 >= rec_i[r, 9])", "(a0 <= rec_i[r, 9])", False),  # both hold on a tie
    ("(a0 > rec_i[r, 9])", "(a0 < rec_i[r, 8])", False),  # other operands
    ("(a0 > rec_i[r, 9])", "(a1 < rec_i[r, 9])", False),
    # conjuncts: one complementary pair is enough, under `&` or `and`, nested
    ("((a0 > rec_i[r, 9])) & ((a0 >= rec_i[kr, 2]))",
     "((a0 >= rec_i[r, 9])) & ((a0 < rec_i[kr, 2]))", True),
    ("(a2 == 1) and ((a0 < 5) & (a1 > 0))", "(a0 >= 5)", True),
    # a disjunction proves nothing, nor a negation, nor a chained comparison
    ("(a0 < 5) | (a1 > 0)", "(a0 >= 5)", False),
    ("not (a0 >= 5)", "(a0 >= 5)", False),
    ("(1 < a0 < 5)", "(a0 <= 1)", False),
])
def test_defines_with_comparisons_no_order_satisfies_never_hold_together(a, b, never):
    assert exclusive_pairs(["x", "y"], {"x": a, "y": b}) == ([(0, 1)] if never else [])


def test_every_pair_is_tried():
    defs = {"r": "(a0 >= p)", "d": "(a0 < p)", "e": "(a0 < p) & (a0 < s)", "t": "True"}
    assert exclusive_pairs(["r", "d", "e", "t"], defs) == [(0, 1), (0, 2)]


def test_the_generated_module_is_the_same_in_every_process():
    # the table's bits are the DEFINE functions in one order whatever the hash seed: a
    # module that differs by process is compiled again by each (it is cached by its text)
    script = ("import hashlib, sys; sys.path[:0] = ['.', 'tests']\n"
              "from test_recognize_jit import MSHAPE_SQL, _strict\n"
              "from cep_core.compiler.recognize import compile_recognize\n"
              "print(hashlib.sha256(compile_recognize(_strict(MSHAPE_SQL)).source.encode())"
              ".hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed},
                              cwd=ROOT).stdout for seed in ("1", "2", "3")}
    assert len(digests) == 1 and len(digests.pop()) == 65


# the M-shape's DEFINEs (R1's first row, R1, D1, E) as the compiler generates them: `r` a
# run, `kr` its key's row (the row before)
MSHAPE_DEFS = {"d1": "(((a0 > rec_i[r, 13])) & ((a0 >= rec_i[r, 13])))",
               "d2": "(((a0 > rec_i[r, 13])) & ((a0 >= rec_i[kr, 15])))",
               "d3": "(((a0 >= rec_i[r, 13])) & ((a0 < rec_i[kr, 15])))",
               "d4": "(((a0 < rec_i[r, 13])) & ((a0 < rec_i[kr, 15])))"}


def _table(calls, states=2):
    # an arbitrary table: every entry its own number
    n = (states + 1) << len(calls)
    return StateTable(tuple(range(1, states + 1)), tuple(calls), tuple(range(n)), 2)


def test_a_table_by_conjuncts_looks_up_what_the_table_by_defines_does():
    calls = list(MSHAPE_DEFS)
    table = _table(calls)
    by = by_conjuncts(table, MSHAPE_DEFS, {"t", "a0"})
    # a0 > first, a0 >= first on the run; a0 >= before once per row; `<` is `>=` negated
    assert [code for _, code in by.functions] == [
        "a0 > rec_i[r, 13]", "a0 >= rec_i[r, 13]", "a0 >= rec_i[kr, 15]"]
    assert by.row_calls == 1 and len(by.table) == 3 << 3
    for price, first, before, number in itertools.product(range(3), range(3), range(3),
                                                           range(3)):
        defines = [price > first, price > first and price >= before,
                   price >= first and price < before, price < first and price < before]
        conjuncts = [price > first, price >= first, price >= before]
        want = table.table[(number << 4) + sum(v << j for j, v in enumerate(defines))]
        bits = sum(v << j for j, v in enumerate(conjuncts))
        assert by.table[(number << 3) + bits] == want


def test_a_float_comparison_is_no_negation_of_its_opposite():
    # NaN: `a0 < x` and `a0 >= x` both fail, so each is a conjunct of its own
    defs = {"u": "((a0 >= rec_i[r, 3])) & ((a0 < rec_f[kr, 1]))",
            "d": "((a0 < rec_i[r, 3])) & ((a0 >= rec_f[kr, 1]))"}
    as_floats = by_conjuncts(_table(list(defs)), defs, {"t"})
    assert len(as_floats.functions) == 4 and as_floats.row_calls == 2
    as_ints = by_conjuncts(_table(list(defs)), defs, {"t", "a0"})
    assert [c for _, c in as_ints.functions] == ["a0 >= rec_i[r, 3]", "a0 < rec_f[kr, 1]",
                                                 "a0 >= rec_f[kr, 1]"]


def test_the_table_by_defines_stays_where_conjuncts_would_not_pay():
    # more comparisons on a run than DEFINEs, or a table past MAX_CONJUNCT_TABLE entries
    defs = {"x": " & ".join(f"(a0 > rec_i[r, {c}])" for c in range(3))}
    table = _table(list(defs))
    assert by_conjuncts(table, defs, {"a0"}) is table
    wide = {f"x{j}": f"(a{j} > 3) & (a{j} < 9)" for j in range(6)}  # 12 row conjuncts
    table = _table(list(wide))
    assert by_conjuncts(table, wide, {f"a{j}" for j in range(6)}) is table
