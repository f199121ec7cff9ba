"""The target's logits as arrays, not as per-entry Python objects.

vLLM returns logits only through its logprobs API, one `Logprob` object per
position per vocabulary entry: on a 32,000-entry vocabulary, 500 prompt
positions cost 849 s and 6.2 GB against 12.4 s for the prefill itself. So the
worker records every row its model's `compute_logits` produces, as float32, to
a file the runner names (`LogitsRecorder`, installed through the suite's worker
extension: in-process, and in each worker process of a multiprocess or TP
engine). The engine is asked for a few log-probs per row only (the scored token
and the top SIGNATURE_TOP_K), which in `raw_logits` mode are raw logits.
`assign_rows` then gives each request its rows by those figures, compared
exactly: it needs no knowledge of how vLLM orders its calls, batches
requests or chunks a prefill, and a row that vLLM computes and discards (the
sample of a partial prefill chunk) matches no request. A request left without
its rows is an error, never a silent misalignment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# Where the recordings go: shared memory where the host has it (Linux), so that
# the rows never wait on a disk (1.26 GB per 2,048-position prompt of a 152k
# vocabulary: through /tmp on this machine's disk a recording took 3.5x as long
# as vLLM's own pass over the logits once the page cache had to write back).
RECORD_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None

# Rows copied to host memory at a time: bounds the copy of one call's logits
# (a prefill chunk of thousands of positions x 150k entries) to this many rows.
ROWS_PER_WRITE = 256


class CaptureError(RuntimeError):
    """The recorded logits do not account for every row a request asked for."""


class LogitsRecorder:
    """Wraps one model's `compute_logits` (on the instance: the model runner calls
    it through any graph wrapper) and appends each call's rows, as float32, to
    `path`. A rank whose call returns None (logits gathered to another rank)
    records nothing."""

    def __init__(self, model: Any, path: Path) -> None:
        self.model = model
        self.path = Path(path)
        self.rows = 0
        self.width = 0
        self._file = open(self.path, "wb")
        self._original: Callable[..., Any] = model.compute_logits
        model.compute_logits = self._compute

    def _compute(self, *args: Any, **kwargs: Any) -> Any:
        logits = self._original(*args, **kwargs)
        if logits is not None:
            flat = logits.reshape(-1, logits.shape[-1])
            self.width = int(flat.shape[-1])
            for start in range(0, flat.shape[0], ROWS_PER_WRITE):
                flat[start:start + ROWS_PER_WRITE].detach().float().cpu().numpy().tofile(self._file)
            self.rows += int(flat.shape[0])
        return logits

    def remove(self) -> dict[str, Any]:
        """Restores the model's method; what was recorded: {path, rows, width}."""
        # The instance attribute shadowed the class's method: deleting it restores that.
        del self.model.compute_logits
        self._file.close()
        return {"path": str(self.path), "rows": self.rows, "width": self.width, "pid": os.getpid()}


def read_rows(record: dict[str, Any]) -> np.ndarray:
    """The recorded rows [rows, width], memory-mapped read-only (for matching:
    only the entries `assign_rows` looks at are read)."""
    if not record["rows"]:
        return np.zeros((0, 0), dtype=np.float32)
    return np.memmap(record["path"], dtype=np.float32, mode="r", shape=(record["rows"], record["width"]))


def gather_rows(record: dict[str, Any], index: np.ndarray, columns: int) -> np.ndarray:
    """Rows `index` of the recording, their first `columns` entries, as one array.
    Read from the file straight into that array, a bounded block of rows at a
    time, not through a memory map (whose pages would count against this process
    beside the copy) nor one read of the whole (a second copy as large)."""
    width = record["width"]
    out = np.empty((len(index), columns), dtype=np.float32)
    block = np.empty((ROWS_PER_WRITE, width), dtype=np.float32)
    with open(record["path"], "rb", buffering=0) as f:
        start = 0
        while start < len(index):
            # A run of consecutive rows, at most one block long: one seek, one read.
            end = start + 1
            while end < len(index) and end - start < ROWS_PER_WRITE and index[end] == index[end - 1] + 1:
                end += 1
            f.seek(int(index[start]) * width * 4)
            rows = block[:end - start]
            if f.readinto(memoryview(rows).cast("B")) != rows.nbytes:
                raise CaptureError(f"{record['path']} ends before row {int(index[end - 1])}")
            out[start:end] = rows[:, :columns]
            start = end
    return out


# Entries vLLM returns per row beside the scored token (its top-k): the row's
# signature. One entry alone is too weak in bf16 and fp16, whose logits take few
# distinct values: a degenerate model (a GPTQ zero-point bug) gave rows of two
# requests the same value at each other's tokens, and one was taken for the other.
SIGNATURE_TOP_K = 5

Row = Mapping[int, float]


def assign_rows(rows: np.ndarray, requests: Sequence[Sequence[Row]]) -> list[np.ndarray]:
    """Indices into `rows` of each request's rows, in order. A request is, for each
    of its rows, the {token: value} vLLM returned there (the scored token and its
    top-k): row i of a request is the next recorded row whose entries at those
    tokens equal those values, bit for bit (float32). Raises CaptureError where a
    request's rows are not all found."""
    wanted = [[(np.fromiter(row.keys(), dtype=np.int64, count=len(row)),
                np.fromiter(row.values(), dtype=np.float32, count=len(row))) for row in request]
              for request in requests]
    cursors = [0] * len(requests)
    found: list[list[int]] = [[] for _ in requests]
    open_requests = [r for r, request in enumerate(wanted) if request]
    for i in range(rows.shape[0]):
        if not open_requests:
            break
        row = rows[i]
        for r in open_requests:
            tokens, values = wanted[r][cursors[r]]
            if np.array_equal(row[tokens], values):
                found[r].append(i)
                cursors[r] += 1
                if cursors[r] == len(wanted[r]):
                    open_requests.remove(r)
                break
    if open_requests:
        short = ", ".join(f"request {r}: {cursors[r]} of {len(wanted[r])} rows" for r in open_requests)
        raise CaptureError(f"the recorded logits ({rows.shape[0]} rows) do not hold every row asked for ({short}): "
                           "vLLM computed these logits elsewhere than the model's compute_logits")
    return [np.asarray(f, dtype=np.int64) for f in found]
