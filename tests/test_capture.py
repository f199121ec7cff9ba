"""engines.capture: recorded logit rows matched to the requests that asked for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_conformance.engines import capture


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _scored(rows: np.ndarray, tokens: list[int], top_k: int = 2) -> list[dict[int, float]]:
    """What vLLM returns for a request whose rows are `rows`: the raw logit of each
    scored token and of the row's top-k."""
    return [{int(t): float(rows[i, t]) for t in [token, *np.argsort(-rows[i])[:top_k]]}
            for i, token in enumerate(tokens)]


def test_rows_of_interleaved_requests_and_discarded_samples_are_assigned(rng):
    """Two requests' rows interleaved as a batch records them, with rows vLLM computes
    and discards (a partial prefill chunk's sample) in between."""
    a, b = rng.normal(size=(3, 16)).astype(np.float32), rng.normal(size=(2, 16)).astype(np.float32)
    discarded = rng.normal(size=(2, 16)).astype(np.float32)
    recorded = np.stack([discarded[0], a[0], b[0], a[1], discarded[1], b[1], a[2]])
    want = [_scored(a, [3, 1, 7]), _scored(b, [0, 15])]
    index = capture.assign_rows(recorded, want)
    np.testing.assert_array_equal(recorded[index[0]], a)
    np.testing.assert_array_equal(recorded[index[1]], b)


def test_identical_requests_get_identical_rows(rng):
    a = rng.normal(size=(2, 8)).astype(np.float32)
    recorded = np.concatenate([a, a])
    index = capture.assign_rows(recorded, [_scored(a, [1, 2]), _scored(a, [1, 2])])
    for rows in index:
        np.testing.assert_array_equal(recorded[rows], a)


def test_a_missing_row_is_an_error_not_a_misalignment(rng):
    a = rng.normal(size=(3, 8)).astype(np.float32)
    with pytest.raises(capture.CaptureError, match="request 0: 2 of 3 rows"):
        capture.assign_rows(a[:2], [_scored(a, [0, 1, 2])])
    # A value off by one float32 ulp is not the row vLLM scored.
    wrong = _scored(a, [0, 1, 2])
    wrong[2][2] = float(np.nextafter(np.float32(wrong[2][2]), np.float32(np.inf)))
    with pytest.raises(capture.CaptureError):
        capture.assign_rows(a, [wrong])


def test_a_shared_value_at_the_scored_token_does_not_misassign(rng):
    """Low-precision logits take few values: another request's row may hold the
    same value at this request's scored token. The top-k beside it tells them apart
    (seen with a degenerate fp16 GPTQ model: two of eight requests lost their rows)."""
    a, b = rng.normal(size=(1, 8)).astype(np.float32), rng.normal(size=(1, 8)).astype(np.float32)
    b[0, 3] = a[0, 3]  # b's row holds a's scored value at a's scored token
    index = capture.assign_rows(np.concatenate([b, a]), [_scored(a, [3]), _scored(b, [5])])
    assert index[0].tolist() == [1] and index[1].tolist() == [0]


class _Head(torch.nn.Module):
    """A stand-in for a vLLM model's logits computation (pure code: no engine involved)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return None if hidden is None else hidden.to(torch.bfloat16) * 2


def test_recorder_writes_float32_rows_in_slices_and_restores_the_method(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "ROWS_PER_WRITE", 3)
    head = _Head()
    recorder = capture.LogitsRecorder(head, tmp_path / "rows.f32")
    first, second = torch.randn(7, 5), torch.randn(2, 5)
    out = head.compute_logits(first)
    head.compute_logits(None)  # a rank whose logits went to another rank records nothing
    head.compute_logits(second)
    record = recorder.remove()
    assert record["rows"] == 9 and record["width"] == 5
    rows = capture.read_rows(record)
    np.testing.assert_array_equal(rows[:7], out.float().numpy())
    np.testing.assert_array_equal(rows[7:], (second.to(torch.bfloat16) * 2).float().numpy())
    assert "compute_logits" not in vars(head)


def test_gathered_rows_are_the_recorded_rows_cut_to_the_vocabulary(tmp_path, rng):
    rows = rng.normal(size=(6, 5)).astype(np.float32)
    rows.tofile(tmp_path / "rows.f32")
    record = {"path": str(tmp_path / "rows.f32"), "rows": 6, "width": 5}
    index = np.array([0, 2, 3, 4, 1])
    np.testing.assert_array_equal(capture.gather_rows(record, index, 4), rows[index, :4])
    np.testing.assert_array_equal(capture.read_rows(record), rows)
