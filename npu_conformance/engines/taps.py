"""Hidden states inside a decoder, captured by forward hooks: the same taps on a
transformers model and on vLLM's model (in its worker), so diagnosis can compare
them place by place.

Both stacks name the places of the Llama family alike (`model.embed_tokens`,
`model.layers.N.self_attn`, `.mlp`, `.input_layernorm`, `.post_attention_layernorm`,
`model.norm`); what differs is what a module returns, which `as_stream` evens out.
vLLM fuses q/k/v and gate/up into qkv_proj and gate_up_proj, so the taps stop at
the attention and MLP blocks, whose outputs both sides have.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

# Sub-places of one decoder layer in forward order ("" is the layer's output), each
# with what runs between the place before it and it: where a divergence first
# seen there arises.
SUBLAYERS = {
    "input_layernorm": "input_layernorm",
    "self_attn": "self_attn (q/k/v projections, RoPE, attention, o_proj)",
    "post_attention_layernorm": "the residual add after self_attn, or post_attention_layernorm",
    "mlp": "mlp (gate/up projections, activation, down projection)",
    "": "the residual add after mlp",
}
_LAYER = re.compile(r"^(?:.*\.)?layers\.(\d+)$")


def places(module_names: list[str]) -> list[str]:
    """The tapped module names in forward order: embedding, each layer's sub-places, final norm."""
    names = set(module_names)
    layers = sorted((int(m.group(1)), name) for name in module_names if (m := _LAYER.match(name)))
    order = [n for n in module_names if n.endswith("embed_tokens")][:1]
    for _, layer in layers:
        order += [f"{layer}.{sub}" if sub else layer for sub in SUBLAYERS if (f"{layer}.{sub}" if sub else layer) in names]
    order += [n for n in module_names if n.endswith("model.norm") or n == "norm"][:1]
    return order


def as_stream(output: Any, layer_output: bool) -> Any:
    """One tensor from what a module returned. vLLM's decoder layers return
    (hidden, residual) with the residual add deferred to the next norm: the
    residual stream is their sum. Everything else keeps its first element
    (transformers' attention returns (output, weights); vLLM's fused norms (normed, residual))."""
    if isinstance(output, tuple):
        if layer_output and len(output) == 2 and output[1] is not None and output[1].shape == output[0].shape:
            return output[0] + output[1]
        return output[0]
    return output


class Taps:
    """Forward hooks on a model's places that keep the first call with `tokens`
    rows (the prefill of the one prompt), as float32 arrays [tokens, hidden]."""

    def __init__(self, model: Any, tokens: int) -> None:
        modules = dict(model.named_modules())
        self.order = places(list(modules))
        self.tokens = tokens
        self.captured: dict[str, np.ndarray] = {}
        self.seen_rows: list[int] = []
        self._handles = [modules[name].register_forward_hook(self._hook(name)) for name in self.order]

    def _hook(self, name: str) -> Callable[..., None]:
        layer_output = _LAYER.match(name) is not None

        def hook(module: Any, args: Any, output: Any) -> None:
            if name in self.captured:
                return
            tensor = as_stream(output, layer_output)
            rows = tensor.reshape(-1, tensor.shape[-1])
            self.seen_rows.append(rows.shape[0])
            # Padded batches (graph capture sizes) put the real tokens first. A copy:
            # the next module may work in place (vLLM's fused residual add + norm).
            if rows.shape[0] >= self.tokens:
                self.captured[name] = rows[: self.tokens].detach().float().cpu().numpy().copy()

        return hook

    def remove(self) -> dict[str, np.ndarray]:
        for handle in self._handles:
            handle.remove()
        return {name: self.captured[name] for name in self.order if name in self.captured}
