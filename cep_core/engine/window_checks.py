"""What a WINDOW query's snapshot must hold before its arrays reach the kernel
(`cep_core.kernels.window_kernels`), which indexes them without bounds checks
(`check_state`): pane rows of the shapes its groups make, a group per key id the kernel may
look up, a list of active groups that the groups' flags agree with, exact sums whose digits
in use lie within their digits, string codes the dictionary has, and no results left
undrained. A snapshot is checksummed (`snapshot_format`), so these refuse a crafted one, or
one of a version that kept other numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cep_core.engine.state_checks import LIMIT, refuser
from cep_core.kernels import window_kernels as wk


def check_state(query: Any, meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]],
                nstrings: int) -> None:
    """ValueError (naming the query) where the snapshot could take the kernel out of its
    arrays. `query`: the engine's `_Query` (its plan, string accumulators and name);
    `nstrings` strings restored with it."""
    refuse = refuser(query.name)
    plan, st = query.plan, arrays.get("st")
    if st is None or st.shape != (wk.ST_SIZE,) or st.dtype.kind != "i":
        refuse("counters are not counters")
    groups, panes = int(st[wk.ST_NG]), plan.panes
    if not 0 <= groups * panes <= LIMIT:
        refuse("number of groups is out of range")
    if st[wk.ST_OUTN] != 0 or not 0 <= st[wk.ST_NACT] <= groups:
        refuse("counters are out of range")
    shapes = {"base": (groups * panes, wk.B_SIZE), "ist": (groups * panes, len(plan.int_accs)),
              "fst": (groups * panes, len(plan.float_accs)),
              "xst": (groups * panes, len(plan.exact_sums), wk.XSIZE),
              "lastpane": (groups,), "isact": (groups,), "active": (groups,)}
    for name, shape in shapes.items():
        if name not in arrays or arrays[name].shape != shape:
            refuse(f"{name} is not of this query's shape")
    keys, loc = meta.get("keys"), arrays.get("loc")
    if not isinstance(keys, list) or len(keys) != groups:
        refuse("group keys are not one per group")
    if loc is None or loc.ndim != 1 or len(loc) < 1 or len(loc) > LIMIT:
        refuse("key ids' groups are not a table")
    mapped = loc[loc >= 0]
    if (loc < -1).any() or (mapped >= groups).any() or len(np.unique(mapped)) != len(mapped):
        refuse("key ids map to groups the query does not have")
    isact, active = arrays["isact"], arrays["active"][:int(st[wk.ST_NACT])]
    flagged = np.flatnonzero(isact)
    if (isact > 1).any() or len(np.unique(active)) != len(active) or \
            not np.array_equal(np.sort(active), flagged):
        refuse("active groups are not the groups flagged active")
    xst = arrays["xst"]
    lo, hi = xst[:, :, wk.XLO], xst[:, :, wk.XHI]
    if ((lo < 0) | (lo > wk.XLIMBS) | (hi < -1) | (hi >= wk.XLIMBS)).any():
        refuse("exact sums use digits they do not have")
    if query.string_accs:
        codes = arrays["ist"][live_rows(arrays["base"], st, plan)][:, query.string_accs]
        if ((codes < 0) | (codes >= nstrings)).any():
            refuse("string codes are not the dictionary's")


def live_rows(base: npt.NDArray[np.int64], st: npt.NDArray[np.int64], plan: Any
          ) -> npt.NDArray[np.bool_]:
    """Which pane rows a window still to be released may read: those tagged with a pane at
    or after the first pane of the first such window."""
    tags = base[:, wk.B_TAG]
    live: npt.NDArray[np.bool_] = tags != wk.I64_MIN
    clock = int(st[wk.ST_R])
    if clock != wk.NEG_INF:
        live &= tags >= -(-clock // plan.slide) - plan.panes + 1
    return live
