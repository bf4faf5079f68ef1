"""A SEQ engine (CDP and AIP) refuses a snapshot whose stored events or pending matches
would take its kernels out of their arrays (`cep_core.engine.seq_checks`), and is left as
it was: the snapshot's checksum holds, the numbers in it do not."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.checker import load_query_text
from cep_core.engine_factory import cpu_engine
from cep_core.events import Event
from cep_core.kernels.seq_layout import P_NEXT, P_PART, PALIVE, PN
from random_seq import make_row

# a trailing negation keeps matches pending until it cannot come; a Kleene variable binds
# rows through `pk`
QUERY = ("QUERY q FROM abc PARTITION BY p PATTERN SEQ(A a, KLEENE(B k), C c, NOT(A n)) "
         "WHERE n.v = a.v WITHIN 40")


def _engine(algorithm: str, events: int, seed: int):
    [checked] = load_query_text(QUERY)
    engine = cpu_engine(checked, StringDictionary(), algorithm=algorithm)
    rng = random.Random(seed)
    stream = [Event(i, i, make_row("abc", rng.choice("ABBC"), rng.randrange(3),
                                   rng.randrange(4), i)) for i in range(events)]
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(stream))
    return engine


def _taken(algorithm: str):
    engine = _engine(algorithm, 200, 1)
    meta, arrays = engine.state()
    assert arrays["ctr"][PALIVE] >= 2 and len(arrays["pk"]) > 0
    return engine, meta, {k: v.copy() for k, v in arrays.items()}


def _damage(engine, meta, arrays, how):
    meta, arrays = dict(meta), {k: v.copy() for k, v in arrays.items()}
    pd, heads = arrays["pd"], arrays["phead"]
    p = int(np.flatnonzero(heads >= 0)[0])
    [(slot, channel, _)] = [v for v in engine.kernel.pending_vars if not v[2]][:1]
    [(kslot, _, _)] = [v for v in engine.kernel.pending_vars if v[2]]
    if how == "partitions":
        meta["partitions"] += 1
    elif how == "counts":
        arrays["cnt"][0, 0] = -1
    elif how == "stored":
        arrays["cnt"][0, 0] += 1
    elif how == "head":
        heads[p] = arrays["ctr"][PN]
    elif how == "loop":
        pd[arrays["ptail"][p], P_NEXT] = heads[p]
    elif how == "other":
        pd[heads[p], P_PART] = p + 1
    elif how == "tail":
        arrays["ptail"][p] = -1
    elif how == "alive":
        arrays["ctr"][PALIVE] += 1
    elif how == "binding":
        pd[heads[p], slot] = arrays["evicted"][p, channel] + arrays["cnt"][p, channel]
    elif how == "kleene":
        pd[heads[p], kslot + 1] = len(arrays["pk"]) + 1
    elif how == "kleene_row":
        arrays["pk"][pd[heads[p], kslot]] = -1 - arrays["evicted"].max()
    return meta, arrays


WHY = {"partitions": "not of this query's shape", "counts": "counts are out of range",
       "stored": "not of this query's shape", "head": "start or end outside",
       "loop": "loop, cross or hold", "other": "loop, cross or hold",
       "tail": "do not end where", "alive": "not as many as the counters",
       "binding": "bind events their partitions do not hold",
       "kleene": "Kleene rows are out of their array",
       "kleene_row": "bind events their partitions do not hold"}


@pytest.mark.parametrize("algorithm, how", [(a, h) for a in ("cdp", "aip") for h in sorted(WHY)])
def test_a_snapshot_out_of_its_arrays_is_refused_and_changes_nothing(algorithm, how):
    taker, meta, arrays = _taken(algorithm)
    engine = _engine(algorithm, 200, 1)  # (the same strings)
    before = engine.state()
    with pytest.raises(ValueError, match=WHY[how]):
        engine.load_state(*_damage(taker, meta, arrays, how))
    after = engine.state()
    assert before[0] == after[0] and before[1].keys() == after[1].keys()
    assert all(np.array_equal(before[1][k], after[1][k]) for k in before[1])
    engine.load_state(meta, arrays)  # the undamaged one restores
