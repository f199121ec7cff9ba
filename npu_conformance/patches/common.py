"""What the patch modules share: the malformed-checkpoint error, the logger, the hook mark."""

from __future__ import annotations

import logging

# Under vLLM's logger namespace, so the lines go through vLLM's handlers and
# VLLM_LOGGING_LEVEL, and appear in an engine log tail collected from "vllm".
LOGGER = logging.getLogger("vllm.npu_conformance")
# Set on the functions the patches install, so a second register() sees them.
HOOK_MARK = "_npu_conformance_patch"


class CheckpointError(ValueError):
    """A quantized checkpoint tensor is missing or malformed; the message names it."""
