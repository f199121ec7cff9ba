"""The suite's half inside vLLM's workers: a worker extension (engine arg
`worker_extension_cls`) whose methods the runner calls through
`LLM.collective_rpc`, in-process here and in each worker process on an NPU."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from npu_conformance.engines import capture, delays, evidence, faults, taps

WORKER_EXTENSION = f"{__name__}.WorkerExtension"


class WorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker."""

    def conformance_evidence(self) -> dict[str, Any]:
        return evidence.inspect_model(self.get_model())

    def conformance_install_fault(self, fault: Mapping[str, Any]) -> dict[str, Any]:
        self._conformance_fault = faults.install(self.get_model(), fault, self.vllm_config.cache_config.block_size)
        return dict(self._conformance_fault)

    def conformance_fault_record(self) -> dict[str, Any] | None:
        """The installed fault and how many steps and tokens it has perturbed so far."""
        return copy.deepcopy(getattr(self, "_conformance_fault", None))

    def conformance_delay(self, phase: str, stretch: str) -> dict[str, Any]:
        """Stretch the steps of `phase` ("none": no phase) by `stretch` times their time (engines.delays);
        what ran since the last call. Strings: the server's /collective_rpc passes its arguments as strings."""
        delay = getattr(self, "_conformance_delay", None) or delays.PhaseDelay(self.get_model())
        self._conformance_delay = delay
        ran = delay.record()
        delay.set(None if phase == "none" else phase, float(stretch))
        return ran

    def conformance_tap(self, tokens: int) -> list[str]:
        """Hooks that keep the hidden states of the next prefill of `tokens` tokens (engines.taps)."""
        self._conformance_taps = taps.Taps(self.get_model(), tokens)
        return self._conformance_taps.order

    def conformance_tapped(self) -> dict[str, np.ndarray]:
        """What the hooks kept; removes them."""
        tapped, self._conformance_taps = self._conformance_taps, None
        return tapped.remove()

    def conformance_record(self, folder: str) -> None:
        """Record every logit row the model computes from now on to a file in `folder` (engines.capture)."""
        path = Path(folder) / f"logits-{uuid.uuid4().hex}.f32"
        self._conformance_recorder = capture.LogitsRecorder(self.get_model(), path)

    def conformance_recorded(self) -> dict[str, Any]:
        """What was recorded ({path, rows, width}); stops recording."""
        recorder, self._conformance_recorder = self._conformance_recorder, None
        return recorder.remove()
