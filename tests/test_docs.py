"""Every query shown in docs/queries.md parses and checks: the reference does not rot."""

import re
from pathlib import Path

import pytest

from cep_core.checker import load_query_text

DOC = Path(__file__).resolve().parent.parent / "docs" / "queries.md"
BLOCKS = [b for b in re.findall(r"```\n(.*?)```", DOC.read_text(), re.DOTALL) if "QUERY" in b]


def test_the_reference_shows_queries():
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_documented_query_checks(block):
    assert load_query_text(block, path="docs/queries.md")
