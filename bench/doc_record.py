"""Benchmarks write their own tables into docs/benchmarks.md (`--record`), so the page shows
what the last run measured, with its command, date, commit and machine load, instead of
figures copied by hand.

A recorded section sits between two markers, and only the text between them changes:

    <!-- bench:kernels begin -->
    ...written by `python bench/bench_core.py --record`...
    <!-- bench:kernels end -->
"""

from __future__ import annotations

import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


class RecordError(ValueError):
    """The page has no (or a damaged) section for this benchmark: nothing was written."""


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


def provenance(command: str) -> str:
    """One line: when, on which commit, how busy the machine was, and the command."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"Recorded {now} at commit {_commit()} on {os.cpu_count()} cores, load average "
            f"{load} (1, 5, 15 min), by `{command}`:")


def record(section: str, body: str, page: Path = BENCHMARKS_PAGE) -> None:
    """Replace the text between the section's markers on `page` by `body`."""
    if not SECTION_NAME.match(section):
        raise RecordError(f"bad section name {section!r}")
    begin, end = f"<!-- bench:{section} begin -->", f"<!-- bench:{section} end -->"
    text = page.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise RecordError(f"{page}: needs exactly one '{begin}' followed by one '{end}'")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    page.write_text(f"{head}{begin}\n{body.strip()}\n{end}{tail}")


def _commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, cwd=BENCHMARKS_PAGE.parent, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"
