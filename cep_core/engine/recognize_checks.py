"""What a jitted MATCH_RECOGNIZE engine's snapshot must hold before its arrays reach the
kernels, which index them without bounds checks (`check_state`): queues no longer than
their capacities, handles of records the pool has, a free list of them, and in the states
layout runs in states the query has. A snapshot is checksummed (`snapshot_format`), so
these refuse a crafted one, or one of a version that kept other numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.engine.state_checks import LIMIT, refuser, whole
from cep_core.kernels import recognize_runtime as rt


def check_state(name: str, program: Any, meta: dict[str, Any],
                arrays: dict[str, npt.NDArray[Any]], nkeys: int) -> None:
    """ValueError (naming query `name`) where the snapshot's numbers could take a kernel
    out of its arrays. `program`: the engine's RecognizeProgram; the arrays' shapes are
    checked already (`RecognizeEngine.load_state`)."""
    refuse = refuser(name)
    sizes = [meta.get(k) for k in ("pcap", "ccap", "pool")]
    if not all(whole(v) and 1 <= v <= LIMIT for v in sizes):  # type: ignore[operator]
        refuse("queue capacities or pool size are out of range")
    pcap, ccap, pool = (int(v) for v in sizes)  # type: ignore[arg-type]
    ctr = meta.get("ctr")
    if not isinstance(ctr, list) or not 2 <= len(ctr) <= len(rt.CTR) or \
            not all(map(whole, ctr)):
        refuse("counters are not counters")
    high, free_top = int(ctr[rt.HIGH]), int(ctr[rt.FREE_TOP])
    rec_i, free = arrays["rec_i"], arrays["free"]
    if not 1 <= high <= pool or len(rec_i) != high or len(arrays["rec_f"]) != high or \
            free.ndim != 1 or len(free) != free_top:
        refuse("record pool does not hold as many records as its counters say")
    if ((free < 1) | (free >= high)).any() or len(np.unique(free)) != len(free):
        refuse("free list holds records the pool does not have")
    key_i = arrays["key_i"]
    if len(key_i) != nkeys or key_i.shape[1] <= rt.K_ROWS:
        refuse("key rows are not one per key")
    npart, ncomp = key_i[:, rt.K_NPART], key_i[:, rt.K_NCOMP]
    if ((npart < 0) | (npart > pcap) | (ncomp < 0) | (ncomp > ccap)).any() or \
            (key_i[:, rt.K_ROWS] < 0).any():
        refuse("queues are longer than their capacities")
    ch, ph = arrays["ch"], arrays["ph"]
    if ch.shape != (nkeys, ccap) or len(ph) != nkeys:
        refuse("queues are not one per key")
    slots = np.arange(max(pcap, ccap))[None, :]
    completed = ch[slots[:, :ccap] < ncomp[:, None]]
    if ((completed < 1) | (completed >= high)).any():
        refuse("completed matches are records the pool does not have")
    runs = slots[:, :pcap] < npart[:, None]
    if program.layout == rt.COMPUTATIONS:
        partial = ph[runs]
        if ((partial < 0) | (partial >= high)).any():
            refuse("partial matches are records the pool does not have")
        states = rec_i[partial, rt.STATE]
        if ((states < 0) | (states >= len(program.tables["st_var"]))).any():
            refuse("partial matches are in states the query does not have")
    elif program.layout == rt.STATES:
        states = ph[:, 1:, program.rows.ints[program.rows.counts[0]]][runs]
        if ((states < 1) | (states > len(program.rows.counts))).any():
            refuse("runs are in states the query does not have")
