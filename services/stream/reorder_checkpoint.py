"""The splitter's reorder buffer across a restart: nothing it held is lost or repeated.

At a checkpoint the buffer's watermarks and counters are saved, and each waiting event by
where it came from: (source partition, offset, index within the message, arrival position).
The source offsets saved are where the oldest waiting event of each partition was read
(the *resume* offsets), beside the consumer's real position (the *replay-until* offsets).

After a restart the splitter reads again from the resume offsets. A message below its
partition's replay-until offset was consumed before the checkpoint: its events go back
into the buffer if they were waiting, with their old arrival positions, and are dropped
otherwise (they were released, sent late or dead-lettered before the checkpoint). From the
replay-until offsets on, consumption goes on as usual, so the events come out with the
same seqs as without the crash.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

from cep_core.batch import Batch
from cep_core.reorder import ReorderBuffer


def saved_state(reorder: ReorderBuffer, consumed: dict[str, int]) -> tuple[dict, dict]:
    """(resume offsets per partition, the JSON-able reorder state for the checkpoint)."""
    batch, keys = reorder.waiting()
    resume = dict(consumed)
    if batch is None or len(keys) == 0:
        rows = np.zeros((0, 4), np.int64)
    else:
        offsets = batch.columns["_offset"].astype(np.int64)
        rows = np.stack([keys, offsets, batch.columns["_index"].astype(np.int64),
                         batch.seq.astype(np.int64)], axis=1)
        for p in np.unique(keys).tolist():
            low = int(offsets[keys == p].min())
            resume[str(p)] = min(resume.get(str(p), low), low)
    packed = base64.b64encode(zlib.compress(rows.astype("<i8").tobytes())).decode()
    return resume, {**reorder.state(), "replay_until": consumed, "waiting": packed}


class Refill:
    """Puts back the events a checkpoint says were waiting, while the messages before the
    checkpoint are read again (see the module docstring)."""

    def __init__(self, reorder: ReorderBuffer, state: dict):
        reorder.restore(state)
        self.reorder = reorder
        self.until = {int(p): int(o) for p, o in state["replay_until"].items()}
        rows = np.frombuffer(zlib.decompress(base64.b64decode(state["waiting"])),
                             "<i8").reshape(-1, 4)
        self.positions = {(p, o, i): pos for p, o, i, pos in rows.tolist()}
        # partitions read again from before their replay-until offset
        self.replaying = {p for p, _, _ in self.positions}

    @property
    def done(self) -> bool:
        """Every partition read again is past its replay-until offset."""
        return not self.replaying

    def replayed(self, partition: int, offset: int) -> bool:
        """Was this message consumed before the checkpoint?"""
        return partition in self.replaying and offset < self.until[partition]

    def last_replayed(self, partition: int, offset: int) -> bool:
        return partition in self.replaying and offset == self.until[partition] - 1

    def put_back(self, batch: Batch, partition: int) -> None:
        """Of the events of re-read messages (`batch`: columns `_offset` and `_index`),
        those that were waiting go back into the buffer with their arrival positions."""
        if len(batch) == 0:
            return
        found = [self.positions.pop((partition, o, i), -1) for o, i in
                 zip(batch.columns["_offset"].tolist(), batch.columns["_index"].tolist())]
        positions = np.array(found, dtype=np.int64)
        keep = positions >= 0
        if keep.any():
            rows = np.flatnonzero(keep)
            self.reorder.refill(Batch(positions[rows], batch.ts[rows],
                                      {k: v[rows] for k, v in batch.columns.items()}),
                                np.full(len(rows), partition, np.int64))

    def passed(self, partition: int) -> None:
        """A message of `partition` at or after its replay-until offset arrived: every
        event of it that waited must have been found again (else the source lost records,
        which is not to be hidden)."""
        if partition not in self.replaying:
            return
        self.replaying.discard(partition)
        missing = sum(1 for p, _, _ in self.positions if p == partition)
        if missing:
            raise RuntimeError(f"{missing} events of source partition {partition} that waited "
                               "in the reorder buffer at the checkpoint were not found again")
