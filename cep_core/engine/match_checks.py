"""What a MATCH engine's snapshot must hold before its arrays reach the kernel, which
indexes them without bounds checks (`check_state`): arrays of the shapes the program and
the snapshot's capacities make, a free list of slots the pool has, keys holding slots of
their own with no more candidates than a slot has room for, candidates in states the
automaton has, string codes the dictionary has, and a Collect log whose every chain is as
long as its candidates' counts. A snapshot is checksummed (`snapshot_format`), so these
refuse a crafted one, or one of a version that kept other numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.arrow_numpy import segment_rows
from cep_core.kernels import match_runtime as layout
from cep_core.engine.state_checks import LIMIT, refuser, whole
from cep_core.schema import AttrType

I64 = npt.NDArray[np.int64]
ROWS = 1 << 31  # the most candidate rows (slots times candidates a slot, or keys times it)
_CTR = {name: i for i, name in enumerate(layout.CTR)}


def check_state(name: str, program: Any, meta: dict[str, Any],
                arrays: dict[str, npt.NDArray[Any]], nkeys: int, nstrings: int,
                string_logs: list[str]) -> None:
    """ValueError (naming query `name`) where the snapshot could take the kernel out of
    its arrays. `program`: the engine's `cep_core.compiler.match.Program`; `nkeys` keys
    and `nstrings` strings restored with it; `string_logs`: the Collect log's arrays of
    string codes."""
    refuse = refuser(name)
    sizes, ctr = (meta.get("cap"), meta.get("nslots")), meta.get("ctr")
    if not all(whole(v) and 1 <= v <= LIMIT for v in sizes):  # type: ignore[operator]
        refuse("capacities are out of range")
    cap, nslots = (int(v) for v in sizes)  # type: ignore[arg-type]
    if nslots * cap > ROWS or max(nkeys, 16) * cap > ROWS:  # what restoring allocates
        refuse("capacities ask for more candidates than any state this engine makes")
    if not isinstance(ctr, list) or len(ctr) != len(layout.CTR) or not all(map(whole, ctr)):
        refuse("counters are not counters")
    high, free_top, log_n = (int(ctr[_CTR[c]]) for c in ("high", "free_top", "log_n"))
    if not (1 <= high <= nslots and 0 <= free_top < high and 0 <= log_n <= LIMIT):
        refuse("slot and log counters are out of range")
    shapes: dict[str, tuple[int, ...]] = {"free": (free_top,)}
    for table, count in ((program.key_arrays(cap), nkeys),
                         ([] if program.per_key else program.slots.arrays(), high),
                         ([] if program.per_key else program.records.arrays(), high * cap)):
        for array, width, _ in table:
            shapes[array] = (count, width)
    if program.collect:
        shapes.update({array: (log_n,) for array in ["log_prev"] +
                       [n for n, _ in program.log_fields]})
    for array, shape in shapes.items():
        if array not in arrays or arrays[array].shape != shape:
            refuse(f"{array} is not of this query's shape")

    free = arrays["free"]
    if ((free < 1) | (free >= high)).any() or len(np.unique(free)) != len(free):
        refuse("free list holds slots the pool does not have")
    key_i, keys = arrays["key_i"], program.keys
    counts = key_i[:, keys.ints[("n",)]]
    if ((counts < 0) | (counts > cap)).any():
        refuse("keys hold more candidates than a slot has room for")
    live = np.flatnonzero(counts)
    if program.per_key:  # a key's candidates follow its fields
        width = program.records.arrays()[0][1]
        records = key_i[:, len(keys.ints):len(keys.ints) + cap * width]
        candidates = records.reshape(nkeys * cap, width)[segment_rows(live * cap, counts[live])]
    else:
        slots = key_i[:, keys.ints[("slot",)]]
        used = slots[slots != 0]
        if ((slots < 0) | (slots >= high)).any() or (slots[live] == 0).any() or \
                len(np.unique(used)) != len(used) or np.isin(used, free).any():
            refuse("keys hold slots the pool does not have, or another key's")
        owner = arrays["slot_i"][:, program.slots.ints[("key",)]]
        if (owner[slots[slots != 0]] != np.flatnonzero(slots)).any():
            refuse("slots name other keys than those holding them")
        candidates = arrays["rec_i"][segment_rows(slots[live] * cap, counts[live])]
    masks = candidates[:, program.records.ints[("mask",)]]
    if ((masks < 0) | (masks >= np.asarray(program.ftab).size)).any():  # ftab[mask]
        refuse("candidates are in states the query does not have")
    accepted = key_i[:, keys.ints[("last_ts",)]] != np.iinfo(np.int64).min  # (keys in use)
    codes = [key_i[accepted][:, string_columns(keys)].ravel(),
             candidates[:, string_columns(program.records)].ravel()]
    codes += [arrays[array] for array in string_logs if program.collect]
    if any(((c < -1) | (c >= nstrings)).any() for c in codes):
        refuse("string codes are not the dictionary's")
    if program.collect:  # (never with candidates in their keys' rows)
        _check_log(refuse, arrays, program, candidates, slots[live], counts[live], log_n)


def _check_log(refuse: Any, arrays: dict[str, npt.NDArray[Any]], program: Any,
               candidates: I64, slots: I64, counts: I64, log_n: int) -> None:
    """Collect: each entry links to an earlier one (or none: -1), and a winning candidate,
    which reads its count less one entries back from its slot's head, finds them all."""
    prev = arrays["log_prev"]
    if ((prev < -1) | (prev >= np.arange(log_n))).any():
        refuse("Collect log links forward or out of the log")
    heads = arrays["slot_i"][slots, program.slots.ints[layout.HEAD]]  # (slots in use)
    if ((heads < -1) | (heads >= log_n)).any():
        refuse("Collect log heads are out of the log")
    length = _chain_lengths(prev)
    head = np.repeat(heads, counts)
    reach = np.where(head >= 0, length[np.maximum(head, 0)] if log_n else 0, 0)
    wanted = candidates[:, program.records.ints[layout.COUNT]]
    if (wanted < 1).any() or (reach < wanted - 1).any():
        refuse("Collect log holds fewer rows than its candidates count")


def _chain_lengths(prev: I64) -> I64:
    """For each entry, how many entries its chain holds (itself, then prev[...] until -1):
    pointer jumping, one pass per doubling of the longest chain."""
    length = np.ones(len(prev), np.int64)
    jump = prev.copy()
    while (jump >= 0).any():
        on = np.flatnonzero(jump >= 0)
        length[on] += length[jump[on]]
        jump[on] = jump[jump[on]]
    return length


def string_columns(table: Any) -> I64:
    """Indexes of a state table's (`Program.records`, `.keys`, `.slots`) int columns that
    hold string codes."""
    return np.array([table.ints[key] for key, kind in table.kinds.items()
                     if kind == AttrType.STRING], np.int64)
