"""Query diff (cep_core/query_diff.py, `cep query diff`): two versions of a query over the
same recorded events. What only the old version gives, only the new one and both, each in
`cep run`'s order, are exactly the versions' own composite events (as the reference
interpreter gives them) split as multisets; MATCH, SEQ and WINDOW queries; a renamed
version; the CLI with --old (exit 0 same, 1 different, 2 trouble), without a broker (a
clear error), and with the live version read from the control topic of a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from cep_core.api import compile as compile_queries
from cep_core.composite import sort_key
from cep_core.query_diff import QueryDiffError, diff_query

ROOT = Path(__file__).resolve().parent.parent
TRADES = ROOT / "examples" / "data" / "trades.jsonl"
UPS = """QUERY ups FROM trades PARTITION BY symbol
PATTERN ( . {n} ) DEFINE up AS price > Last(price)
EMIT symbol = symbol, n = Count();"""
STATS = """QUERY stats SELECT symbol, count(*) AS trades, max(price) AS hi
FROM trades [RANGE {range} seconds SLIDE 10 seconds] GROUP BY symbol;"""
ABC_EVENTS = [{"type": t, "p": p, "v": v, "ts": ts} for ts, (t, p, v) in enumerate(
    [("A", 1, 3), ("B", 1, 1), ("A", 2, 1), ("C", 1, 3), ("B", 2, 5), ("B", 1, 2),
     ("A", 1, 2), ("C", 2, 1), ("B", 1, 9), ("B", 2, 0), ("A", 2, 7), ("B", 2, 7)])]
SEQ = """QUERY ab FROM abc PARTITION BY p PATTERN SEQ(A a, B b) WHERE b.v {op} a.v
WITHIN {within};"""


def ups(n: int, name: str = "ups") -> str:
    return UPS.replace("{n}", " ".join(["up"] * n)).replace("QUERY ups", f"QUERY {name}")


def reference_of(text: str, events) -> list[dict]:
    """The composite events of `cep run --engine reference` over the events."""
    return compile_queries(text).run(events, engine="reference").to_dicts()


def multiset(rows: list[dict]) -> Counter:
    return Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)


def assert_split(diff, old: list[dict], new: list[dict]) -> None:
    """The diff's three lists are the versions' composite events split as multisets, each
    in output order."""
    assert multiset(diff.only_old) + multiset(diff.same) == multiset(old)
    assert multiset(diff.only_new) + multiset(diff.same) == multiset(new)
    assert not multiset(diff.only_old) & multiset(diff.only_new)
    for rows, of in ((diff.only_old, old), (diff.only_new, new), (diff.same, new)):
        assert subsequence(rows, of)


def subsequence(rows: list[dict], of: list[dict]) -> bool:
    """Whether `rows` come in `of` in this order (output order kept)."""
    rest = iter(of)
    return all(any(row == other for other in rest) for row in rows)


@pytest.mark.parametrize("old,new,events", [
    (ups(2), ups(3), TRADES),  # MATCH
    (STATS.format(range=60), STATS.format(range=30), TRADES),  # WINDOW
    (SEQ.format(op=">", within=8), SEQ.format(op=">=", within=3), ABC_EVENTS),  # SEQ
], ids=["match", "window", "seq"])
def test_the_split_is_the_versions_own_composite_events(old, new, events):
    diff = diff_query(old, new, events)
    expected_old, expected_new = reference_of(old, events), reference_of(new, events)
    assert_split(diff, expected_old, expected_new)
    assert diff.only_old and diff.only_new and not diff.identical
    assert diff.events == (1200 if events == TRADES else len(events))
    assert diff.summary() == (f"query {diff.name}: {len(diff.only_old)} only in old, "
                              f"{len(diff.only_new)} only in new, {len(diff.same)} same "
                              f"({diff.events} events)")
    lines = diff.lines()
    assert len(lines) == len(diff.only_old) + len(diff.only_new)
    assert [orjson.loads(line[1:]) for line in lines if line[0] == "-"] == diff.only_old
    assert [orjson.loads(line[1:]) for line in lines if line[0] == "+"] == diff.only_new
    keys = [sort_key(orjson.loads(line[1:]), 0) for line in lines]
    assert keys == sorted(keys)


def test_the_same_query_is_identical_and_a_renamed_one_is_compared_under_the_new_name():
    same = diff_query(ups(2), ups(2), TRADES, engine="reference")
    assert same.identical and same.same and (same.only_old, same.only_new) == ([], [])
    renamed = diff_query(ups(2, "ups_v1"), ups(2, "ups_v2"), TRADES)
    assert renamed.identical
    assert renamed.same == [{**c, "query": "ups_v2"} for c in same.same]
    assert renamed.summary().startswith("query ups_v2 (old name ups_v1): 0 only in old")


def test_which_query_of_a_file_is_compared():
    both = ups(2) + "\n" + ups(3, "longer")
    with pytest.raises(QueryDiffError, match="2 queries \\(ups, longer\\); name the one"):
        diff_query(ups(2), both, TRADES)
    picked = diff_query(both, ups(4, "longer"), TRADES)  # the old file's query of that name
    assert picked.old_name == "longer" and picked.only_old and picked.only_new
    with pytest.raises(QueryDiffError, match="no query 'nope'"):
        diff_query(ups(2), both, TRADES, name="nope")
    with pytest.raises(QueryDiffError, match="reads stream 'trades', the new one 'abc'"):
        diff_query(ups(2), SEQ.format(op=">", within=4), TRADES)


def test_a_table_of_events_and_bad_records():
    import pyarrow as pa

    table = pa.Table.from_pylist(ABC_EVENTS)
    diff = diff_query(SEQ.format(op=">", within=4), SEQ.format(op=">", within=2), table)
    assert_split(diff, reference_of(SEQ.format(op=">", within=4), ABC_EVENTS),
                 reference_of(SEQ.format(op=">", within=2), ABC_EVENTS))
    bad = diff_query(ups(2), ups(2), [{"symbol": "A", "price": "x", "volume": 1, "ts": 1}])
    assert bad.identical and len(bad.dead_letters) == 1 and bad.events == 0


# ------------------------------------------------------------------------- the CLI


def cep(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cep_service.cli.main", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_cli_with_old_exits_1_with_the_differences_and_0_when_the_same(tmp_path):
    old, new = write(tmp_path / "old.cep", ups(2)), write(tmp_path / "new.cep", ups(3))
    differ = cep("query", "diff", new, "--events", str(TRADES), "--old", old)
    assert differ.returncode == 1, differ.stderr
    expected = diff_query(ups(2), ups(3), TRADES)
    lines = differ.stdout.splitlines()
    assert lines[0] == expected.summary() == (
        f"query ups: {len(expected.only_old)} only in old, {len(expected.only_new)} only in "
        f"new, {len(expected.same)} same (1200 events)")
    assert lines[1:] == expected.lines()
    assert {line[0] for line in lines[1:]} == {"-", "+"}

    same = cep("query", "diff", old, "-e", str(TRADES), "--old", old)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines() == [
        f"query ups: 0 only in old, 0 only in new, {len(expected.same) + len(expected.only_old)}"
        " same (1200 events)"]


def test_cli_errors_exit_2(tmp_path):
    old = write(tmp_path / "old.cep", ups(2))
    bad = write(tmp_path / "bad.cep", "QUERY ups FROM trades\nPATTERN ( a )\n"
                "DEFINE a AS symbol > 3\nEMIT symbol = symbol;")
    for args, said in [
        (("query", "diff", old, "--old", old), "needs --events FILE"),
        (("query", "diff", "--events", str(TRADES), "--old", old), "needs the new version's"),
        (("query", "diff", str(tmp_path / "no.cep"), "-e", str(TRADES), "--old", old),
         "no.cep: no such file"),
        (("query", "diff", bad, "-e", str(TRADES), "--old", old), "bad.cep:3:"),
        (("query", "diff", old, "-e", str(tmp_path / "none.jsonl"), "--old", old),
         "none.jsonl: no such file"),
        (("stream", "diff", old), "only queries are compared"),
    ]:
        result = cep(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert said in result.stderr, (args, result.stderr)


def test_cli_without_old_and_no_broker_says_so(tmp_path, monkeypatch):
    from cep_service.cli.main import app
    from cep_service.errors import BrokerUnreachable
    from cep_service.stream import control

    def unreachable(settings, topic):
        raise BrokerUnreachable(f"broker {settings.bootstrap}: Local: Broker transport failure")

    monkeypatch.setattr(control, "control_log", unreachable)
    new = write(tmp_path / "new.cep", ups(3))
    result = CliRunner().invoke(app, ["query", "diff", new, "--events", str(TRADES),
                                      "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "cannot read the live version of the query from cep.queries (broker 127.0.0.1:1" \
        in result.output
    assert "give the old version with --old FILE" in result.output


def test_cli_reads_the_live_version_from_the_control_topic(kafka_bootstrap, tmp_path):
    run = uuid.uuid4().hex[:8]
    env = {"KAFKA_BOOTSTRAP": kafka_bootstrap, "CEP_TOPIC_PREFIX": f"d{run}"}
    live = write(tmp_path / "live.cep", ups(2))
    added = cep("query", "add", live, "--no-wait", env=env)  # no pipeline: it waits there
    assert added.returncode == 0, added.stdout + added.stderr

    new = write(tmp_path / "new.cep", ups(3))
    differ = cep("query", "diff", new, "--events", str(TRADES), env=env)
    assert differ.returncode == 1, differ.stdout + differ.stderr
    assert differ.stdout.splitlines() == [(expected := diff_query(ups(2), ups(3), TRADES))
                                          .summary(), *expected.lines()]
    same = cep("query", "diff", live, "--events", str(TRADES), env=env)
    assert same.returncode == 0, same.stdout + same.stderr

    other = write(tmp_path / "other.cep", ups(3, "downs"))
    missing = cep("query", "diff", other, "--events", str(TRADES), env=env)
    assert missing.returncode == 2
    assert f"no query 'downs' is live on d{run}.cep.queries (live: ups)" in missing.stderr
