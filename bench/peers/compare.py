"""Match sets of two engines, compared: a match is the multiset of the input positions
(`seq`, 0-based) of its positive events, whatever variables they are bound to."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

Match = tuple[int, ...]


def composite_match(composite: dict) -> Match:
    """A composite event of `cep run` (JSON) as a match: the seqs of its bound events (a
    Kleene variable binds a list)."""
    seqs = []
    for bound in composite["events"].values():
        for event in bound if isinstance(bound, list) else [bound]:
            seqs.append(int(event["seq"]))
    return tuple(sorted(seqs))


def read_composites(path: Path) -> Counter[Match]:
    with open(path, "rb") as f:
        return Counter(composite_match(json.loads(line)) for line in f if line.strip())


def read_seq_lists(path: Path) -> Counter[Match]:
    """Matches written one JSON list of seqs per line (the peers' runners)."""
    with open(path) as f:
        return Counter(tuple(sorted(json.loads(line))) for line in f if line.strip())


def compare(ours: Counter[Match], theirs: Counter[Match], examples: int = 3) -> dict:
    """`equal`, the counts, and a few matches found by one side only (as lists of seqs)."""
    only_ours, only_theirs = ours - theirs, theirs - ours
    return {"equal": not only_ours and not only_theirs,
            "ours": sum(ours.values()), "theirs": sum(theirs.values()),
            "only_ours": sum(only_ours.values()), "only_theirs": sum(only_theirs.values()),
            "examples_only_ours": _first(only_ours, examples),
            "examples_only_theirs": _first(only_theirs, examples)}


def _first(matches: Counter[Match], n: int) -> list[list[int]]:
    return [list(m) for m in sorted(matches)[:n]]


def to_counter(matches: Iterable[Iterable[int]]) -> Counter[Match]:
    return Counter(tuple(sorted(m)) for m in matches)
