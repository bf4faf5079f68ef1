"""`java.util.PriorityQueue` as JDK 17 implements it: a binary heap in an array whose
iteration order is the array's.

Flink keeps its partial and completed matches in such queues ordered by where each match
started; matches that started on the same row tie, and which of them leaves first, or is
met first when the queue is walked, follows from the heap's exact moves (sift up on add,
the last element sifted down from the root on poll, survivors compacted then heapified on
a bulk removal). The MATCH_RECOGNIZE reference interpreter replays those moves to give
Flink's answers where ties decide them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class JavaPriorityQueue(Generic[T]):
    def __init__(self, key: Callable[[T], int]):
        self.key = key
        self.items: list[T] = []

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[T]:  # the array's order, as Java's iterator
        return iter(list(self.items))

    def peek(self) -> T | None:
        return self.items[0] if self.items else None

    def element(self) -> T:  # the head of a queue that is not empty (IndexError if it is)
        return self.items[0]

    def add(self, item: T) -> None:
        self.items.append(item)
        self._sift_up(len(self.items) - 1, item)

    def add_all(self, items: Iterable[T]) -> None:
        for item in list(items):
            self.add(item)

    def poll(self) -> T:
        head, last = self.items[0], self.items.pop()
        if self.items:
            self._sift_down(0, last)
        return head

    def remove_if(self, doomed: Callable[[T], bool]) -> None:
        """JDK 17's bulkRemove: survivors keep their order, then the array is heapified."""
        survivors = [item for item in self.items if not doomed(item)]
        if len(survivors) == len(self.items):
            return
        self.items = survivors
        for i in range((len(survivors) >> 1) - 1, -1, -1):
            self._sift_down(i, survivors[i])

    def _sift_up(self, k: int, item: T) -> None:
        items, key = self.items, self.key(item)
        while k > 0:
            parent = (k - 1) >> 1
            if key >= self.key(items[parent]):
                break
            items[k] = items[parent]
            k = parent
        items[k] = item

    def _sift_down(self, k: int, item: T) -> None:
        items, key, n = self.items, self.key(item), len(self.items)
        while k < n >> 1:
            child = 2 * k + 1
            if child + 1 < n and self.key(items[child]) > self.key(items[child + 1]):
                child += 1
            if key <= self.key(items[child]):
                break
            items[k] = items[child]
            k = child
        items[k] = item
