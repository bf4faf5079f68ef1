""""Checked" means "will run": every refusal of the compilers is part of the one check,
the same message wherever a query comes in (`cep check` / `cep_core.compile`, the control
plane's `check_query` that `cep query add`, the API's validate and add and the splitter
run), and a refused change never reaches a worker.

`test_every_compiler_refusal_is_accounted_for` reads the compilers' source: each `raise`
there is either reached by a query in REACHED (refused by the check with that message) or
refused earlier by the language checker (CHECKER, with a query showing it) or an internal
invariant no checked query reaches (INTERNAL, with the reason). A new `raise` fails the test
until it is placed in one of them."""

from __future__ import annotations

import ast as pyast
from pathlib import Path

import pytest

from cep_core import admission, query_limits
from cep_core.checker import load_query_text
from cep_core.control_message import ControlMessage, ControlMessageError, check_query
from cep_core.errors import QueryError, QueryErrors
from cep_service.stream.memory_pipeline import MemoryPipeline

ROOT = Path(__file__).resolve().parent.parent
COMPILERS = sorted((ROOT / "cep_core" / "compiler").glob("*.py")) + [
    ROOT / "cep_core" / "engine_factory.py"]


def alternatives(n: int) -> str:
    return ("QUERY poison FROM trades PARTITION BY symbol\nPATTERN ( (" +
            " | ".join(["up"] * n) + ") )\nDEFINE up AS price > 0\nEMIT symbol = symbol;")


# (file, start of the raised message) -> a query the one check refuses with that message.
REACHED = {
    ("match.py", "f\"the pattern has"): (alternatives(64), "the pattern has 64 positions"),
}
# Refused by the language checker before any compiler runs: (query, checker's message).
CHECKER = {
    ("seq_plan.py", "f\"{neg.step.pos}: a leading or trailing NOT"): (
        "QUERY q FROM rfid PATTERN SEQ(O o, D d, NOT(C c)) WHERE o.item = d.item;",
        "a pattern that ends with NOT needs WITHIN"),
    ("seq_plan.py", "\"a WHERE condition may mention one negated"): (
        "QUERY q FROM rfid PATTERN SEQ(O o, NOT(C c), NOT(C e), D d) WHERE c.item = e.item "
        "WITHIN 1 hour;", "a condition may mention at most one negated variable"),
    ("seq_plan.py", "f\"{step.pos}: WITHIN ... FROM"): (
        "QUERY q FROM sensors DETECT Smoke s, LAST Temp t WITHIN 5 minutes FROM t "
        "WHERE t.area = s.area;", "which is not a later step"),
    ("seq_aip.py", "\"EACH/LAST/FIRST with a run strategy\""): (
        "QUERY q FROM sensors DETECT Smoke s, LAST Temp t WITHIN 5 minutes FROM s "
        "WHERE t.area = s.area USING skip-till-next-match;",
        "cannot be combined with USING skip-till-next-match"),
    ("seq_aip.py", "\"LAST/FIRST under ORDER BY ts"): (
        "QUERY q FROM sensors DETECT Smoke s, LAST Temp t WITHIN 5 minutes FROM s "
        "WHERE t.area = s.area ORDER BY ts USING skip-till-next-match;",
        "cannot be combined with USING skip-till-next-match"),
    ("seq_codegen_matches.py", "\"a step filter with an aggregate\""): (
        "QUERY q FROM rfid PATTERN SEQ(O o, KLEENE(O dup), R r(count(dup) > 1), D d) "
        "WITHIN 1 hour;", "aggregates are not allowed in a step filter"),
    ("match.py", "\"window aggregates do not exist in MATCH\""): (
        "QUERY q FROM trades PARTITION BY symbol PATTERN (a) DEFINE a AS price > "
        "avg(Trade.price WITHIN 5 minutes FROM a) EMIT x = price;",
        "is not allowed in a MATCH predicate"),
    ("match.py", "\"Collect() may only be a whole EMIT item\""): (
        "QUERY q FROM trades PARTITION BY symbol PATTERN (a b+) DEFINE a AS price > 0, "
        "b AS price > 0 EMIT x = Count(Collect(price));", "count takes no argument"),
    ("window.py", "\"aggregates cannot appear in a WINDOW WHERE\""): (
        "QUERY q INTO x SELECT count(*) AS n FROM trades [RANGE 1 minute SLIDE 1 minute] "
        "WHERE max(price) > 3;", "aggregate"),
}
# Raised only on a broken invariant (a caller's mistake), never by a checked query.
# MATCH_RECOGNIZE constructs the jitted kernels do not evaluate: not refusals of the query.
JIT_FALLBACK = ("not a refusal of the query: RecognizeUnsupported makes engine_factory."
                "recognize_program run it on the interpreter engine "
                "(tests/test_recognize_jit.py)")
# Deliberately like each other, INTERNAL's entries: a table, one raise site and its reason each
INTERNAL = {
    ("recognize_codegen.py", "f\"PREV with an offset other than"): JIT_FALLBACK,
    ("recognize_automaton.py", "\"a pattern without a final state\""): "compile_nfa always builds "
    "one",
    ("recognize_codegen.py", "f\"{func.value.upper()}(...)\""): "the checker admits FIRST, LAST, "
    "COUNT, SUM, AVG, MIN and MAX only",
    ("recognize_codegen.py", "f\"function {node.name}()\""): JIT_FALLBACK,
    ("recognize.py", "f\"query {checked.name} is not a MATCH_RECOGNIZE query"): "as for "
    "match.py",
    ("recognize_codegen.py", "f\"an offset over {MAX_OFFSET}"): JIT_FALLBACK,
    ("recognize_codegen.py", "\"an aggregate inside PREV\""): JIT_FALLBACK,
    ("recognize_codegen.py", "\"PREV inside PREV\""): JIT_FALLBACK,
    ("recognize_codegen.py", "f\"{func.value.upper()} of a {kind}\""): JIT_FALLBACK,
    ("recognize_automaton.py", "\"a state with two PROCEED edges\""): "compile_nfa gives a state "
    "one PROCEED edge at most",
    ("recognize_codegen.py", "\"a window aggregate\""): "the grammar has no window aggregate in "
    "MATCH_RECOGNIZE",
    ("recognize.py", "f\"more than {MAX_VARIABLES} pattern"): JIT_FALLBACK,
    ("expressions.py", "f\"unknown operator"): "the checker admits only the operators the "
    "compiler knows (tests/test_checker_ok.py covers each)",
    ("expressions.py", "f\"function {node.name} has no compiled form"): "every function of "
    "cep_core/functions.py has a compiled form; the checker refuses unknown names",
    ("match.py", "f\"query {checked.name} is not a MATCH query"): "compile_program "
    "dispatches on the query's kind",
    ("window.py", "f\"query {checked.name} is not a WINDOW query"): "as above",
    ("window.py", "f\"{type(node).__name__} cannot appear in a WINDOW WHERE"): "the checker "
    "types a WINDOW WHERE over the stream's attributes only",
    ("window.py", "\"window aggregates cannot appear in a WINDOW WHERE\""): "the grammar "
    "has no window aggregate in a WINDOW query",
    ("window.py", "f\"{func.value} is not a WINDOW aggregate"): "the checker admits "
    "count/sum/avg/min/max only",
    ("seq_plan.py", "\"a SEQ pattern needs a positive step\""): "the checker refuses a "
    "pattern of negations only",
    ("seq_cdp.py", "f\"CDP evaluates skip-till-any-match queries"): "compile_program sends "
    "runs to the AIP compiler",
    ("seq_codegen_leaves.py", "f\"bare attribute '{node.name}' outside"): "the checker "
    "binds every attribute of a SEQ condition to a variable",
    ("seq_programs.py", "f\"USING {plan.strategy.value} (runs)"): "compile_program sends "
    "runs to the AIP compiler",
    ("engine_factory.py", "f\"query {checked.name!r}: {why} is evaluated"): "re-raises "
    "CdpUnsupported (placed above)",
    ("engine_factory.py", "f\"query {checked.name!r}: the AIP SEQ kernel"): "re-raises "
    "AipUnsupported (placed above)",
    ("engine_factory.py", "\"algorithm 'aip'\""): "an engine option, not query text",
}


def raise_sites() -> set[tuple[str, str]]:
    """(file, the raised message's source text, first 40 characters) of every `raise X(...)`
    with a message in the compilers."""
    sites = set()
    for path in COMPILERS:
        source = path.read_text()
        for node in pyast.walk(pyast.parse(source)):
            if isinstance(node, pyast.Raise) and isinstance(node.exc, pyast.Call) and \
                    node.exc.args:
                text = pyast.get_source_segment(source, node.exc.args[0])
                sites.add((path.name, text))
    return sites


def placed(site: tuple[str, str]) -> bool:
    file, text = site
    return any(file == f and text.startswith(start)
               for f, start in [*REACHED, *CHECKER, *INTERNAL])


def test_every_compiler_refusal_is_accounted_for():
    missing = [site for site in raise_sites() if not placed(site)]
    assert not missing, f"raise sites in no table: {missing}"
    known = raise_sites()
    stale = [key for key in [*REACHED, *CHECKER, *INTERNAL]
             if not any(f == key[0] and text.startswith(key[1]) for f, text in known)]
    assert not stale, f"table entries with no raise site: {stale}"


def refusal_at_check(text: str) -> str:
    with pytest.raises((QueryError, QueryErrors)) as e:
        load_query_text(text, path="<query q>")
    return str(e.value)


def refusal_at_control(name: str, text: str) -> str:
    with pytest.raises(ControlMessageError) as e:
        check_query(name, text)
    return str(e.value)


@pytest.mark.parametrize("key", list(REACHED) + list(CHECKER))
def test_refused_alike_at_every_door(key):
    text, message = (REACHED | CHECKER)[key]
    name = text.split()[1]
    at_check = refusal_at_check(text)
    at_control = refusal_at_control(name, text)
    assert message in at_check
    assert at_check.replace("<query q>", f"<query {name}>") == at_control


def test_window_bounds_known_from_the_text():
    panes = ("QUERY wide INTO x SELECT symbol, count(*) AS n FROM trades "
             "[RANGE 366 days SLIDE 1 millisecond] GROUP BY symbol;")
    assert "31,622,400,000 panes" in refusal_at_check(panes)
    assert "CEP_MAX_WINDOW_PANES" in refusal_at_check(panes)
    ok = panes.replace("1 millisecond", "1 day")
    assert load_query_text(ok)
    tight = query_limits.QueryLimits(state_bytes=1000)
    checked = load_query_text(ok)[0]
    errors = admission.admit(checked, ok, tight)
    assert errors and "one group of this window holds" in errors[0].message


def test_text_size_is_limited_before_parsing(monkeypatch):
    monkeypatch.setenv("CEP_MAX_QUERY_TEXT_BYTES", "100")
    query_limits.limits.cache_clear()
    try:
        message = refusal_at_check("-- " + "x" * 200 + "\n" + alternatives(2))
    finally:
        query_limits.limits.cache_clear()
    assert "over the limit of 100" in message and ":1:1:" in message


def test_limits_from_the_environment_are_checked():
    assert query_limits.QueryLimits.from_env({"CEP_MAX_WINDOW_PANES": "7"}).panes == 7
    with pytest.raises(ValueError, match="whole number"):
        query_limits.QueryLimits.from_env({"CEP_MAX_WINDOW_PANES": "lots"})
    with pytest.raises(ValueError, match="at least 1"):
        query_limits.QueryLimits.from_env({"CEP_MAX_QUERY_STATE_BYTES": "0"})


def test_poison_query_never_reaches_a_worker():
    """The splitter refuses it (the same message), the workers never see it, and the live
    query beside it keeps producing."""
    pipeline = MemoryPipeline("trades", 2)
    good = ("QUERY rises FROM trades PARTITION BY symbol PATTERN (a b) "
            "DEFINE a AS price > 0, b AS price > Last(price) EMIT symbol = symbol;")
    pipeline.control(ControlMessage("add", "rises", good))
    lines = [line for line in (ROOT / "examples" / "data" / "trades.jsonl").read_bytes()
             .splitlines() if line.strip()]
    pipeline.send(lines[:300])
    pipeline.control(ControlMessage("add", "poison", alternatives(64)))
    pipeline.send(lines[300:])
    pipeline.end()
    status = pipeline.records_of(pipeline.topics.status)
    said = [r for r in status if r.get("event") == "change" and r["key"] == "query/poison"]
    assert [r["outcome"] for r in said] == ["refused"]
    assert said[0]["reason"] == refusal_at_control("poison", alternatives(64))
    assert all("poison" not in p.queries.live for p in pipeline.parts)
    assert pipeline.outputs.get("rises")
