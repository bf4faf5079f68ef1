"""bench/peers without the peers: OpenCEP patterns translated into checked queries that find
the matches OpenCEP's semantics give on tiny inputs, enlarged NASDAQ files, and the
match-set comparison. (The peers themselves run only in `cep bench peers`.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cep_core.ast import QueryKind
from cep_core.checker import load_query_text
from cep_core.event_io import read_events
from cep_service.cli.common import Engine, run_queries

PEERS = Path(__file__).resolve().parent.parent / "bench" / "peers"
sys.path.insert(0, str(PEERS))

import compare  # noqa: E402
import flink  # noqa: E402
import nasdaq  # noqa: E402
import patterns  # noqa: E402
from flink_runner import query_variables  # noqa: E402


def matches_of(pattern: patterns.PeerPattern, bars: list[str], tmp_path: Path) -> Counter:
    """The product's matches (reference interpreter) of a pattern over Metastock lines."""
    source = tmp_path / "bars.txt"
    source.write_text("\n".join(bars) + "\n")
    _, jsonl, _ = nasdaq.write_enlarged(source, 1, tmp_path)
    queries = load_query_text(patterns.cep_query(pattern))
    events, dead = read_events(jsonl, queries[0].schema)
    assert dead == []
    composites, rejected = run_queries(queries, events, Engine.REFERENCE)
    assert rejected == []
    return Counter(compare.composite_match(c) for c in composites)


@pytest.mark.parametrize("pattern", patterns.PATTERNS, ids=lambda p: p.name)
def test_every_pattern_is_a_checked_query(pattern):
    (query,) = load_query_text(patterns.cep_query(pattern))
    assert query.name == pattern.name


def test_translation_reads_like_the_opencep_test():
    text = patterns.cep_query(patterns.BY_NAME["googleIncrease"])
    assert "PATTERN SEQ(GOOG a, GOOG b)" in text
    assert "WHERE b.peak >= a.peak * 1.01" in text and "WITHIN 30 minutes" in text
    assert "ORDER BY ts" in text
    text = patterns.cep_query(patterns.BY_NAME["MultipleNotMiddle"])
    assert "SEQ(AAPL a, NOT(LI d), AMZN b, NOT(FB e), GOOG c)" in text
    assert "AND(AMZN a, GOOG g)" in patterns.cep_query(patterns.BY_NAME["googleAmazonLow"])


def test_bars_of_one_minute_are_simultaneous(tmp_path):
    # OpenCEP's SEQ accepts equal timestamps in either order (misc.Utils.is_sorted); so
    # does ORDER BY ts: b (line 0) and a (line 1) share 09:00, c follows within 3 minutes
    bars = ["GOOG,200802010900,1,10,1,1,1", "GOOG,200802010900,1,5,1,1,1",
            "GOOG,200802010902,1,20,1,1,1", "GOOG,200802010903,1,30,1,1,1",
            "GOOG,200802010904,1,40,1,1,1"]
    found = matches_of(patterns.BY_NAME["googleAscend"], bars, tmp_path)
    # peaks 10, 5, 20, 30, 40: a < b < c with max - min ts <= 3 minutes; (a, b) = (1, 0)
    # in {0, 1, 2} and {0, 1, 3}; 09:04 is 4 minutes after 09:00, 3 after 09:01 (none)
    assert found == Counter({(0, 1, 2): 1, (0, 1, 3): 1, (0, 2, 3): 1, (1, 2, 3): 1,
                             (2, 3, 4): 1})


def test_negation_in_the_middle_cancels(tmp_path):
    pattern = patterns.PeerPattern("notmid", "-", "SEQ", ("AAPL a", "NOT AMZN b", "GOOG c"),
                                   ("a.open > b.open", "b.open < c.open"), 5)
    bars = ["AAPL,200802010900,10,1,1,1,1", "AMZN,200802010901,5,1,1,1,1",
            "GOOG,200802010902,8,1,1,1,1", "AMZN,200802010903,9,1,1,1,1",
            "GOOG,200802010904,12,1,1,1,1"]
    # AMZN 5 lies between AAPL 10 and both GOOGs (10 > 5 < 8, 10 > 5 < 12): both cancelled
    assert matches_of(pattern, bars, tmp_path) == Counter()
    bars[1] = "AMZN,200802010901,50,1,1,1,1"  # now only AMZN 9 cancels, and only GOOG 12
    assert matches_of(pattern, bars, tmp_path) == Counter({(0, 2): 1})


def test_kleene_takes_every_subset(tmp_path):
    bars = ["AMZN,200802010900,1,1,1,1,1", "GOOG,200802010901,1,1,1,1,1",
            "GOOG,200802010902,1,1,1,1,1", "AAPL,200802010903,1,1,1,1,1"]
    found = matches_of(patterns.BY_NAME["KleeneClosureSeq"], bars, tmp_path)
    assert found == Counter({(0, 1, 3): 1, (0, 2, 3): 1, (0, 1, 2, 3): 1})


def test_enlarged_copies_are_shifted_apart(tmp_path):
    source = tmp_path / "NASDAQ_T.txt"
    source.write_text("AAPL,200802012359,1.5,2,1,1.25,7\nGOOG,200802020001,3,4,2,3,8\n")
    text, jsonl, n = nasdaq.write_enlarged(source, 3, tmp_path / "out")
    assert n == 6
    lines = text.read_text().splitlines()
    assert lines[0] == "AAPL,200802012359,1.5,2,1,1.25,7"
    assert lines[2] == "AAPL,200802032359,1.5,2,1,1.25,7"  # shifted by two days
    assert lines[5].startswith("GOOG,200802060001,")
    first = json.loads(jsonl.read_text().splitlines()[0])
    assert first == {"ticker": "AAPL", "ts": 1201910340000, "open": 1.5, "peak": 2.0,
                     "low": 1.0, "close": 1.25, "volume": 7}


def test_compare_reports_both_sides():
    ours = compare.to_counter([[3, 1], [5, 6], [5, 6]])
    theirs = compare.to_counter([[1, 3], [5, 6], [7, 8]])
    result = compare.compare(ours, theirs)
    assert not result["equal"]
    assert (result["ours"], result["theirs"]) == (3, 3)
    assert (result["only_ours"], result["only_theirs"]) == (1, 1)
    assert result["examples_only_ours"] == [[5, 6]]
    assert result["examples_only_theirs"] == [[7, 8]]
    assert compare.compare(ours, ours)["equal"]


def test_composite_with_a_kleene_variable():
    composite = {"events": {"a": {"seq": 4}, "b": [{"seq": 7}, {"seq": 5}], "c": {"seq": 9}}}
    assert compare.composite_match(composite) == (4, 5, 7, 9)


def test_flink_side():
    assert query_variables("mshape") == ("S", "E")
    assert query_variables("bigrise") == ("B", "F")
    # cep's (864, 883) inside Flink's earlier-starting (855, 885): counted as explained
    only_ours, only_theirs = Counter({(864, 883): 1, (5, 9): 1}), Counter({(855, 885): 1})
    assert flink.nested_in_earlier(only_ours, only_theirs) == 1
    for text in flink.query_texts(0).values():
        load_query_text(text)
    for name in ("mshape", "bigrise"):  # Flink's statement, as cep runs it
        [query] = load_query_text(flink.same_statement(name))
        assert query.query.kind is QueryKind.RECOGNIZE


def cep_bench_peers(home: Path, *args: str) -> subprocess.CompletedProcess:
    """`cep bench peers` where neither OPENCEP_DIR nor PYFLINK_PYTHON is set."""
    cep = Path(sys.executable).with_name("cep")
    return subprocess.run([str(cep), "bench", "peers", *args], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "CEP_HOME": str(home)})


def test_cep_bench_peers_says_how_to_get_the_peers(tmp_path):
    done = cep_bench_peers(tmp_path)
    assert done.returncode == 2
    assert "git clone https://github.com/ilya-kolchinsky/OpenCEP" in done.stderr
    assert "pip install apache-flink" in done.stderr
    done = cep_bench_peers(tmp_path, "--opencep", str(tmp_path))
    assert done.returncode == 1
    assert "is not an OpenCEP checkout" in done.stderr
    done = cep_bench_peers(tmp_path, "--pyflink", str(tmp_path / "python"))
    assert done.returncode == 1 and "cannot import pyflink" in done.stderr
