"""A jitted MATCH_RECOGNIZE engine's runs as this version keeps them, from a snapshot that
kept them otherwise: rows as wide as records (before `RunRows`, `rows_of`), or counts per
state of a query this version keeps in the states layout (`states_of`). `p`: the engine's
RecognizeProgram; `name`: its query's, for the refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.kernels import recognize_runtime as rt


def rows_of(name: str, p: Any, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]
            ) -> dict[str, npt.NDArray[Any]]:
    """The runs layout's ph/pf as this version keeps them: a snapshot from before
    `RunRows` (no "rows") has rows as wide as records, with the columns where records
    have them; one with other places has its columns moved where it keeps every column
    this version's runs do (a run's start time without WITHIN, kept before 2026-11-30, is
    left out), and is refused where it does not."""
    rows = p.rows
    if "rows" in meta:
        if meta["rows"] == rows.describe():
            return arrays
        return _from_places(name, rows, meta["rows"], arrays)
    ph, pf = arrays.get("ph"), arrays.get("pf")
    if ph is None or pf is None or ph.ndim != 3 or pf.ndim != 3 or \
            ph.shape[2] != p.rec_ints or pf.shape[2] != p.rec_floats or \
            ph.shape[:2] != pf.shape[:2]:  # (not as wide as records, as it says)
        raise ValueError(f"query {name!r}: the snapshot's ph is not this query's "
                         "(another version of it?)")
    new_ph, new_pf = _moved(ph, pf, rows, *_wide(p))
    return dict(arrays, ph=new_ph, pf=new_pf)


def _from_places(name: str, rows: rt.RunRows, described: Any,
                 arrays: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    """ph/pf of a snapshot whose rows keep their columns at the places `described`, moved
    to `rows`' places; refused where it lacks one of this version's columns."""
    refusal = ValueError(f"query {name!r}: the snapshot's runs keep other columns than "
                         "this version's compiler gives them: restore it with the version "
                         "that took it, or replay the stream")
    if not isinstance(described, str):
        raise refusal
    try:
        ints, floats = rt.places_of(described)
    except ValueError:
        raise refusal from None
    ph, pf = arrays.get("ph"), arrays.get("pf")
    if ph is None or pf is None or not _holds(ph, pf, rows, ints, floats):
        raise refusal
    new_ph, new_pf = _moved(ph, pf, rows, ints, floats)
    return dict(arrays, ph=new_ph, pf=new_pf)


def _holds(ph: npt.NDArray[Any], pf: npt.NDArray[Any], rows: rt.RunRows,
           ints: dict[int, int], floats: dict[int, int], more_ints: tuple[int, ...] = ()
           ) -> bool:
    """Whether a snapshot's ph/pf (a key's rows each) reach every place it names, and it
    names every column of this version's runs and key rows (and `more_ints`)."""
    return ph.ndim == 3 and pf.ndim == 3 and ph.shape[:2] == pf.shape[:2] and \
        ph.shape[2] > max(ints.values(), default=-1) and \
        pf.shape[2] > max(floats.values(), default=-1) and \
        set(rows.run_ints + rows.key_ints + more_ints) <= set(ints) and \
        set(rows.run_floats + rows.key_floats) <= set(floats)


def _wide(p: Any) -> tuple[dict[int, int], dict[int, int]]:
    """The places of a snapshot's run rows as wide as records: each column where records
    have it."""
    return {c: c for c in range(p.rec_ints)}, {c: c for c in range(p.rec_floats)}


def _moved(ph: npt.NDArray[np.int64], pf: npt.NDArray[np.float64], rows: rt.RunRows,
           ints: dict[int, int], floats: dict[int, int]
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A snapshot's ph/pf, whose rows keep record column c at `ints[c]` (`floats[c]`),
    with the columns of this version's runs and key rows moved to `rows`' places."""
    width_i, width_f = rows.widths
    new_ph = np.zeros(ph.shape[:2] + (width_i,), np.int64)
    new_pf = np.zeros(pf.shape[:2] + (width_f,), np.float64)
    for new, old, run, key, places, olds in (
            (new_ph, ph, rows.run_ints, rows.key_ints, rows.ints, ints),
            (new_pf, pf, rows.run_floats, rows.key_floats, rows.floats, floats)):
        for column in run:  # rows 1.. of a key: its runs; row 0 the key's row
            new[:, 1:, places[column]] = old[:, 1:, olds[column]]
        for column in key:
            new[:, 0, places[column]] = old[:, 0, olds[column]]
    return new_ph, new_pf


def states_of(name: str, p: Any, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]
              ) -> dict[str, npt.NDArray[Any]]:
    """A runs layout's snapshot of a query this version keeps in the states layout:
    its ph/pf moved to this version's places, each run's counts (one partial match in
    one state) its state's number. Refused where a run stands for another number of
    partial matches (not a snapshot of this query)."""
    rows = p.rows
    try:
        ints, floats = rt.places_of(meta["rows"]) if "rows" in meta else _wide(p)
    except ValueError as e:
        raise ValueError(f"query {name!r}: the snapshot's runs: {e}") from None
    ph, pf, key_i = arrays.get("ph"), arrays.get("pf"), arrays.get("key_i")
    if ph is None or pf is None or key_i is None or \
            not _holds(ph, pf, rows, ints, floats, rows.counts) or key_i.ndim != 2 or \
            len(key_i) != len(ph) or key_i.shape[1] <= rt.K_NPART or \
            ph.shape[2] != max(ints.values(), default=-1) + 1 or \
            pf.shape[2] != max(floats.values(), default=0) + 1:  # (as wide as it names)
        raise ValueError(f"query {name!r}: the snapshot's ph is not this query's "
                         "(another version of it?)")
    new_ph, new_pf = _moved(ph, pf, rows, ints, floats)
    counts = np.stack([ph[:, 1:, ints[c]] for c in rows.counts], axis=2)
    live = np.arange(ph.shape[1] - 1)[None, :] < key_i[:, rt.K_NPART, None]
    one = (counts == 1).sum(axis=2) == 1
    if (counts[live] != 0).sum(axis=1).max(initial=1) != 1 or not one[live].all():
        raise ValueError(f"query {name!r}: the snapshot's runs stand for other numbers "
                         "of partial matches than one (not a snapshot of this query?)")
    # (rows past a key's runs: what the kernel left there, as it would have)
    new_ph[:, 1:, rows.ints[rows.counts[0]]] = \
        np.where(one, (counts == 1).argmax(axis=2) + 1, 0)
    key_i = key_i.copy()
    key_i[:, rt.K_BRANCHES:] = 0  # (the states layout counts no partial matches)
    return dict(arrays, ph=new_ph, pf=new_pf, key_i=key_i)
