"""Host-speed calibration: a fixed workload timed before every round, so the
gate can tell a slower host from a slower engine path."""

from __future__ import annotations

import time
from pathlib import Path

from npu_conformance.perf.workload import synthetic_prompts


class Calibration:
    """A fixed workload that measures how fast the host runs right now (data/perf.yaml):
    greedy transformers generation of a small trained model on the platform's
    device, at exact lengths. Run before every timed round, so each round has a
    calibration from the same moment: the ratio of the two cancels the load of
    the moment and the speed of the host, not a slowdown of the engine's path."""

    def __init__(self, checkpoint: Path, device: str, batch_size: int, input_len: int, output_len: int,
                 warmup_rounds: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.checkpoint = checkpoint
        self.device = device
        self.tokens = batch_size * output_len
        self.output_len = output_len
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device).eval()
        ids = synthetic_prompts(self.model.config.vocab_size, batch_size, input_len, seed=0)
        self.ids = torch.tensor(ids, device=device)
        for _ in range(warmup_rounds):
            self.run()

    def run(self) -> float:
        """Seconds of one generate."""
        import torch

        sync = getattr(torch, self.device).synchronize if self.device != "cpu" else (lambda: None)
        with torch.inference_mode():
            start = time.perf_counter()
            self.model.generate(self.ids, max_new_tokens=self.output_len, min_new_tokens=self.output_len,
                                do_sample=False, pad_token_id=0)
            sync()
            return time.perf_counter() - start

    def describe(self) -> str:
        return (f"transformers greedy generate of {self.checkpoint.name} (float32, {self.device}), "
                f"{self.tokens} tokens, before every round")
