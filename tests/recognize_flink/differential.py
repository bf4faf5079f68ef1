"""Differential check of MATCH_RECOGNIZE against Apache Flink itself: the same statements on
the same generated rows through Flink (tests/recognize_flink/flink_run.py under `.venv-flink`) and
through the reference interpreter, row for row.

    .venv/bin/python tests/recognize_flink/differential.py --cases 60 --seed 1 [--save FIXTURE]

`make test-full` runs it (tests/recognize_flink/test_flink_differential.py, CEP_TEST_FULL=1 with
`.venv-flink` present); `--save` writes the statements, rows and Flink's answers as a
fixture that tests/test_recognize_flink_fixtures.py replays without Flink.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

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


# The M-shape of bench/peers/flink_runner.py (Hirzel's double top), as Flink users write it.
MSHAPE = """SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY rowtime
  MEASURES FIRST(S.seqNum) AS first_seq, LAST(E.seqNum) AS last_seq, COUNT(*) AS n,
    MAX(price) AS max_price
  ONE ROW PER MATCH AFTER MATCH SKIP PAST LAST ROW
  PATTERN (S R1+ D1+ R2+? D2* E)
  DEFINE
    R1 AS R1.price > S.price AND R1.price >= COALESCE(LAST(R1.price, 1), S.price),
    D1 AS D1.price >= S.price AND D1.price < COALESCE(LAST(D1.price, 1), LAST(R1.price)),
    R2 AS R2.price > S.price AND R2.price >= COALESCE(LAST(R2.price, 1), LAST(D1.price)),
    D2 AS D2.price >= S.price AND D2.price < COALESCE(LAST(D2.price, 1), LAST(R2.price)),
    E AS E.price < S.price AND E.price < COALESCE(LAST(D2.price), LAST(R2.price))) AS T"""


def run_flink(statements: dict[str, str], data: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "cases.json"
        spec.write_text(json.dumps({"columns": COLUMNS, "time": "ts", "rows": data,
                                    "statements": statements}))
        done = subprocess.run([str(FLINK_PYTHON), str(ROOT / "tests/recognize_flink/flink_run.py"),
                               str(spec)], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)


def ours(statement_text: str, data: list[dict]):
    """Our rows (the composite events as Flink's SELECT * columns), or our refusal."""
    import cep_core.reference as reference
    from cep_core.checker import load_query_text
    from cep_core.errors import QueryError, QueryErrors
    from cep_core.events import Event

    try:
        [checked] = load_query_text(statement_text.replace("ORDER BY rowtime", "ORDER BY ts"))
    except (QueryError, QueryErrors) as e:
        return {"error": str(e).splitlines()[0]}
    from cep_core.reference.recognize import RecognizeRuntimeError

    events = [Event(i, row["ts"], dict(row)) for i, row in enumerate(data)]
    names = [a.name for a in checked.query.partition_by] + \
        [m.name for m in checked.query.body.measures]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = rows(args.rows, rng)
    statements = {f"case{i}": statement(rng) for i in range(args.cases)}
    statements["mshape"] = MSHAPE
    answers = run_flink(statements, data)
    problems = compare(statements, data, answers)
    refused = sum(isinstance(a, dict) for a in answers.values())
    matches = sum(len(a) for a in answers.values() if isinstance(a, list))
    print(f"{len(statements)} statements over {len(data)} rows, {refused} refused by Flink, "
          f"{matches} rows answered, {len(problems)} differ from Flink")
    for problem in problems:
        print(problem)
    if args.save:
        args.save.write_text(json.dumps({"rows": data, "statements": statements,
                                         "flink": answers}, indent=1, sort_keys=True) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
