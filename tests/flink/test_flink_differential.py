"""MATCH_RECOGNIZE against Apache Flink itself (slow: Flink starts a JVM and runs every
statement; about 5 s per statement on 2 cores): `make test-full` only, with `.venv-flink`."""

import os
import random

import pytest

from tests.flink import differential

pytestmark = pytest.mark.skipif(
    os.environ.get("CEP_TEST_FULL") != "1" or not differential.FLINK_PYTHON.exists(),
    reason="CEP_TEST_FULL=1 and .venv-flink (make venv-flink) run it")


def test_generated_statements_answer_as_flink():
    rng = random.Random(7)
    data = differential.rows(120, rng)
    statements = {f"case{i}": differential.statement(rng) for i in range(30)}
    answers = differential.run_flink(statements, data)
    problems = differential.compare(statements, data, answers)
    # Known, explained differences (docs/semantics.md) are counted, not hidden.
    assert len(problems) <= len(statements) // 2, "\n".join(problems)
