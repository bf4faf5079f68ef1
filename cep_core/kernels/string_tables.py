"""The per-code string tables that kernels read for what needs a string's text (ordering,
lower/upper, length): built by the engines from their `StringDictionary`, passed to the
generated kernels as the parameters `STRING_TABLE_PARAMS`."""

from __future__ import annotations

import numpy as np

from cep_core.batch import StringDictionary


def string_ranks(texts: list[str]) -> np.ndarray:
    """Per code, its string's place in sorted order (at least one entry)."""
    rank = np.zeros(max(len(texts), 1), dtype=np.int64)
    rank[sorted(range(len(texts)), key=texts.__getitem__)] = np.arange(len(texts))
    return rank


class StringTables:
    """Per-code tables kernels use for what needs a string's text.

    `rank[c]`: the string's place in sorted order (for <, <=, >, >=); `lower[c]` and
    `upper[c]`: codes of the lower/upper-cased string; `length[c]`: its length.
    Refreshed whenever the dictionary has grown or been compacted.
    """

    def __init__(self, strings: StringDictionary):
        self.strings = strings
        self.size = -1
        self.generation = -1
        self.refresh()

    def refresh(self) -> None:
        if self.size == len(self.strings) and self.generation == self.strings.generation:
            return
        # lower/upper may add strings to the dictionary, so close over it first.
        for s in list(self.strings.strings):
            self.strings.code(s.lower())
            self.strings.code(s.upper())
        texts = self.strings.strings
        self.rank = string_ranks(texts)
        self.lower = np.array([self.strings.codes[s.lower()] for s in texts] or [0], np.int64)
        self.upper = np.array([self.strings.codes[s.upper()] for s in texts] or [0], np.int64)
        self.length = np.array([len(s) for s in texts] or [0], dtype=np.int64)
        self.size = len(texts)
        self.generation = self.strings.generation

    @classmethod
    def current(cls, tables: StringTables | None, strings: StringDictionary) -> StringTables:
        """`tables` (made for `strings` the first time) brought up to date with them."""
        if tables is None:
            return cls(strings)
        tables.refresh()
        return tables

    def arrays(self) -> tuple[np.ndarray, ...]:
        """In the order of the kernels' parameters `s_rank, s_lower, s_upper, s_length`."""
        return (self.rank, self.lower, self.upper, self.length)


STRING_TABLE_PARAMS = "s_rank, s_lower, s_upper, s_length"
