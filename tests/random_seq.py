"""Random SEQ queries and streams for the differential tests of the SEQ engines
(tests/test_engine_seq.py: CDP, tests/test_engine_seq_aip.py: AIP under each strategy,
tests/test_compact_seq.py, tests/test_composites.py). A seed always draws the same query
and stream: the two test files' draws are kept apart where they differ (`strategy` None
is the CDP tests')."""

from __future__ import annotations

import random

from cep_core.events import Event, Punctuation


SCHEMAS = {
    # stream: (types, parameter attribute and values, numeric attribute and values)
    "rfid": (["O", "R", "D", "C"], ("item", [1, 2]), ("item", [1, 2, 3])),
    "abc": (["A", "B", "C"], ("p", [0, 1]), ("v", [0, 1, 2, 3])),
    "sensors": (["Temp", "Smoke"], ("area", ["n", "s"]), ("value", [44.5, 45.0, 46.5, 50.0])),
    "stocks": (["AAPL", "AMZN", "AVID"], ("volume", [1, 2]), ("open", [9.5, 10.0, 10.25, 11.0])),
}


TYPE_ATTRIBUTE = {"rfid": "type", "abc": "type", "sensors": "kind", "stocks": "ticker"}


def make_row(stream: str, kind: str, param, value, ts: int) -> dict:
    if stream == "rfid":
        return {"type": kind, "item": param, "ts": ts}
    if stream == "abc":
        return {"type": kind, "p": param, "v": value, "ts": ts}
    if stream == "sensors":
        return {"kind": kind, "area": param, "value": float(value), "ts": ts}
    return {"ticker": kind, "ts": ts, "open": float(value), "peak": float(value) + 1,
            "low": float(value) - 1, "close": float(value), "volume": param}


def random_stream(rng: random.Random, stream: str, n: int) -> list:
    """n events of few types and values, time steps 0-3 with ties, now and then a
    punctuation or an event whose time goes backwards (a dead letter)."""
    types, (_, params), (_, values) = SCHEMAS[stream]
    weights = [rng.random() + 0.2 for _ in types]
    ts = 0
    out: list = []
    for seq in range(n):
        step = rng.choice([0, 0, 1, 1, 1, 2, 3]) if rng.random() > 0.02 else -2
        ts = max(ts + step, 0)
        if rng.random() < 0.05:
            out.append(Punctuation(ts + rng.randint(0, 6)))
        kind = rng.choices(types, weights)[0]
        out.append(Event(seq, ts, make_row(stream, kind, rng.choice(params),
                                           rng.choice(values), ts)))
    return out


# ---------------------------------------------------------------- random queries

STRATEGIES = ["skip-till-any-match", "skip-till-next-match", "strict-contiguity"]
RUN_STREAMS = ("abc", "rfid", "stocks")  # what the AIP tests draw from


def random_query(rng: random.Random, strategy: str | None = None,
                 streams=tuple(SCHEMAS)) -> tuple[str, str]:
    """(stream, query text) of a random SEQ query under `strategy`. None: the CDP tests'
    draws (skip-till-any-match without USING, EACH/LAST/FIRST on any item, ORDER BY drawn
    last, no false constant)."""
    stream = rng.choice(sorted(streams))
    cdp = strategy is None
    any_match = cdp or strategy == "skip-till-any-match"
    by_ts = None if cdp else rng.random() < 0.3
    if any_match and rng.random() < 0.25:
        return stream, random_tesla(rng, stream, by_ts)
    types, (param, _), (num, values) = SCHEMAS[stream]
    tattr = TYPE_ATTRIBUTE[stream]

    def pick() -> str:
        return "ANY" if rng.random() < 0.06 else rng.choice(types)

    items = []  # (kind, [(type, var)]), kind: single, kleene, and
    singles, kleenes = [], []
    names = iter(range(100))
    for _ in range(rng.randint(2, 4)):
        choice = rng.choice(["single"] * 5 + ["kleene", "kleene", "and"])
        if choice == "kleene" and len(kleenes) < (2 if rng.random() < 0.3 else 1):
            var = f"k{next(names)}"
            items.append(("kleene", [(pick(), var)]))
            kleenes.append(var)
        elif choice == "and":
            members = [(pick(), f"g{next(names)}") for _ in range(2)]
            items.append(("and", members))
            singles += [v for _, v in members]
        else:
            var = f"s{next(names)}"
            items.append(("single", [(pick(), var)]))
            singles.append(var)
    negation = rng.choice([None, None, "start", "middle", "end"])
    window = rng.choice([None, 4, 6, 9])
    if window is None and (kleenes or negation in ("start", "end") or not any_match):
        window = rng.choice([4, 6])
    rendered = []
    policies = ["", "", "", "EACH "] + (["LAST ", "FIRST "] if not by_ts else [])
    for k, (kind, members) in enumerate(items):
        if kind == "single":
            (t, v), = members
            flt = rng.choice(["", "", "", f"({num} > {values[0]})"])
            drawn = cdp or (any_match and k < len(items) - 1)
            policy = rng.choice(policies) if drawn else ""
            rendered.append(f"{policy}{t} {v}{flt}")
        elif kind == "kleene":
            (t, v), = members
            flt = rng.choice(["", "", f"({num} >= {values[1]})"])
            bounds = rng.choice(["{1,2}", "{1,3}", "{2,3}", "{1}", "{2,}", ""])
            rendered.append(rng.choice([f"KLEENE({t} {v}{flt}){bounds}", f"{t}+ {v}"]))
        else:
            rendered.append("AND(" + ", ".join(f"{t} {v}" for t, v in members) + ")")
    neg_vars = []
    if negation is not None:
        neg_vars.append("n9")
        neg = f"NOT({rng.choice(types)} n9{rng.choice(['', f'({num} > {values[0]})'])})"
        position = {"start": 0, "end": len(rendered),
                    "middle": rng.randint(1, len(rendered) - 1)}[negation]
        rendered.insert(position, neg)
        if window is not None and rng.random() < 0.2:
            neg_vars.append("n8")
            rendered.insert(rng.choice([0, len(rendered)]), f"NOT({rng.choice(types)} n8)")
    positives = singles + kleenes
    order = {}  # step index of every variable (AND members share one)
    for i, r in enumerate(rendered):
        for v in [*singles, *kleenes, *neg_vars]:
            if f" {v}" in r and (f" {v})" in r or f" {v}(" in r or f" {v}," in r or
                                 r.endswith(f" {v}") or f" {v}{{" in r):
                order[v] = i
    conjuncts = []
    for _ in range(rng.randint(0, 3)):
        template = rng.choice(["param"] * (2 if cdp else 3) + [
            "num", "agg", "window", "or", "const", "neg", "neg", "str"])
        a, b = rng.sample(positives, 2) if len(positives) > 1 else (positives[0],) * 2
        if template == "param" and a != b:
            conjuncts.append(f"{a}.{param} = {b}.{param}")
        elif template == "num" and a != b:
            conjuncts.append(f"{a}.{num} {rng.choice(['<', '<=', '>', '!='])} {b}.{num}")
        elif template == "agg" and kleenes:
            k = kleenes[0]
            func = rng.choice(["count", "sum", "avg", "min", "max", "last", "first"])
            other = rng.choice(singles) if singles else None
            if func == "count":
                conjuncts.append(f"count({k}) <= 2")
            elif other is not None:
                conjuncts.append(f"{func}({k}.{num}) >= {other}.{num}")
            else:
                conjuncts.append(f"{func}({k}.{num}) > {values[1]}")
        elif template == "window" and singles:
            anchor = rng.choice(singles)
            t = rng.choice(types)
            func = rng.choice(["count", "avg", "max", "sum"])
            arg = f"{t} WITHIN 3 ticks FROM {anchor}" if func == "count" else \
                f"{t}({param} = {anchor}.{param}).{num} WITHIN 3 FROM {anchor}"
            bound = 1 if func == "count" else values[1]
            conjuncts.append(f"{func}({arg}) {rng.choice(['>=', '<'])} {bound}")
        elif template == "or" and a != b:
            conjuncts.append(f"({a}.{num} > {values[2]} OR {b}.{param} = {a}.{param})")
        elif template == "const":
            falsum = not cdp and rng.random() < 0.3
            conjuncts.append(rng.choice(["1 < 2", "2 < 1"]) if falsum else "1 < 2")
        elif template == "neg" and neg_vars:
            conjuncts.append(f"{rng.choice(neg_vars)}.{param} = {a}.{param}")
        elif template == "str" and a != b:
            conjuncts.append(rng.choice([f"{a}.{tattr} < {b}.{tattr}",
                                         f"lower({a}.{tattr}) != upper({b}.{tattr})",
                                         f"{a}.{tattr} >= 'B'"]))
    # A condition on a LAST/FIRST step may only mention later steps.
    policy_of = {}
    for r in rendered:
        for word in ("LAST", "FIRST"):
            if r.startswith(word + " "):
                policy_of[r.split()[2].split("(")[0]] = word
    kept = []
    for c in conjuncts:
        mentioned = [v for v in [*positives, *neg_vars] if f"{v}." in c or f"({v})" in c
                     or f"FROM {v}" in c]
        if any(v in policy_of and any(order[w] <= order[v] for w in mentioned if w != v)
               for v in mentioned):
            continue
        kept.append(c)
    emits = []
    if singles and rng.random() < 0.5:
        s = rng.choice(singles)
        emits += [f"e1 = {s}.{num}", f"e2 = {s}.{param}"]
        if len(singles) > 1:
            emits.append(f"e3 = {s}.{num} / {singles[-1]}.{num}")
            emits.append(f"e9 = {s}.{num} > {singles[-1]}.{num}")
            emits.append(f"e10 = {singles[-1]}.{tattr}")
    if kleenes and rng.random() < 0.5:
        k = kleenes[0]
        emits += [f"e4 = count({k}) + 1", f"e5 = avg({k}.{num})", f"e6 = first({k}.{param})",
                  f"e8 = max({k}.{param})"]
    if singles and rng.random() < 0.25:
        emits.append(f"e7 = min({rng.choice(types)}.{num} WITHIN 4 FROM {singles[0]})")
    partition = rng.choice(["", "", "", "", f" PARTITION BY {param}",
                            f" PARTITION BY {param}", f" PARTITION BY {param}, {tattr}"])
    text = f"QUERY q FROM {stream}{partition} PATTERN SEQ({', '.join(rendered)})"
    if kept:
        text += " WHERE " + " AND ".join(kept)
    if window is not None:
        text += f" WITHIN {window}"
    ordered = rng.random() < 0.3 if cdp else by_ts
    if ordered:
        text += " ORDER BY ts"
    if not any_match:
        text += f" USING {strategy}"
    if emits:
        text += " EMIT " + ", ".join(emits)
    return stream, text


def random_tesla(rng: random.Random, stream: str, by_ts: bool | None) -> str:
    """A TESLA rule. `by_ts` None: the CDP tests' draws (ORDER BY drawn here)."""
    cdp = by_ts is None
    types, (param, _), (num, values) = SCHEMAS[stream]
    n = rng.randint(1, 3)
    names = [f"t{i}" for i in range(n + 1)]  # t0 the terminator, then back in time
    parts = [f"{rng.choice(types)} t0"]
    policies = {}
    for i in range(1, n + 1):
        choices = ["EACH"] if by_ts else ["EACH", "LAST", "FIRST"]
        policies[names[i]] = policy = rng.choice(choices)
        anchor = names[rng.randint(0, i - 1)]
        flt = rng.choice(["", "", f"({num} >= {values[1]})"])
        parts.append(f"{policy} {rng.choice(types)} {names[i]}{flt} "
                     f"WITHIN {rng.choice([2, 4, 6])} FROM {anchor}")
    # A condition on a LAST/FIRST step may only mention later steps (smaller index here).
    conjuncts = []
    for i in range(1, n + 1):
        later = [j for j in range(i) if j == 0 or policies[names[j]] == "EACH"]
        if rng.random() < (0.5 if cdp else 0.6):
            conjuncts.append(f"{names[i]}.{param} = {names[rng.choice(later)]}.{param}")
        if rng.random() < 0.3:
            conjuncts.append(f"{names[i]}.{num} > {values[1]}")
    if rng.random() < 0.25:
        conjuncts.append(f"count({rng.choice(types)} WITHIN 4 FROM t0) >= 2")
    text = f"QUERY q FROM {stream} DETECT {', '.join(parts)}"
    if conjuncts:
        text += " WHERE " + " AND ".join(conjuncts)
    if rng.random() < 0.2:
        text += f" WITHIN {rng.choice([3, 6])}"
    ordered = rng.random() < 0.25 if cdp else by_ts
    if ordered:
        text += " ORDER BY ts"
    text += f" EMIT a = t0.{num}, b = {names[-1]}.{param}"
    return text


def random_case(seed: int, strategy: str | None = None):
    """(query text, stream, batch sizes, restore_at) drawn from random.Random(seed); with
    `strategy` None the CDP tests' draws, else the AIP tests' (RUN_STREAMS, longer streams)."""
    rng = random.Random(seed)
    if strategy is None:
        stream, text = random_query(rng)
    else:
        stream, text = random_query(rng, strategy, RUN_STREAMS)
    events = random_stream(rng, stream, rng.randint(5, 30 if strategy is None else 40))
    sizes = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    n = sum(1 for e in events if isinstance(e, Event))
    restore_at = rng.choice([None, rng.randint(1, max(n, 1))])
    return text, events, sizes, restore_at
