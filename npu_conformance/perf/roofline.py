"""The memory-bandwidth roofline: the bytes of weights a decode step streams, the
device's bandwidth (measured, and published in data/bandwidth.yaml) and the
bandwidth-bound decode limit they give."""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from npu_conformance.platforms import Platform

# The suite's data folder, npu_conformance/data, one package up.
BANDWIDTH_FILE = Path(__file__).parent.parent / "data" / "bandwidth.yaml"


def decode_weight_bytes(checkpoint: Path, dtype: str, trust_remote_code: bool) -> int:
    """Bytes of weights one decode step streams: every parameter of the architecture
    in the serving dtype (dense: what a checkpoint dequantized at load reads),
    except the input embedding table, of which a step reads one row per sequence,
    unless it is tied to the output head. KV-cache reads are left out, and all MoE
    experts are counted, so the limit derived from it is a bound, not a forecast.

    Counted on the architecture instantiated on the meta device (nothing allocated),
    not on the engine's modules: vLLM's CPU backend repacks linear weights into
    kernel handles, leaving its parameters empty."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    numel = sum(p.numel() for p in model.parameters() if tied or p is not embedding)
    return numel * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def roofline_tok_s(weight_bytes: float, bandwidth_gb_s: float, batch_size: int) -> float:
    """Bandwidth-bound decode limit: each step streams the weights once and yields
    one token per sequence."""
    return batch_size * bandwidth_gb_s * 1e9 / weight_bytes


@functools.lru_cache(maxsize=1)
def load_bandwidths() -> dict[str, Any]:
    return yaml.safe_load(BANDWIDTH_FILE.read_text(encoding="utf-8"))


def published_bandwidth(device_name: str, devices: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first bandwidth.yaml entry whose `match` is found in `device_name`."""
    return next((d for d in devices if re.search(d["match"], device_name)), None)


def measure_bandwidth_gb_s(device: str, nbytes: int, repeats: int) -> float:
    """GB/s of a copy within `device` memory (bytes read + bytes written), best of `repeats`."""
    import torch

    sync = getattr(torch, device).synchronize
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults and lazy allocation are not bandwidth
    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best / 1e9


@dataclass(frozen=True)
class Bandwidth:
    measured_gb_s: float
    measure_method: str
    published_gb_s: float | None
    published: str | None  # the bandwidth.yaml entry's name and source

    @property
    def roofline_gb_s(self) -> float:
        # The published peak where the part is known: a copy never quite reaches it.
        return self.published_gb_s if self.published_gb_s is not None else self.measured_gb_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "roofline_gb_s": self.roofline_gb_s}


def device_bandwidth(platform: Platform) -> Bandwidth:
    settings = load_bandwidths()
    nbytes, repeats = settings["measure"]["bytes"], settings["measure"]["repeats"]
    measured = measure_bandwidth_gb_s(platform.name, nbytes, repeats)
    entry = published_bandwidth(platform.device_name, settings["devices"])
    return Bandwidth(
        measured_gb_s=measured,
        measure_method=f"torch copy of {nbytes >> 20} MiB on {platform.name}, best of {repeats}",
        published_gb_s=entry["bandwidth_gb_s"] if entry else None,
        published=f"{entry['name']}: {entry['source']}" if entry else None,
    )
