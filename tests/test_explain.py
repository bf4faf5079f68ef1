"""`cep explain` (cep_core/explain.py): each kind's drawing says what the engines run.
The MATCH automaton drawn is the one the kernel runs (its language, checked against
Python's `re` over label strings); expressions are shown as the language writes them
(re-parsing the text gives the same tree); SEQ plans show their algorithm, items and
negations; WINDOW panes and state; the CLI writes text, dot, SVG and JSON."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cep_core import ast
from cep_core.checker import load_queries, load_query_text
from cep_core.explain import explain, unparse

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.cep"))


def shape(node):
    """A node as nested tuples, positions left out."""
    if isinstance(node, ast.Node):
        fields = []
        for name, value in vars(node).items():
            if name in ("pos", "parent") or name.startswith("_"):
                continue
            fields.append((name, shape(value)))
        return (type(node).__name__, tuple(fields))
    if isinstance(node, list):
        return tuple(shape(v) for v in node)
    return node


def expressions(checked):
    body = checked.query.body
    if isinstance(body, ast.MatchQuery):
        yield from (d.condition for d in body.defines)
        yield from (e.expr for e in body.emit)
    elif isinstance(body, ast.SeqQuery):
        if body.where is not None:
            yield body.where
        yield from (e.expr for e in body.emit)
    elif isinstance(body, ast.RecognizeQuery):  # shown in our words, not parsed back
        yield from (d.condition for d in body.defines)
        yield from (m.expr for m in body.measures)
    else:
        if body.where is not None:
            yield body.where


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_explains_and_draws(path):
    for checked in load_queries(path):
        found = explain(checked)
        text = found.text()
        assert text.startswith(f"query {checked.name} ({found.kind}): ")
        assert f"into: {checked.query.output}" in text
        assert found.nodes and found.edges
        assert all(e.source in found.nodes and e.target in found.nodes for e in found.edges)
        if shutil.which("dot"):
            assert found.svg().lstrip().startswith("<")
        assert orjson.loads(orjson.dumps(found.to_json()))["name"] == checked.name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_unparsed_expressions_parse_back_to_the_same_tree(path):
    for checked in load_queries(path):
        for expr in expressions(checked):
            text = unparse(expr)
            reparsed = _reparse(text, checked)
            if reparsed is not None:
                assert shape(reparsed) == shape(expr), text


def _reparse(text: str, checked):
    """The expression parsed back in the clause it came from (a WHERE of the same shape
    of query), or None where only the original query's context makes it valid."""
    from cep_core.parser import parse

    body = checked.query.body
    if isinstance(body, ast.WindowQuery):
        query = (f"QUERY x INTO y SELECT count(*) AS n FROM {checked.schema.stream} "
                 f"[RANGE 1 minute SLIDE 1 minute] WHERE {text};")
        return parse(query).queries[0].body.where
    return None


@pytest.mark.parametrize("text", [
    "a AND (b OR c)", "(a OR b) AND c", "NOT (a AND b)", "x - (y - z) > 0", "x - y - z > 0",
    "x * (y + z) >= 1", "s IN ('a', 'b') OR x = 2", "-x < 3"])
def test_unparse_keeps_precedence(text):
    from cep_core.parser import parse

    def where(t):
        return parse(f"QUERY q INTO o SELECT count(*) AS n FROM s [RANGE 1 minute SLIDE "
                     f"1 minute] WHERE {t};").queries[0].body.where
    original = where(text)
    assert shape(where(unparse(original))) == shape(original)


def automaton_language(found, words):
    """Which label words the drawn automaton accepts (from its nodes and edges)."""
    accepting = {k for k, (_, shape_) in found.nodes.items() if shape_ == "doublecircle"}
    out = set()
    for word in words:
        states = {"start"}
        for label in word:
            states = {e.target for e in found.edges if e.source in states and
                      e.label.split(":")[0] in (label, "any event")}
        if states & accepting:
            out.add(word)
    return out


@pytest.mark.parametrize("pattern,regex", [
    ("a b+", "ab+"), ("a (b | c)* a", "a[bc]*a"), ("a? b c*", "a?bc*"),
    (". a+ b? a", ".a+b?a"), ("(a b)+ c", "(ab)+c")])
def test_the_drawn_automaton_accepts_the_pattern(pattern, regex):
    used = sorted(set(re.findall(r"[abc]", pattern)))
    defines = ", ".join(f"{n} AS price > {i}" for i, n in enumerate(used))
    checked = load_query_text(f"QUERY q FROM trades PARTITION BY symbol PATTERN ( {pattern} ) "
                              f"DEFINE {defines} EMIT n = Count();")[0]
    found = explain(checked)
    words = ["".join(w) for n in range(6) for w in itertools.product("abc", repeat=n)]
    expected = {w for w in words if re.fullmatch(regex, w)}
    assert automaton_language(found, words) == expected


def test_seq_plan_shows_algorithm_items_and_negations():
    query = next(q for q in load_queries(ROOT / "examples" / "rfid.cep")
                 if q.name == "not_cancelled")
    text = explain(query).text()
    assert "algorithm: CDP" in text and "item 1: O o" in text and "item 2: D d" in text
    assert "negation: no C c between items 1 and 2 where o.item = c.item" in text
    runs = next(q for q in load_queries(ROOT / "examples" / "rfid.cep")
                if q.name == "duplicate_orders_next")
    assert "algorithm: AIP" in explain(runs).text()


def test_window_shows_panes_and_state_per_group():
    query = next(q for q in load_queries(ROOT / "examples" / "finance.cep")
                 if q.name == "activity")
    text = explain(query).text()
    assert "window: RANGE 300000 SLIDE 60000 ms: 5 panes" in text
    assert "where: symbol IN ('GOOG', 'AAPL', 'YHOO') AND (volume > 100 OR price < 1000)" \
        in text
    assert "state per group: 5 panes x " in text


def test_cli_formats(tmp_path):
    def cep(*args):
        return subprocess.run([sys.executable, "-m", "cep_service.cli.main", "explain", *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
    done = cep("examples/finance.cep", "--name", "mshape")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("query mshape (MATCH)")
    done = cep("examples/finance.cep", "-f", "json")
    assert [orjson.loads(line)["name"] for line in done.stdout.splitlines()] == \
        ["mshape", "activity"]
    done = cep("examples/finance.cep", "-f", "dot", "--name", "activity")
    assert done.stdout.startswith('digraph "activity"')
    if shutil.which("dot"):
        done = cep("examples/finance.cep", "-f", "svg", "-o", str(tmp_path / "f.svg"))
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "f.mshape.svg").read_text().lstrip().startswith("<")
        assert (tmp_path / "f.activity.svg").exists()
    done = cep("examples/finance.cep", "--name", "nothing")
    assert done.returncode == 1 and "no query named 'nothing'" in done.stderr
