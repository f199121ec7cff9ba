"""The suite's half inside vLLM's workers: a worker extension (engine arg
`worker_extension_cls`) whose methods the runner calls through
`LLM.collective_rpc`, in-process here and in each worker process on an NPU."""

from __future__ import annotations

import copy
from typing import Any, Mapping

from npu_conformance.engines import evidence, faults

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
