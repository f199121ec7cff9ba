"""The CPU transformers reference: greedy continuation and full logits.

For each prompt the golden (fp32) reference greedily extends the prompt by
`max_tokens` tokens (EOS ignored, so both sides produce the same length), then
runs one forward pass over prompt + continuation and keeps the raw logits at
every position. A target that runs below fp32 also gets a noise-floor reference:
the same checkpoint in the target's dtype, teacher-forced over the golden's
sequence, so every figure can be measured on the same positions for the dtype's
own rounding. Results are cached on disk keyed by everything that determines them.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from npu_conformance import cache
from npu_conformance.cards import Prompt
from npu_conformance.cache import fingerprint
from npu_conformance.engines import taps


@dataclass(frozen=True)
class ReferenceResult:
    prompt_ids: list[int]
    tokens: list[int]  # greedy continuation
    logits: np.ndarray  # [len(prompt_ids) + len(tokens) - 1, V] float32; row j predicts token j + 1
    # The noise-floor reference's rows aligned with `logits` (transformers in the
    # target's dtype over the same sequence), or None where the target runs in fp32.
    noise: np.ndarray | None = None

    @property
    def generated_logits(self) -> np.ndarray:
        """Rows that predict the continuation: row i produced token i."""
        return self.logits[len(self.prompt_ids) - 1 :]

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.tokens


class ReferenceRunner:
    """transformers on CPU over one checkpoint; frees the model on exit."""

    def __init__(self, checkpoint: Path, dtype: str, trust_remote_code: bool) -> None:
        self.checkpoint = checkpoint
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        self.model = None

    def __enter__(self) -> "ReferenceRunner":
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            self.checkpoint,
            dtype=getattr(torch, self.dtype),
            trust_remote_code=self.trust_remote_code,
        ).eval()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.model = None
        gc.collect()

    def run(self, prompt_ids: list[int], max_tokens: int) -> ReferenceResult:
        import torch

        with torch.inference_mode():
            ids = torch.tensor([prompt_ids])
            out = self.model(input_ids=ids, use_cache=True)
            tokens: list[int] = []
            for _ in range(max_tokens):
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                out = self.model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        # One pass over the whole sequence, as the target's teacher-forced prefill sees it.
        return ReferenceResult(list(prompt_ids), tokens, self.teacher_forced(prompt_ids + tokens[:-1]))

    def teacher_forced(self, ids: list[int]) -> np.ndarray:
        """Raw logits of one forward pass over `ids`, float32 [len(ids), V]."""
        import torch

        with torch.inference_mode():
            return self.model(input_ids=torch.tensor([ids])).logits[0].float().numpy()

    def hidden_states(self, prompt_ids: list[int]) -> dict[str, np.ndarray]:
        """The hidden states at each tapped place (engines.taps) of one forward of the prompt."""
        import torch

        tapped = taps.Taps(self.model, len(prompt_ids))
        try:
            with torch.inference_mode():
                self.model(input_ids=torch.tensor([prompt_ids]))
        finally:
            found = tapped.remove()
        return found


def tokenize_prompts(checkpoint: Path, prompts: tuple[Prompt, ...], trust_remote_code: bool,
                     fill_tokens: int | None = None) -> dict[str, list[int]]:
    """Token ids per prompt id, with the checkpoint's own special-token rules (BOS).
    A prompt with a `length` is its text repeated and cut to that many tokens;
    `length: fill` takes `fill_tokens` (what the context leaves for the prompt)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    out = {}
    for p in prompts:
        ids = list(tokenizer.encode(p.text))
        if p.length is not None:
            n = fill_tokens if p.length == "fill" else p.length
            if n is None:
                raise ValueError(f"prompt {p.id!r} has length: fill, and the card sets no max_model_len to fill")
            # The repeats carry no BOS of their own: one sequence, as a long document is.
            body = list(tokenizer.encode(p.text, add_special_tokens=False)) or ids
            while len(ids) < n:
                ids += body
            ids = ids[:n]
        out[p.id] = ids
    return out


def _identity(checkpoint: Path, dtype: str, trust_remote_code: bool) -> list[object]:
    """Everything besides the token ids that decides a reference's results."""
    import torch
    import transformers

    return [
        fingerprint(checkpoint),
        dtype,
        trust_remote_code,
        torch.__version__,
        transformers.__version__,
        # A change in how the reference is computed must not reuse old results.
        cache.digest(inspect.getsource(sys.modules[__name__])),
    ]


def reference_results(
    checkpoint: Path,
    dtype: str,
    trust_remote_code: bool,
    prompts: dict[str, list[int]],
    max_tokens: int,
    cache_root: Path,
    noise_dtype: str | None = None,
) -> dict[str, ReferenceResult]:
    """Reference results per prompt id, from the disk cache where possible; with
    `noise_dtype` (a target below fp32), the noise-floor reference beside each."""
    identity = [*_identity(checkpoint, dtype, trust_remote_code), max_tokens]
    runner: ReferenceRunner | None = None
    results = {}
    try:
        for pid, ids in prompts.items():
            path = cache_root / "reference" / f"{cache.digest(identity, ids)[:32]}.npz"

            def compute() -> dict[str, np.ndarray]:
                nonlocal runner
                if runner is None:
                    runner = ReferenceRunner(checkpoint, dtype, trust_remote_code).__enter__()
                r = runner.run(ids, max_tokens)
                return {"prompt_ids": np.array(r.prompt_ids), "tokens": np.array(r.tokens), "logits": r.logits}

            path.parent.mkdir(parents=True, exist_ok=True)
            arrays = cache.cached_arrays(path, compute)
            results[pid] = ReferenceResult(arrays["prompt_ids"].tolist(), arrays["tokens"].tolist(), arrays["logits"])
    finally:
        if runner is not None:
            runner.__exit__(None, None, None)
    return results if noise_dtype is None else with_noise(checkpoint, noise_dtype, trust_remote_code, results,
                                                          cache_root)


def with_noise(
    checkpoint: Path,
    dtype: str,
    trust_remote_code: bool,
    golden: dict[str, ReferenceResult],
    cache_root: Path,
) -> dict[str, ReferenceResult]:
    """The golden results with the noise-floor reference beside them: `checkpoint`
    in `dtype` (the target's), teacher-forced over each golden sequence, one
    forward pass per prompt, from the disk cache where possible. The rounding is
    what every device does alike in that dtype (an H200's bf16 error was 1.00-1.03x
    the CPU's on the same positions: ../shared/notes/noise-floor-cross-device.md);
    torch's kernels for this host's ISA are part of the key all the same."""
    import torch

    identity = ["noise", *_identity(checkpoint, dtype, trust_remote_code), torch.backends.cpu.get_cpu_capability()]
    runner: ReferenceRunner | None = None
    results = {}
    try:
        for pid, gold in golden.items():
            ids = gold.full_ids[:-1]
            path = cache_root / "reference" / f"{cache.digest(identity, ids)[:32]}.npz"

            def compute() -> dict[str, np.ndarray]:
                nonlocal runner
                if runner is None:
                    runner = ReferenceRunner(checkpoint, dtype, trust_remote_code).__enter__()
                return {"logits": runner.teacher_forced(ids)}

            path.parent.mkdir(parents=True, exist_ok=True)
            results[pid] = dataclasses.replace(gold, noise=cache.cached_arrays(path, compute)["logits"])
    finally:
        if runner is not None:
            runner.__exit__(None, None, None)
    return results
