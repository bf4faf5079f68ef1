"""MATCH_RECOGNIZE against Apache Flink itself (slow: Flink starts a JVM and runs every
statement, about 4 s each on 2 cores, some 4 minutes in all): `make test-full` only, with
`.venv-flink` (`make venv-flink`)."""

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
    assert differential.compare(statements, data, answers) == []
    # not vacuous: 10 of these statements find matches (794 rows), 30 are answered in all
    assert sum(isinstance(a, list) and len(a) > 0 for a in answers.values()) >= 8
