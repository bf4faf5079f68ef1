"""`wait_progressing` and `flush_progressing` (services/stream/pipeline.py), the waits of
the fault suite: no fixed budget, a deadline that restarts whenever progress moves."""

from __future__ import annotations

import itertools
import time

import pytest

from cep_service.stream.pipeline import flush_progressing, wait_progressing


def test_waits_past_the_stall_time_while_progress_moves():
    ticks = itertools.count()
    start = time.monotonic()
    wait_progressing(lambda: time.monotonic() - start > 0.6, lambda: next(ticks), "moving",
                     stall_s=0.2, interval_s=0.01, progress_every_s=0.05)
    assert time.monotonic() - start > 0.6  # three times the stall time


def test_fails_once_progress_stops_for_the_stall_time():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no progress for 0 s waiting for stuck .*'same'"):
        wait_progressing(lambda: False, lambda: "same", "stuck", stall_s=0.2,
                         interval_s=0.01, progress_every_s=0.05)
    assert 0.2 <= time.monotonic() - start < 2


def test_stall_counts_from_the_last_change():
    values = iter([0, 1, 2] + [3] * 1000)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        wait_progressing(lambda: False, lambda: next(values), "stops", stall_s=0.2,
                         interval_s=0.01, progress_every_s=0.05)
    assert time.monotonic() - start >= 0.3  # two changes, then the stall


class Producer:
    def __init__(self, left: list[int]):
        self.left = left

    def flush(self, timeout: float) -> int:
        return self.left.pop(0) if len(self.left) > 1 else self.left[0]


def test_flush_goes_on_while_messages_are_acknowledged():
    moved = []
    flush_progressing(Producer([5, 4, 4, 1, 0]), stall_s=10, moved=lambda: moved.append(1))
    assert len(moved) == 3  # 5 -> 4, 4 -> 1, 1 -> 0


def test_flush_fails_when_nothing_is_acknowledged_for_the_stall_time():
    with pytest.raises(TimeoutError, match="3 records not acknowledged"):
        flush_progressing(Producer([3]), "records", stall_s=0.1)
