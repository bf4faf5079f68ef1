"""LoggedOrder takes logged steps again exactly as they were, whatever order and cuts the
consumer returns the messages in after a restart."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cep_service.stream.splitter_order import LoggedOrder, runs_of


class Message:
    def __init__(self, partition: int, offset: int):
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self):
        return None

    def __repr__(self) -> str:
        return f"{self._partition}@{self._offset}"


def consumption(rng: random.Random, counts: list[int], start: list[int]) -> list[Message]:
    """Messages of each partition in offset order, the partitions interleaved at random."""
    nexts = list(start)
    left = list(counts)
    out = []
    while any(left):
        p = rng.choice([p for p, n in enumerate(left) if n])
        for _ in range(min(left[p], rng.randint(1, 4))):
            out.append(Message(p, nexts[p]))
            nexts[p] += 1
            left[p] -= 1
    return out


def cut(rng: random.Random, messages: list) -> list[list]:
    out, at = [], 0
    while at < len(messages):
        size = rng.randint(1, 9)
        out.append(messages[at:at + size])
        at += size
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(0, 12), min_size=1, max_size=4),
       st.integers(0, 30))
def test_logged_steps_are_taken_again_as_they_were(seed, counts, logged_count):
    rng = random.Random(seed)
    start = [rng.randint(0, 5) for _ in counts]
    first_life = cut(rng, consumption(rng, counts, start))
    logged = first_life[:logged_count]
    order = LoggedOrder([runs_of(step) for step in logged])
    # after a restart: the same messages, interleaved and cut differently, more after them
    again = consumption(rng, [c + 3 for c in counts], start)
    taken = [step for batch in cut(rng, again) for step in order.steps(batch)]
    assert not order.holding
    as_offsets = [[(m.partition(), m.offset()) for m in step] for step in taken]
    assert as_offsets[:len(logged)] == [[(m.partition(), m.offset()) for m in step]
                                        for step in logged]
    everything = sorted(x for step in as_offsets for x in step)
    assert everything == sorted((m.partition(), m.offset()) for m in again)


def test_without_a_log_batches_pass_through():
    order = LoggedOrder()
    batch = [Message(0, 0), Message(1, 0), Message(0, 1)]
    assert order.steps(batch) == [batch]
    assert runs_of(batch) == [[0, 0, 0], [1, 0, 0], [0, 1, 1]]


def test_held_messages_wait_until_the_hold_is_lifted():
    """While the splitter puts its reorder buffer back, no step is taken: the messages
    are kept, and the logged steps come first once it may go on."""
    logged = [[[1, 0, 1]]]
    order = LoggedOrder(logged)
    assert order.steps([Message(1, 0), Message(1, 1), Message(0, 5)], hold=True) == []
    plain = LoggedOrder()
    assert plain.steps([Message(0, 0)], hold=True) == [] and plain.holding
    assert [[(m.partition(), m.offset()) for m in s] for s in plain.steps([])] == [[(0, 0)]]
    steps = order.steps([Message(0, 6)])
    assert [[(m.partition(), m.offset()) for m in s] for s in steps] == [
        [(1, 0), (1, 1)], [(0, 5), (0, 6)]]
    assert not order.holding
