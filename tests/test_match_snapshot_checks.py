"""A MATCH engine refuses a snapshot whose numbers would take its kernel out of its arrays
(`cep_core.engine.match_checks`), with candidates in slots, in their keys' rows and with a
Collect log, and is left as it was: the snapshot's checksum holds, the numbers in it do
not."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.compiler.match import compile_match
from cep_core.engine.match import MatchEngine
from cep_core.kernels import match_runtime as layout
from test_engine_match import events, query

CTR = {name: i for i, name in enumerate(layout.CTR)}
QUERIES = {  # candidates in slots (First() is not Last()), in their keys' rows, and Collect
    "slots": """QUERY q FROM mixed PARTITION BY symbol PATTERN ( a b+ c )
                DEFINE a AS price < 3, b AS price >= First(price), c AS price = 0
                EMIT n = Count(), s = First(symbol), hi = Max(price)""",
    "per_key": """QUERY q FROM mixed PARTITION BY symbol PATTERN ( a b+ c )
                  DEFINE a AS price < 3, b AS price >= Last(price), c AS price = 0
                  EMIT n = Count(), s = First(symbol)""",
    "collect": """QUERY q FROM mixed PARTITION BY symbol PATTERN ( a b* c )
                  DEFINE a AS price < 3, b AS price > 0, c AS price = 0 AND volume = 9
                  EMIT n = Count(), prices = Collect(price), syms = Collect(symbol)""",
}


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"symbol": f"K{rng.randrange(5)}", "price": rng.randrange(9),
             "volume": rng.choice([0, 9]), "ratio": 0.0, "flag": False, "ts": i}
            for i in range(n)]


def _engine(kind: str, rows: list[dict]):
    [checked] = query(QUERIES[kind])
    program = compile_match(checked)
    assert program.per_key == (kind == "per_key") and program.collect == (kind == "collect")
    engine = MatchEngine(program, StringDictionary())
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(events(rows)))
    return engine


def _taken(kind: str):
    """A state mid-stream: keys with candidates."""
    engine = _engine(kind, _rows(300, 1))
    meta, arrays = engine.state()
    assert arrays["key_i"][:, engine.program.keys.ints[("n",)]].max() > 0
    return engine.program, meta, {k: v.copy() for k, v in arrays.items()}


def _damage(kind: str, program, meta, arrays, how: str):
    meta, arrays = dict(meta, ctr=list(meta["ctr"])), {k: v.copy() for k, v in arrays.items()}
    keys, records = program.keys, program.records
    key_i, cap = arrays["key_i"], meta["cap"]
    key = int(np.argmax(key_i[:, keys.ints[("n",)]]))
    high = meta["ctr"][CTR["high"]]

    def candidate(column) -> tuple[np.ndarray, int]:  # the key's first candidate's cell
        if program.per_key:
            return key_i[key], len(keys.ints) + records.ints[column]
        return arrays["rec_i"][key_i[key, keys.ints[("slot",)]] * cap], records.ints[column]

    if how == "cap":
        meta["cap"] = 0
    elif how == "rows":  # each in range, together more than restoring could allocate
        meta["cap"], meta["nslots"] = 1 << 20, 1 << 20
    elif how == "high":
        meta["ctr"][CTR["high"]] = meta["nslots"] + 1
    elif how == "shape":
        arrays["key_i"] = key_i[:, :-1]
    elif how == "free":
        arrays["free"] = np.append(arrays["free"], high)
        meta["ctr"][CTR["free_top"]] += 1
    elif how == "count":
        key_i[key, keys.ints[("n",)]] = cap + 1
    elif how == "slot":
        key_i[key, keys.ints[("slot",)]] = high
    elif how == "owner":
        arrays["slot_i"][key_i[key, keys.ints[("slot",)]], program.slots.ints[("key",)]] = \
            key + 1
    elif how == "mask":
        row, column = candidate(("mask",))
        row[column] = program.ftab.size
    elif how == "string":
        [column] = [k for k in records.kinds if k[0] == "first" and k[-1] == "symbol"]
        row, at = candidate(column)
        row[at] = 1 << 20
    elif how == "log":
        arrays["log_prev"][-1] = len(arrays["log_prev"]) - 1  # itself: a loop
    elif how == "chain":
        row, column = candidate(layout.COUNT)
        row[column] = len(arrays["log_prev"]) + 2
    return meta, arrays


WHY = {"cap": "capacities are out of range", "rows": "more candidates than any state",
       "high": "slot and log counters",
       "shape": "not of this query's shape", "free": "free list holds slots",
       "count": "more candidates than a slot has room for",
       "slot": "keys hold slots the pool does not have",
       "owner": "slots name other keys", "mask": "states the query does not have",
       "string": "string codes are not the dictionary's",
       "log": "links forward or out of the log", "chain": "fewer rows than its candidates"}
CASES = [(kind, how) for kind in QUERIES for how in sorted(WHY)
         if not (kind == "per_key" and how in ("free", "slot", "owner", "high"))
         and not (kind != "collect" and how in ("log", "chain"))
         and not (kind == "collect" and how == "string")]  # (no First(symbol) there)


@pytest.mark.parametrize("kind, how", CASES)
def test_a_snapshot_out_of_its_arrays_is_refused_and_changes_nothing(kind, how):
    program, meta, arrays = _taken(kind)
    engine = _engine(kind, _rows(40, 2))
    before = engine.state()
    with pytest.raises(ValueError, match=WHY[how]):
        engine.load_state(*_damage(kind, program, meta, arrays, how))
    after = engine.state()
    assert before[0] == after[0] and before[1].keys() == after[1].keys()
    assert all(np.array_equal(before[1][k], after[1][k]) for k in before[1])
    engine.load_state(meta, arrays)  # the undamaged one restores


def test_a_refused_snapshot_keeps_the_engines_dead_letters():
    engine = _engine("slots", _rows(300, 1))
    engine.dead_letters.append((7, "late"))
    other = _engine("slots", _rows(300, 1))
    damaged = _damage("slots", other.program, *other.state(), "mask")
    other.state = lambda: damaged  # its snapshot, checksummed, of numbers out of range
    with pytest.raises(ValueError, match=WHY["mask"]):
        engine.restore(other.snapshot())
    assert engine.dead_letters == [(7, "late")]
