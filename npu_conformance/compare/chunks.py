"""Row-chunked computation in bounded memory: a figure of aligned [N, V] arrays,
chunk by chunk of rows on a few threads, whatever the vocabulary."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np


# Entries of one chunk of rows: every [rows, V] float64 temporary of a comparison
# stays near 8 MB, whatever the vocabulary (small enough for the allocator to
# reuse, where 32 MB ones were mapped and faulted in afresh each time) (a 2,048-position prompt of a 152k
# vocabulary is 2.5 GB per float64 array).
CHUNK_ENTRIES = 1 << 20


def _chunks(rows: int, vocab: int) -> list[slice]:
    step = max(1, CHUNK_ENTRIES // max(vocab, 1))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


# Chunks in flight at once: numpy's loops release the GIL, so threads share the
# host's cores (a comparison runs while the engine waits).
WORKERS = min(4, os.cpu_count() or 1)


def _each_chunk(fn, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`fn` of each chunk of rows of the aligned arrays, in order."""
    n, vocab = np.shape(arrays[0])
    chunks = _chunks(n, vocab)
    if len(chunks) == 1 or WORKERS == 1:
        return [fn(*(a[rows] for a in arrays)) for rows in chunks]
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda rows: fn(*(a[rows] for a in arrays)), chunks))


def by_rows(fn, *arrays: np.ndarray) -> np.ndarray:
    """`fn` of aligned [N, V] arrays, computed chunk by chunk of rows and
    concatenated: for any `fn` whose output row i depends only on row i."""
    return np.concatenate(_each_chunk(fn, arrays))


def median_of_entries(fn, *arrays: np.ndarray) -> float:
    """The exact median of every entry of `fn` over aligned [N, V] arrays
    (`fn` entry-wise), in bounded memory: a strided sample of each chunk brackets
    the median, then a second pass keeps only the entries inside the bracket."""
    n, vocab = np.shape(arrays[0])
    chunks = _chunks(n, vocab)
    if len(chunks) == 1:
        return float(np.median(fn(*arrays)))
    total = n * vocab
    stride = max(1, total // (1 << 20))
    # A copy of each chunk's sample: a strided view would keep the whole chunk alive.
    sample = np.sort(np.concatenate(_each_chunk(lambda *c: fn(*c).ravel()[::stride].copy(), arrays)))
    # The two middle ranks; the bracket holds them unless the sample is off by
    # far more than its sampling error (then the pass is repeated unbracketed).
    low, high = (total - 1) // 2, total // 2
    spread = 0.005 + 8 / np.sqrt(sample.size)
    for lo, hi in ((sample[int(sample.size * max(0.0, 0.5 - spread))],
                    sample[min(sample.size - 1, int(sample.size * min(1.0, 0.5 + spread)))]), (-np.inf, np.inf)):
        def split(*chunk: np.ndarray, lo: float = lo, hi: float = hi) -> tuple[int, np.ndarray]:
            values = fn(*chunk).ravel()
            return int((values < lo).sum()), values[(values >= lo) & (values <= hi)]

        parts = _each_chunk(split, arrays)
        below = sum(count for count, _ in parts)
        middle = np.sort(np.concatenate([inside for _, inside in parts]))
        if below <= low and high < below + middle.size:
            return float((middle[low - below] + middle[high - below]) / 2)
    return float("nan")  # NaN entries: neither pass brackets them, as np.median answers nan
