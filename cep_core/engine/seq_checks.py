"""What a SEQ engine's snapshot must hold of the state both its algorithms keep
(`SeqEngineBase._channel_state`) before those arrays reach the kernels, which index them
without bounds checks (`check_channel_state`): per-partition arrays of one length, stored
events as many as the partitions' counts say, and pending matches in one list per partition
that ends, each record of its partition, binding stored events the partition still has. A
snapshot is checksummed (`snapshot_format`), so these refuse a crafted one, or one of a
version that kept other numbers. The AIP engine's instances (`IT`, `NR`, `NP`, ...) are not
checked here."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.arrow_numpy import segment_rows
from cep_core.engine.state_checks import LIMIT, refuser, whole
from cep_core.kernels.seq_layout import (
    CTR_SIZE,
    P_CNT,
    P_NEXT,
    P_PART,
    PALIVE,
    PEL,
    PKN,
    PN,
)


def check_channel_state(engine: Any, meta: dict[str, Any],
                        arrays: dict[str, npt.NDArray[Any]], nstrings: int) -> None:
    """ValueError (naming the query) where the snapshot could take a kernel out of its
    arrays. `engine`: the SEQ engine restoring it (its kernel's layout and pending record
    slots, its channels and string columns); `nstrings` strings restored with it."""
    refuse = refuser(engine.checked.name)
    partitions = meta.get("partitions")
    if not whole(partitions) or not 0 <= partitions <= LIMIT:  # type: ignore[operator]
        refuse("number of partitions is out of range")
    P, C = partitions, engine.n_channels
    ctr = arrays.get("ctr")
    if ctr is None or ctr.shape != (CTR_SIZE,) or ctr.dtype.kind != "i":
        refuse("counters are not counters")
    pn, pkn = int(ctr[PN]), int(ctr[PKN])
    shapes = {**{name: (P,) for name in engine._PER_PARTITION}, "cnt": (P, C),
              "evicted": (P, C), "pd": (pn, engine.kernel.record_width), "pk": (pkn,)}
    cnt = arrays.get("cnt")
    if cnt is None or cnt.shape != (P, C):
        refuse("cnt is not of this query's shape")
    if (cnt < 0).any() or cnt.sum() > LIMIT:
        refuse("stored events' counts are out of range")
    stored = cnt.sum(axis=0)
    shapes.update({f"ch{c}_i": (int(stored[c]), engine.layout.n_int) for c in range(C)})
    shapes.update({f"ch{c}_f": (int(stored[c]), engine.layout.n_float) for c in range(C)})
    for name, shape in shapes.items():
        if name not in arrays or arrays[name].shape != shape:
            refuse(f"{name} is not of this query's shape")
    if (arrays["evicted"] < 0).any():
        refuse("evicted events' counts are out of range")
    columns = engine._string_columns()
    for c in range(C):
        codes = arrays[f"ch{c}_i"][:, columns]
        if ((codes < -1) | (codes >= nstrings)).any():
            refuse("string codes are not the dictionary's")
    _check_pending(refuse, engine, arrays, ctr, pn, pkn)


def _check_pending(refuse: Any, engine: Any, arrays: dict[str, npt.NDArray[Any]],
                   ctr: npt.NDArray[np.int64], pn: int, pkn: int) -> None:
    """Each partition's pending matches: a list from `phead` that ends at `ptail`, of its
    own records, none in two lists; their bindings stored events the partition has."""
    pd, pk = arrays["pd"], arrays["pk"]
    heads, tails = arrays["phead"], arrays["ptail"]
    if ((heads < -1) | (heads >= pn) | (tails < -1) | (tails >= pn)).any():
        refuse("pending lists start or end outside the pending matches")
    seen = np.zeros(pn, np.bool_)
    alive = []
    for p in np.flatnonzero(heads >= 0).tolist():
        rec, last = int(heads[p]), -1
        while rec >= 0:
            if rec >= pn or seen[rec] or pd[rec, P_PART] != p:
                refuse("pending lists loop, cross or hold other partitions' matches")
            seen[rec] = True
            alive.append(rec)
            last, rec = rec, int(pd[rec, P_NEXT])
        if last != tails[p]:
            refuse("pending lists do not end where their partitions say")
    if ((heads < 0) & (tails >= 0)).any():
        refuse("pending lists do not end where their partitions say")
    live = pd[np.array(alive, np.int64)]
    if len(live) != ctr[PALIVE] or (live[:, P_CNT] < 0).any() or \
            int(live[:, P_CNT].sum()) != ctr[PEL]:
        refuse("pending matches are not as many as the counters say")
    cnt, evicted = arrays["cnt"], arrays["evicted"]
    part = live[:, P_PART]
    for slot, channel, kleene in engine.kernel.pending_vars:
        held, gone = cnt[part, channel], evicted[part, channel]
        if not kleene:
            rows = live[:, slot] - gone
        else:
            start, count = live[:, slot], live[:, slot + 1]
            if ((start < 0) | (count < 0) | (start + count > pkn)).any():
                refuse("pending matches' Kleene rows are out of their array")
            at = segment_rows(start, count)
            rows = pk[at] - np.repeat(gone, count)
            held = np.repeat(held, count)
        if ((rows < 0) | (rows >= held)).any():
            refuse("pending matches bind events their partitions do not hold")

