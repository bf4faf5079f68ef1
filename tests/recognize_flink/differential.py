"""Differential check of MATCH_RECOGNIZE against Apache Flink itself: the same statements on
the same generated rows through Flink (tests/recognize_flink/flink_run.py under `.venv-flink`) and
through the reference interpreter, row for row.

    .venv/bin/python tests/recognize_flink/differential.py --cases 60 --seed 1 [--save FIXTURE]
        [--family base|navigation|ties|examples]

`--family examples` takes examples/recognize.cep's statements over examples/data/trades.jsonl
(what a user pastes and runs first). `make test-full` runs it
(tests/recognize_flink/test_flink_differential.py, CEP_TEST_FULL=1 with `.venv-flink`
present); `--save` writes the statements, rows and Flink's answers as a fixture
(tests/fixtures/recognize_flink_*.json) that the reference, jit and engine tests replay
without Flink.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cep_core.workloads import MSHAPE_RECOGNIZE_DEFINE

ROOT = Path(__file__).resolve().parents[2]
FLINK_PYTHON = ROOT / ".venv-flink" / "bin" / "python"
COLUMNS = {"symbol": "STRING", "price": "INT", "volume": "INT", "ts": "BIGINT",
           "seqNum": "INT"}

QUANTIFIERS = ["", "", "+", "*", "?", "{2}", "{1,3}", "{2,}", "+?", "*?", "{1,3}?", "{2,}?"]
LAST_QUANTIFIERS = ["", "{2}", "+?", "*?", "{1,3}?", "?", "{0,2}", "+"]
SKIPS = ["AFTER MATCH SKIP PAST LAST ROW", "AFTER MATCH SKIP TO NEXT ROW", "",
         "AFTER MATCH SKIP TO LAST {v}", "AFTER MATCH SKIP TO FIRST {v}"]


def rows(count: int, rng: random.Random) -> list[dict]:
    """A random walk of prices over two symbols, one row per second."""
    price = {"A": 50, "B": 50}
    out = []
    for i in range(count):
        symbol = rng.choice("AB")
        price[symbol] = max(1, price[symbol] + rng.randint(-4, 4))
        out.append({"symbol": symbol, "price": price[symbol], "volume": rng.randint(1, 9),
                    "ts": 1_000 * (i + 1), "seqNum": i})
    return out


def statement(rng: random.Random) -> str:
    n = rng.randint(2, 4)
    names = ["A", "B", "C", "D"][:n]
    quantified = [rng.choice(QUANTIFIERS) for _ in names[:-1]] + [rng.choice(LAST_QUANTIFIERS)]
    pattern = " ".join(v + q for v, q in zip(names, quantified))
    defines = []
    for i, v in enumerate(names):
        if i == 0 and rng.random() < 0.5:
            continue
        earlier = names[rng.randrange(i)] if i else v
        defines.append(f"{v} AS " + rng.choice([
            f"{v}.price < PREV(price)", f"{v}.price > PREV(price)",
            f"{v}.price >= PREV(price)", f"{v}.price < {earlier}.price",
            f"{v}.price > FIRST({earlier}.price)", f"{v}.volume > 4",
            f"{v}.price > AVG({v}.price) - 1", f"SUM({v}.volume) < 12",
            f"{v}.price <= LAST({earlier}.price) AND {v}.volume > 2",
            f"{v}.price > COALESCE(LAST({v}.price, 1), {earlier}.price)",
            f"{v}.price <= COALESCE(LAST({v}.price, 2), 0) + 2",
            f"NOT ({v}.price > PREV(price)) OR {v}.volume = 9",
            f"FIRST({v}.price, 1) IS NULL OR {v}.price > FIRST({v}.price, 1)"]))
    measures = ["FIRST(A.price) AS first_a", f"LAST({names[-1]}.price) AS last_price",
                "COUNT(*) AS n", f"AVG({names[1]}.price) AS avg_price",
                f"MAX({rng.choice(names)}.price) AS max_price", "SUM(volume) AS volume",
                "MATCH_ROWTIME() AS rowtime_ms"]
    skip = rng.choice(SKIPS).format(v=rng.choice(names[1:]))
    within = rng.choice(["", "", f"WITHIN INTERVAL '{rng.randint(3, 9)}' SECOND"])
    return (f"SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY rowtime "
            f"MEASURES {', '.join(measures)} ONE ROW PER MATCH {skip} PATTERN ({pattern}) "
            f"{within} DEFINE {', '.join(defines) or 'A AS A.price > 0'}) AS T")


# Navigation beyond the base family: PREV with an offset (beside LAST with an offset: Flink
# refuses one inside the other), FIRST/LAST with offsets in MEASURES,
# MATCH_ROWTIME()/MATCH_PROCTIME() in DEFINE, ALL in an aggregate, ONE ROW PER MATCH left out,
# MATCH_PROCTIME() as a measure SELECT leaves out (its value is the machine's clock)
NAV_DEFINES = [
    "{v}.price < PREV(price, 2)", "{v}.price > PREV(price, {k})",
    "{v}.volume >= PREV(volume, 0) AND {v}.price < PREV(price)",
    "PREV(price + volume, 2) IS NULL OR {v}.price > PREV(price, 1)",
    "{v}.price > COALESCE(PREV(price, 3), 0) AND MATCH_ROWTIME() = rowtime",
    "MATCH_PROCTIME() IS NOT NULL AND {v}.price < PREV(price)",
    "{v}.price >= LAST({e}.price, 1)", "{v}.price < FIRST({e}.price, 1) + 3",
    "SUM(ALL {v}.volume) < 15", "{v}.price <> PREV(price, 2) AND {v}.volume > 3",
    "{v}.price > COALESCE(LAST({v}.price, 1), PREV(price, 2), 0)", "COUNT({v}.price) <= 3",
    "COALESCE(LAST({e}.price, 1), 0) < PREV(price) + COALESCE(PREV(price, 2), 0) - {v}.price"]
NAV_MEASURES = ["FIRST({v}.price, 1) AS second_of", "LAST(price, 2) AS third_last",
                "LAST(A.price, 1) AS a_before", "FIRST(price, 3) AS fourth",
                "SUM(ALL volume) AS vol", "LAST({v}.volume, 1) AS vol_before",
                "COUNT({v}.price) AS rows_of", "COUNT(volume) AS counted"]


def navigation_statement(rng: random.Random) -> str:
    n = rng.randint(2, 4)
    names = ["A", "B", "C", "D"][:n]
    # the base family covers the refusals of quantifiers: here mostly what Flink answers
    quantified = [rng.choice(QUANTIFIERS[:2] + [q for q in QUANTIFIERS if "?" in q])
                  for _ in names[:-1]] + [rng.choice(LAST_QUANTIFIERS[:5])]
    pattern = " ".join(v + q for v, q in zip(names, quantified))
    defines = [f"{v} AS " + rng.choice(NAV_DEFINES).format(
        v=v, k=rng.randint(1, 4), e=names[rng.randrange(i)] if i else v)
        for i, v in enumerate(names) if i or rng.random() < 0.5]
    measures = ["COUNT(*) AS n", "LAST(seqNum) AS last_row"] + [
        m.format(v=rng.choice(names)) for m in rng.sample(NAV_MEASURES, 3)]
    select = "*"
    if rng.random() < 0.3:
        measures.append("MATCH_PROCTIME() AS proctime")
        select = ", ".join(["symbol"] + [m.rsplit(" AS ", 1)[1] for m in measures[:-1]])
    rows_per_match = rng.choice(["ONE ROW PER MATCH", ""])
    skip = rng.choice(SKIPS).format(v=rng.choice(names[1:]))
    within = rng.choice(["", "", f"WITHIN INTERVAL '{rng.randint(3, 9)}' SECOND"])
    return (f"SELECT {select} FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY "
            f"rowtime MEASURES {', '.join(measures)} {rows_per_match} {skip} "
            f"PATTERN ({pattern}) {within} DEFINE {', '.join(defines) or 'A AS A.price > 0'})"
            " AS T")


def tied_rows(count: int, rng: random.Random) -> list[dict]:
    """As `rows`, but about half the rows share their time with the row before."""
    out = rows(count, rng)
    ts = 1_000
    for row in out:
        ts += rng.choice([0, 0, 1_000])
        row["ts"] = ts
    return out


ORDERS = ["rowtime", "rowtime, price", "rowtime, price DESC", "rowtime ASC, volume, seqNum DESC",
          "rowtime, volume DESC, price"]


def ordered_statement(rng: random.Random) -> str:
    """A base statement without WITHIN, its rows of one time in the order of a secondary
    ORDER BY (or as they came, without one)."""
    text = re.sub(r"WITHIN INTERVAL '\d+' SECOND", "", statement(rng))
    return text.replace("ORDER BY rowtime", "ORDER BY " + rng.choice(ORDERS))


# The M-shape of bench/peers/flink_runner.py (Hirzel's double top), as Flink users write it.
MSHAPE = """SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY rowtime
  MEASURES FIRST(S.seqNum) AS first_seq, LAST(E.seqNum) AS last_seq, COUNT(*) AS n,
    MAX(price) AS max_price
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  """ + MSHAPE_RECOGNIZE_DEFINE + ") AS T"


EXAMPLE = ROOT / "examples" / "recognize.cep"
EXAMPLE_ROWS = ROOT / "examples" / "data" / "trades.jsonl"


def example_statements() -> dict[str, str]:
    """examples/recognize.cep's statements as Flink takes them (the table `quotes`, its time
    attribute `rowtime`), by query name."""
    found = re.findall(r"^QUERY (\w+) INTO \w+\n(SELECT .*?\) AS T);", EXAMPLE.read_text(),
                       re.MULTILINE | re.DOTALL)
    return {name: text.replace("FROM trades", "FROM quotes").replace("ORDER BY ts",
                                                                      "ORDER BY rowtime")
            for name, text in found}


def example_rows() -> list[dict]:
    return [json.loads(line) for line in EXAMPLE_ROWS.read_text().splitlines()]


def run_flink(statements: dict[str, str], data: list[dict], watermark_delay_ms: int = 0) -> dict:
    """Flink's answers; rows of one time need `watermark_delay_ms` (tied_rows: 1)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "cases.json"
        spec.write_text(json.dumps({"columns": COLUMNS, "time": "ts", "rows": data,
                                    "statements": statements,
                                    "watermark_delay_ms": watermark_delay_ms}))
        done = subprocess.run([str(FLINK_PYTHON), str(ROOT / "tests/recognize_flink/flink_run.py"),
                               str(spec)], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)


def our_text(statement_text: str) -> str:
    """A statement as we take it: Flink's time attribute `rowtime` is our stream's `ts`."""
    return re.sub(r"\browtime\b", "ts", statement_text)


def flink_columns(checked) -> list[str]:
    """The names of Flink's columns for a statement: its SELECT list, or for SELECT * the
    PARTITION BY attributes, then the measures."""
    body = checked.query.body
    if body.select is not None:
        return [a.name for a in body.select]
    return [a.name for a in checked.query.partition_by] + [m.name for m in body.measures]


def ours(statement_text: str, data: list[dict]):
    """Our rows (the composite events as Flink's SELECT * columns), or our refusal."""
    import cep_core.reference as reference
    from cep_core.checker import load_query_text
    from cep_core.errors import QueryError, QueryErrors
    from cep_core.events import Event

    try:
        [checked] = load_query_text(our_text(statement_text))
    except (QueryError, QueryErrors) as e:
        return {"error": str(e).splitlines()[0]}
    from cep_core.reference.recognize import RecognizeRuntimeError

    events = [Event(i, row["ts"], dict(row)) for i, row in enumerate(data)]
    names = flink_columns(checked)
    try:
        found = reference.run([checked], events)
    except RecognizeRuntimeError as e:
        return {"error": str(e)}
    return [[c[name] for name in names] for c in found]


def compare(statements: dict[str, str], data: list[dict], answers: dict) -> list[str]:
    """The cases where we differ from Flink, described."""
    problems = []
    for name, text in statements.items():
        flink, mine = answers[name], ours(text, data)
        if isinstance(flink, dict) or isinstance(mine, dict):
            if isinstance(flink, dict) != isinstance(mine, dict):
                problems.append(f"{name}: Flink {flink if isinstance(flink, dict) else 'answers'}"
                                f", we {mine if isinstance(mine, dict) else 'answer'}\n  {text}")
            continue
        if sorted(map(json.dumps, flink)) != sorted(map(json.dumps, mine)):
            problems.append(f"{name}: {len(flink)} rows from Flink, {len(mine)} from us; "
                            f"only Flink: {[r for r in flink if r not in mine][:3]}, only us: "
                            f"{[r for r in mine if r not in flink][:3]}\n  {text}")
    return problems


def summary(statements: dict[str, str], data: list[dict], answers: dict,
            problems: list[str]) -> str:
    refused = sum(isinstance(a, dict) for a in answers.values())
    matches = sum(len(a) for a in answers.values() if isinstance(a, list))
    return (f"{len(statements)} statements over {len(data)} rows, {refused} refused by Flink, "
            f"{matches} rows answered, {len(problems)} differ from Flink")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--family", choices=["base", "navigation", "ties", "examples"],
                        default="base",
                        help="base: the statements above and the M-shape; navigation: "
                             "navigation_statement; ties: ordered_statement over tied_rows; "
                             "examples: examples/recognize.cep over its sample trades")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.family == "examples":
        data, statements = example_rows(), example_statements()
    else:
        make = {"base": statement, "navigation": navigation_statement,
                "ties": ordered_statement}[args.family]
        data = (tied_rows if args.family == "ties" else rows)(args.rows, rng)
        statements = {f"case{i}": make(rng) for i in range(args.cases)}
    if args.family == "base":
        statements["mshape"] = MSHAPE
    delay = 1 if args.family == "ties" else 0
    answers = run_flink(statements, data, delay)
    problems = compare(statements, data, answers)
    print(summary(statements, data, answers, problems))
    for problem in problems:
        print(problem)
    if args.save:
        fixture = {"rows": data, "statements": statements, "flink": answers,
                   "made_by": "Apache Flink 2.3.0 (PyFlink, streaming, parallelism 1): "
                              ".venv/bin/python tests/recognize_flink/differential.py "
                              + " ".join(sys.argv[1:])}
        if delay:
            fixture["watermark_delay_ms"] = delay
        args.save.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
