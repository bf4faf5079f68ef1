"""A jitted MATCH_RECOGNIZE engine refuses a snapshot whose numbers would take its kernels
out of their arrays (`cep_core.engine.recognize_checks`), in every layout, and is left as it
was: the snapshot's checksum holds, the numbers in it do not."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cep_core.batch import BatchEncoder, StringDictionary
from cep_core.compiler.recognize import compile_recognize
from cep_core.engine.recognize import RecognizeEngine
from cep_core.kernels import recognize_runtime as rt
from test_recognize_jit import MSHAPE_SQL, _events, _strict
from tests.recognize_flink import differential

BASE = ("SELECT * FROM quotes MATCH_RECOGNIZE (PARTITION BY symbol ORDER BY ts "
        "MEASURES {m} ONE ROW PER MATCH AFTER MATCH SKIP TO NEXT ROW PATTERN ({p}) "
        "DEFINE {d}) AS T")
STATEMENTS = {
    rt.STATES: MSHAPE_SQL,
    rt.RUNS: BASE.format(m="COUNT(*) AS n", p="A B*? C+ D",
                         d="B AS B.price >= A.price, C AS C.price >= A.price, "
                           "D AS D.price < A.price"),
    rt.COMPUTATIONS: BASE.format(m="SUM(B.price) AS sb", p="A B+ C",
                                 d="B AS B.price > A.price, C AS C.price < LAST(B.price)"),
}


def _taken(layout: str):
    """An engine of the layout mid-stream (keys with partial and completed matches), and
    its state."""
    checked = _strict(STATEMENTS[layout])
    program = compile_recognize(checked)
    assert program.layout == layout
    engine = RecognizeEngine(program, StringDictionary())
    rows = differential.rows(400, random.Random(8))
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(_events(rows)))
    meta, arrays = engine.state()
    assert arrays["key_i"][:, rt.K_NPART].max() > 0
    return checked, program, meta, {k: v.copy() for k, v in arrays.items()}


def _damage(layout, meta, arrays, how):
    meta, arrays = dict(meta, ctr=list(meta["ctr"])), {k: v.copy() for k, v in arrays.items()}
    key = int(np.argmax(arrays["key_i"][:, rt.K_NPART]))
    high = meta["ctr"][rt.HIGH]
    if how == "npart":
        arrays["key_i"][key, rt.K_NPART] = meta["pcap"] + 1
    elif how == "ncomp":
        arrays["key_i"][key, rt.K_NCOMP] = -1
    elif how == "completed":
        arrays["key_i"][key, rt.K_NCOMP] = 1
        arrays["ch"][key, 0] = high
    elif how == "free":
        arrays["free"] = np.append(arrays["free"], high)
        meta["ctr"][rt.FREE_TOP] += 1
    elif how == "high":
        meta["ctr"][rt.HIGH] = meta["pool"] + 1
    elif how == "ccap":
        meta["ccap"] = 0
    elif how == "pool":
        meta["pool"] = 1 << 40
    elif how == "partial":  # the layout's own: a record, or a run's state
        if layout == rt.COMPUTATIONS:
            arrays["ph"][key, 0] = high
        else:
            program = compile_recognize(_strict(STATEMENTS[layout]))
            arrays["ph"][key, 1, program.rows.ints[program.rows.counts[0]]] = \
                len(program.rows.counts) + 1
    return meta, arrays


WHY = {"npart": "longer than their capacities", "ncomp": "longer than their capacities",
       "completed": "completed matches are records the pool does not have",
       "free": "free list holds records the pool does not have",
       "high": "does not hold as many records", "ccap": "capacities or pool size",
       "pool": "capacities or pool size",
       "partial": "partial matches are records|runs are in states"}


@pytest.mark.parametrize("layout, how", [
    (layout, how) for layout in (rt.STATES, rt.RUNS, rt.COMPUTATIONS) for how in sorted(WHY)
    if not (how == "partial" and layout == rt.RUNS)])  # (a run's counts index nothing)
def test_a_snapshot_out_of_its_arrays_is_refused_and_changes_nothing(layout, how):
    checked, program, meta, arrays = _taken(layout)
    engine = RecognizeEngine(program, StringDictionary())
    rows = differential.rows(50, random.Random(9))
    engine.process(BatchEncoder(checked.schema, engine.strings).from_events(_events(rows)))
    before = engine.state()
    with pytest.raises(ValueError, match=WHY[how]):
        engine.load_state(*_damage(layout, meta, arrays, how))
    after = engine.state()
    assert before[0] == after[0] and all(np.array_equal(before[1][k], after[1][k])
                                         for k in before[1])
    engine.load_state(meta, arrays)  # the undamaged one restores
