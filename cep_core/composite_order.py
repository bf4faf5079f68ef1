"""The deterministic output order (`cep_core.composite.sort_key`) over CompositeBatches,
computed with `np.lexsort` over their columns: seq, the query's place in its file, the
constituent seqs, window_end, the key's JSON. Only `RowBatch`es (rows an engine built as
dicts) are read row by row. The sort is stable, as `sorted` is: composites equal in every
part keep the order of the batches."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import orjson

from cep_core.composite import constituent_seqs, sort_key
from cep_core.composite_batch import ColumnBatch, CompositeBatch

Int64s = npt.NDArray[np.int64]


def order(batches: list[CompositeBatch], query_index: dict[str, int]) -> Int64s:
    """Indices into the composites of `batches` (concatenated) in output order."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return np.zeros(0, np.int64)
    seq = np.concatenate([_seqs(b) for b in batches])
    index = np.concatenate([_query_indexes(b, query_index) for b in batches])
    first = np.lexsort((index, seq))
    if not _ties(seq[first], index[first]):
        return first
    constituents = [_constituents(b) for b in batches]
    width = max(m.shape[1] for m, _ in constituents)
    low = min((int(m[_present(m, n)].min()) for m, n in constituents if n.any()), default=0)
    if low == np.iinfo(np.int64).min:  # no smaller value can mark "no more seqs"
        return _python_order(batches, query_index)
    matrix = np.concatenate([_padded(m, n, width, low - 1) for m, n in constituents])
    window_end = np.concatenate([_window_ends(b) for b in batches])
    key_rank = _key_ranks(batches)
    columns = [key_rank, window_end] + [matrix[:, j] for j in range(width - 1, -1, -1)]
    return np.lexsort(columns + [index, seq])


def _ties(seq: Int64s, index: Int64s) -> bool:
    return bool(np.any((seq[1:] == seq[:-1]) & (index[1:] == index[:-1])))


def _seqs(batch: CompositeBatch) -> Int64s:
    if isinstance(batch, ColumnBatch):
        return np.asarray(batch.seq, np.int64)
    return np.array([row["seq"] for row in batch.to_dicts()], np.int64)


def _query_indexes(batch: CompositeBatch, query_index: dict[str, int]) -> Int64s:
    if isinstance(batch, ColumnBatch):
        return np.full(len(batch), query_index[batch.query], np.int64)
    return np.array([query_index[row["query"]] for row in batch.to_dicts()], np.int64)


def _window_ends(batch: CompositeBatch) -> Int64s:
    if isinstance(batch, ColumnBatch):
        return np.zeros(len(batch), np.int64)
    return np.array([row.get("window_end", 0) for row in batch.to_dicts()], np.int64)


def _constituents(batch: CompositeBatch) -> tuple[Int64s, Int64s]:
    """(matrix, lengths): row m holds the `lengths[m]` constituent seqs of composite m
    (the rest of the row is 0)."""
    if isinstance(batch, ColumnBatch):
        if batch.events is None:
            return (np.asarray(batch.start_seq, np.int64).reshape(-1, 1),
                    np.ones(len(batch), np.int64))
        events = batch.events
        counts = np.asarray(events.count, np.int64)
        matrix = np.zeros((len(batch), int(counts.max())), np.int64)
        owner = events.owner()
        place = np.arange(len(owner)) - np.repeat(events.start, counts)
        matrix[owner, place] = np.asarray(events.seq, np.int64)[events.element_order()]
        return matrix, counts
    lists = [constituent_seqs(row) for row in batch.to_dicts()]
    lengths = np.array([len(seqs) for seqs in lists], np.int64)
    matrix = np.zeros((len(lists), int(lengths.max())), np.int64)
    for m, seqs in enumerate(lists):
        matrix[m, :len(seqs)] = seqs
    return matrix, lengths


def _present(matrix: Int64s, lengths: Int64s) -> npt.NDArray[np.bool_]:
    return np.arange(matrix.shape[1]) < lengths[:, None]


def _padded(matrix: Int64s, lengths: Int64s, width: int, pad: int) -> Int64s:
    """The matrix `width` wide, every place past a row's length set to `pad`, below every
    seq: a list that is a prefix of another sorts first, as Python compares lists."""
    out = np.full((matrix.shape[0], width), pad, np.int64)
    out[:, :matrix.shape[1]] = np.where(_present(matrix, lengths), matrix, pad)
    return out


def _key_ranks(batches: list[CompositeBatch]) -> Int64s:
    """Each composite's key as the rank of its JSON bytes among all keys (bytes compare
    as orjson.dumps(key) values do in sort_key)."""
    distinct_per_batch, codes_per_batch = [], []
    codes: Int64s | list[int]
    for batch in batches:
        if isinstance(batch, ColumnBatch):
            ids, codes = np.unique(batch.keys.ids, return_inverse=True)
            texts = [orjson.dumps(k) for k in batch.keys.decode(ids)]
        else:
            texts, codes = _distinct([orjson.dumps(row.get("key")) for row in batch.to_dicts()])
        distinct_per_batch.append(texts)
        codes_per_batch.append(np.asarray(codes, np.int64).reshape(-1))
    ranks = {text: r for r, text in enumerate(sorted({t for ts in distinct_per_batch
                                                      for t in ts}))}
    return np.concatenate([np.array([ranks[t] for t in texts], np.int64)[codes]
                           for texts, codes in zip(distinct_per_batch, codes_per_batch)])


def _distinct(values: list[bytes]) -> tuple[list[bytes], list[int]]:
    seen: dict[bytes, int] = {}
    codes = [seen.setdefault(v, len(seen)) for v in values]
    return list(seen), codes


def _python_order(batches: list[CompositeBatch], query_index: dict[str, int]) -> Int64s:
    rows = [row for b in batches for row in b.to_dicts()]
    keys = [sort_key(row, query_index[row["query"]]) for row in rows]
    return np.array(sorted(range(len(rows)), key=keys.__getitem__), np.int64)

