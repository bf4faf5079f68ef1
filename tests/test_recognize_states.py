"""Which DEFINEs never hold together (`recognize_states.exclusive_pairs`), from the generated
conditions' top-level comparisons: what lets the states layout prove a run is one partial
match."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cep_core.compiler.recognize_states import exclusive_pairs

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
