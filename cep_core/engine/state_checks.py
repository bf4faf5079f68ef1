"""What every jitted engine's snapshot check shares (`recognize_checks`, `match_checks`,
`seq_checks`, `window_checks`): the most rows of any one kind a snapshot may ask for, and
the refusal's words, what a number in its meta must be."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import numpy as np

LIMIT = 1 << 28  # the most rows of one kind (records, slots, groups, ...) a snapshot holds


def refuser(name: str) -> Callable[[str], NoReturn]:
    """`refuse(what)`: a ValueError naming query `name` and what of its snapshot is wrong."""
    def refuse(what: str) -> NoReturn:
        raise ValueError(f"query {name!r}: the snapshot's {what} (damaged, or not this "
                         "version's?)")
    return refuse


def whole(value: object) -> bool:
    """An int of the snapshot's meta (numpy's too), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
