"""Runs one pattern of bench/peers/patterns.py on OpenCEP, through OpenCEP's own API.

Executed by bench/peers/opencep.py with OpenCEP's interpreter (OpenCEP needs numpy only):

    python bench/peers/opencep_runner.py --opencep DIR --pattern NAME --events FILE --out FILE

Writes each match as a JSON line: the sorted input positions (0-based line numbers, the
product's `seq`) of its positive events. Prints one JSON object: matches, events and
`engine_s`, the time of `CEP.run` (OpenCEP parses its events inside it).
"""

from __future__ import annotations

# Deferred imports: `patterns` is this folder's module, importable only once the script runs in
# OpenCEP's virtualenv with the folder on its path.

import argparse
import collections
import collections.abc
import importlib
import json
import operator
import sys
import time
import types
from datetime import timedelta
from pathlib import Path

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "=": operator.eq, "!=": operator.ne}


def build_pattern(p, oc):
    """An OpenCEP Pattern for a PeerPattern; `oc` holds OpenCEP's classes."""
    from patterns import ATTRIBUTES, parse_condition, parse_step

    structures, kleene = [], set()
    for s in map(parse_step, p.steps):
        prim = oc.PrimitiveEventStructure(s.type, s.var)
        if s.kind == "not":
            prim = oc.NegationOperator(prim)
        elif s.kind == "kleene":
            prim = oc.KleeneClosureOperator(prim)
            kleene.add(s.var)
        structures.append(prim)
    top = oc.SeqOperator if p.operator == "SEQ" else oc.AndOperator
    conditions = [_condition(c, oc, kleene, ATTRIBUTES, parse_condition) for c in p.where]
    if not conditions:
        condition = oc.TrueCondition()
    elif len(conditions) == 1:
        condition = conditions[0]
    else:
        condition = oc.AndCondition(*conditions)
    return oc.Pattern(top(*structures), condition, timedelta(minutes=p.minutes))


def _getter(key):
    return lambda x: x[key]


def _scaled(coef):
    return (lambda v: v) if coef is None else (lambda v: v * coef)


def _condition(text, oc, kleene, attributes, parse_condition):
    left, op, right = parse_condition(text)
    rel = OPS[op]
    if left.var is not None and right.var is not None:
        fl, fr = _scaled(left.coef), _scaled(right.coef)
        return oc.BinaryCondition(oc.Variable(left.var, _getter(attributes[left.attr])),
                                  oc.Variable(right.var, _getter(attributes[right.attr])),
                                  relation_op=lambda x, y: rel(fl(x), fr(y)))
    if left.var is None:
        raise ValueError(f"write the variable on the left: {text!r}")
    f, value = _scaled(left.coef), right.value
    if left.var in kleene:
        return oc.KCValueCondition(names={left.var}, getattr_func=_getter(attributes[left.attr]),
                                   relation_op=lambda x, y: rel(f(x), y), value=value)
    return oc.SimpleCondition(oc.Variable(left.var, _getter(attributes[left.attr])),
                              relation_op=lambda x: rel(f(x), value))


# OpenCEP's classes the runner uses: name -> module
OPENCEP_NAMES = {
    "Event": "base.Event", "Pattern": "base.Pattern", "AndOperator": "base.PatternStructure",
    "KleeneClosureOperator": "base.PatternStructure",
    "NegationOperator": "base.PatternStructure",
    "PrimitiveEventStructure": "base.PatternStructure", "SeqOperator": "base.PatternStructure",
    "CEP": "CEP", "AndCondition": "condition.CompositeCondition",
    "BinaryCondition": "condition.Condition", "SimpleCondition": "condition.Condition",
    "TrueCondition": "condition.Condition", "Variable": "condition.Condition",
    "KCValueCondition": "condition.KCCondition",
    "MetastockDataFormatter": "plugin.stocks.Stocks", "FileInputStream": "stream.FileStream",
    "OutputStream": "stream.Stream",
}


def load_opencep(directory: str) -> types.SimpleNamespace:
    sys.path.insert(0, directory)
    # OpenCEP was written for Python < 3.10: `from collections import Callable`
    collections.Callable = collections.abc.Callable
    return types.SimpleNamespace(**{name: getattr(importlib.import_module(module), name)
                                    for name, module in OPENCEP_NAMES.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--opencep", required=True)
    ap.add_argument("--pattern", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from patterns import BY_NAME

    oc = load_opencep(args.opencep)
    pattern = build_pattern(BY_NAME[args.pattern], oc)
    cep = oc.CEP([pattern])
    events = oc.FileInputStream(args.events)
    matches = oc.OutputStream()
    oc.Event.counter = 0  # OpenCEP numbers events from this global counter: seq = line
    start = time.perf_counter()
    cep.run(events, matches, oc.MetastockDataFormatter())
    engine_s = time.perf_counter() - start
    index = oc.Event.INDEX_ATTRIBUTE_NAME
    count = 0
    with open(args.out, "w") as out:
        for match in matches:
            seqs = []
            for e in match.events:
                for p in getattr(e, "primitive_events", None) or [e]:
                    seqs.append(p.payload[index])
            out.write(json.dumps(sorted(seqs)) + "\n")
            count += 1
    print(json.dumps({"pattern": args.pattern, "matches": count, "events": oc.Event.counter,
                      "engine_s": engine_s}))


if __name__ == "__main__":
    main()
