"""Benchmarks write their tables into docs/benchmarks.md between markers (bench/doc_record.py):
only the marked text changes, a page without the markers is refused untouched, and every
section a benchmark records exists on the real page."""

import re
from pathlib import Path

import pytest

from cep_service.bench.doc_record import (BENCHMARKS_PAGE, RecordError, markdown_table, provenance,
                                          record)

ROOT = Path(__file__).resolve().parent.parent


def test_record_replaces_only_the_marked_text(tmp_path):
    page = tmp_path / "b.md"
    page.write_text("# B\n\nbefore\n<!-- bench:k begin -->\nold\n<!-- bench:k end -->\nafter\n")
    record("k", markdown_table(["a", "b"], [["1", "x|y"]]), page)
    record("k", markdown_table(["a", "b"], [["2", "z"]]), page)  # again: replaces, no growth
    assert page.read_text() == ("# B\n\nbefore\n<!-- bench:k begin -->\n| a | b |\n| --- | --- |"
                                "\n| 2 | z |\n<!-- bench:k end -->\nafter\n")


@pytest.mark.parametrize("text", [
    "no markers\n",
    "<!-- bench:k end -->\n<!-- bench:k begin -->\n",  # in the wrong order
    "<!-- bench:k begin -->\n<!-- bench:k end -->\n<!-- bench:k begin -->\n",  # twice
])
def test_a_page_without_one_well_formed_section_is_refused_untouched(tmp_path, text):
    page = tmp_path / "b.md"
    page.write_text(text)
    with pytest.raises(RecordError):
        record("k", "new", page)
    assert page.read_text() == text


def test_table_cells_escape_pipes_and_provenance_names_the_command():
    assert markdown_table(["h"], [["a|b"]]).splitlines()[-1] == "| a\\|b |"
    line = provenance("python bench/bench_core.py --record")
    assert re.match(r"Recorded \d{4}-\d\d-\d\d \d\d:\d\d UTC at commit \S+ on \d+ cores, "
                    r"load average [\d.]+, [\d.]+, [\d.]+ ", line)
    assert line.endswith("by `python bench/bench_core.py --record`:")


def test_every_recorded_section_is_on_the_page():
    sections = set(re.findall(r'record\("([a-z0-9_-]+)"',
                              "".join(p.read_text() for p in (ROOT / "bench").rglob("*.py"))))
    assert {"kernels", "e2e"} <= sections
    page = BENCHMARKS_PAGE.read_text()
    for section in sections:
        assert page.count(f"<!-- bench:{section} begin -->") == 1, section
        assert page.count(f"<!-- bench:{section} end -->") == 1, section
