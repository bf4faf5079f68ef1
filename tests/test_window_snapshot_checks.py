"""A WINDOW engine refuses a snapshot whose numbers would take its kernel out of its arrays
(`cep_core.engine.window_checks`), and is left as it was: the snapshot's checksum holds,
the numbers in it do not."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.compiler.window import compile_window
from cep_core.engine.window import WindowEngine
from cep_core.events import Event
from cep_core.kernels import window_kernels as wk
from test_engine_window import check

QUERY = ("QUERY w SELECT symbol, count(*) AS n, min(symbol) AS lo, sum(price) AS total "
         "FROM ticks [RANGE 1000 ms SLIDE 250 ms] GROUP BY symbol")


def _engine(events: int, seed: int) -> WindowEngine:
    checked = check(QUERY)
    engine = WindowEngine(compile_window(checked), StringDictionary())
    rng = random.Random(seed)
    stream = [Event(i, 100 * i, {"symbol": rng.choice("ABCDE"), "price": rng.random(),
                                 "volume": 1, "time": 100 * i}) for i in range(events)]
    for s in ("A", "B", "C", "D", "E"):
        engine.strings.code(s)  # the same dictionary in every engine here
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(stream))
    return engine


def _taken():
    meta, arrays = _engine(300, 1).state()
    assert arrays["q0_st"][wk.ST_NACT] > 0
    return meta, {k: v.copy() for k, v in arrays.items()}


def _damage(meta, arrays, how):
    meta = {**meta, "queries": [dict(q) for q in meta["queries"]]}
    arrays = {k: v.copy() for k, v in arrays.items()}
    st, nact = arrays["q0_st"], int(arrays["q0_st"][wk.ST_NACT])
    if how == "groups":
        st[wk.ST_NG] += 1
    elif how == "keys":
        meta["queries"][0]["keys"] = meta["queries"][0]["keys"][:-1]
    elif how == "outn":
        st[wk.ST_OUTN] = -5
    elif how == "loc":
        arrays["q0_loc"][np.argmax(arrays["q0_loc"])] = st[wk.ST_NG]
    elif how == "twice":  # two key ids, one group
        loc = arrays["q0_loc"]
        loc[np.flatnonzero(loc >= 0)[:2]] = loc[np.flatnonzero(loc >= 0)[0]]
    elif how == "active":  # a group listed active twice: the list would overflow
        arrays["q0_active"][1] = arrays["q0_active"][0]
    elif how == "flag":
        inactive = np.flatnonzero(arrays["q0_isact"] == 0)
        arrays["q0_isact"][inactive[0] if len(inactive) else 0] ^= 1
    elif how == "digits":
        arrays["q0_xst"][0, 0, wk.XHI] = wk.XLIMBS
    elif how == "string":
        plan = compile_window(check(QUERY)).plan
        [column] = [a for a, (kind, _) in enumerate(plan.int_accs) if kind == wk.I_SMIN]
        arrays["q0_ist"][np.flatnonzero(arrays["q0_base"][:, wk.B_TAG] ==
                                        arrays["q0_base"][:, wk.B_TAG].max())[0], column] = 99
    elif how == "cfg":
        arrays["q0_cfg"][wk.CF_SLIDE] += 1
    assert nact >= 2 or how not in ("active", "twice")
    return meta, arrays


WHY = {"groups": "is not of this query's shape", "keys": "group keys are not one per group",
       "outn": "counters are out of range", "loc": "map to groups the query does not have",
       "twice": "map to groups the query does not have",
       "active": "active groups are not the groups flagged",
       "flag": "active groups are not the groups flagged",
       "digits": "exact sums use digits they do not have",
       "string": "string codes are not the dictionary's", "cfg": "another window or WHERE"}


@pytest.mark.parametrize("how", sorted(WHY))
def test_a_snapshot_out_of_its_arrays_is_refused_and_changes_nothing(how):
    meta, arrays = _taken()
    engine = _engine(40, 2)
    engine.dead_letters.append((3, "late"))
    before = engine.state()
    with pytest.raises(ValueError, match=WHY[how]):
        engine.load_state(*_damage(meta, arrays, how))
    after = engine.state()
    assert before[0] == after[0] and before[1].keys() == after[1].keys()
    assert all(np.array_equal(before[1][k], after[1][k]) for k in before[1])
    assert engine.dead_letters == [(3, "late")]
    engine.load_state(meta, arrays)  # the undamaged one restores
