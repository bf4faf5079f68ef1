"""MATCH_RECOGNIZE against Apache Flink itself (slow: Flink starts a JVM per test and runs
every statement, a few minutes in all on 2 cores): `make test-full` only, with `.venv-flink`
(`make venv-flink`). Three families of statements (tests/recognize_flink/differential.py):
the base one (seed 5), the navigation constructs (`--family navigation`, seed 21) and rows
sharing their time under a secondary ORDER BY (`--family ties`, seed 22)."""

import os
import random

import pytest

from tests.recognize_flink import differential

pytestmark = pytest.mark.skipif(
    os.environ.get("CEP_TEST_FULL") != "1" or not differential.FLINK_PYTHON.exists(),
    reason="CEP_TEST_FULL=1 and .venv-flink (make venv-flink) run it")


def test_generated_statements_answer_as_flink():
    rng = random.Random(5)  # as `differential.py --cases 60 --rows 300 --seed 5`
    data = differential.rows(300, rng)
    statements = {f"case{i}": differential.statement(rng) for i in range(60)}
    statements["mshape"] = differential.MSHAPE
    answers = differential.run_flink(statements, data)
    problems = differential.compare(statements, data, answers)
    print("base:", differential.summary(statements, data, answers, problems))  # pytest -s
    assert problems == []
    # not vacuous: 10 of these statements find matches (794 rows), 30 are answered in all
    assert sum(isinstance(a, list) and len(a) > 0 for a in answers.values()) >= 8


def test_navigation_statements_answer_as_flink():
    # as `differential.py --family navigation --cases 40 --rows 200 --seed 21`
    rng = random.Random(21)
    data = differential.rows(200, rng)
    statements = {f"case{i}": differential.navigation_statement(rng) for i in range(40)}
    answers = differential.run_flink(statements, data)
    problems = differential.compare(statements, data, answers)
    print("navigation:", differential.summary(statements, data, answers, problems))
    assert problems == []
    assert sum(isinstance(a, list) and len(a) > 0 for a in answers.values()) >= 8


def test_rows_of_one_time_in_a_secondary_order_answer_as_flink():
    rng = random.Random(22)  # as `differential.py --family ties --cases 30 --rows 200 --seed 22`
    data = differential.tied_rows(200, rng)
    statements = {f"case{i}": differential.ordered_statement(rng) for i in range(30)}
    answers = differential.run_flink(statements, data, watermark_delay_ms=1)
    problems = differential.compare(statements, data, answers)
    print("ties:", differential.summary(statements, data, answers, problems))
    assert problems == []
    assert sum(isinstance(a, list) and len(a) > 0 for a in answers.values()) >= 8
