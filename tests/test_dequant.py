"""Dequantization math of the load-time patches (patches/) against the quantizers
of npu_conformance/quantize.py, on small tensors: no engine.

The quantizers compute their fake-quantized reference in the quantizing direction
(code * scale, (code - zero) * scale) before packing; the dequantizers start from
the packed tensors. Exact equality between the two is the round-trip check.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from npu_conformance import quantize as quantizers
from npu_conformance.patches import CheckpointError, applied, fp8_block, gptq
from npu_conformance.patches.loader import dequantized

pytestmark = pytest.mark.unit

PREFIX = "model.layers.0.mlp.down_proj"


def weight(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed)) * 0.05


def expand(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Per-element block scale, by index arithmetic (not the dequantizer's expansion)."""
    rows = torch.arange(shape[0]) // block[0]
    cols = torch.arange(shape[1]) // block[1]
    return scale[rows[:, None], cols[None, :]]


# --- FP8 block -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(256, 256), (300, 200), (688, 256), (256, 688), (1, 129)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block", [(128, 128), (64, 32)], ids=lambda b: f"block{b[0]}x{b[1]}")
def test_fp8_round_trip(shape: tuple[int, int], block: tuple[int, int]) -> None:
    w = weight(*shape)
    q, scale_inv, fake = quantizers.fp8_block_tensor(w, block)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale_inv.dtype == torch.float32
    assert list(scale_inv.shape) == [math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])]

    assert torch.equal(fp8_block.dequantize(q, scale_inv, block, torch.float32, PREFIX), fake)
    # The model's dtype decides the output: one rounding of the float32 product.
    dense = fp8_block.dequantize(q, scale_inv, block, torch.bfloat16, PREFIX)
    assert dense.dtype == torch.bfloat16 and torch.equal(dense, fake.to(torch.bfloat16))

    # The quantizer itself: e4m3 keeps 3 mantissa bits (relative error <= 2^-4),
    # plus half the subnormal spacing 2^-9 near zero, both in units of the block scale.
    per_element = expand(scale_inv, block, w.shape)
    assert bool(((fake - w).abs() <= w.abs() * 2**-4 + per_element * 2**-10 + 1e-12).all())


def test_fp8_zero_block_dequantizes_to_zero() -> None:
    w = weight(256, 256)
    w[:128, :128] = 0
    q, scale_inv, fake = quantizers.fp8_block_tensor(w)
    assert bool((fake[:128, :128] == 0).all())
    assert torch.equal(fp8_block.dequantize(q, scale_inv, [128, 128], torch.float32), fake)


def test_fp8_scale_is_the_dequantization_multiplier() -> None:
    """weight_scale_inv = amax / 448 per block: the largest |weight| of a block is
    stored as the largest e4m3 value, so code * weight_scale_inv gives it back."""
    w = weight(128, 128)
    q, scale_inv, _ = quantizers.fp8_block_tensor(w)
    assert torch.allclose(scale_inv, w.abs().max().reshape(1, 1) / 448)
    assert q.float().abs().max() == 448


def test_fp8_inverted_scale_is_caught() -> None:
    w = weight(300, 200)
    q, scale_inv, fake = quantizers.fp8_block_tensor(w, bug="inverted_scale")
    dense = fp8_block.dequantize(q, scale_inv, [128, 128], torch.float32)
    assert (dense - fake).norm() / fake.norm() > 100


# --- GPTQ ----------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize(("shape", "group_size"), [((96, 384), 128), ((64, 320), 128), ((32, 256), -1)],
                         ids=["groups", "ragged-group", "one-group"])
def test_gptq_round_trip(bits: int, sym: bool, desc_act: bool, shape: tuple[int, int], group_size: int) -> None:
    out_features, in_features = shape
    w = weight(*shape)
    parts, fake = quantizers.gptq_tensor(w, bits, group_size, sym, desc_act)
    pack = 32 // bits
    groups = 1 if group_size == -1 else math.ceil(in_features / group_size)
    assert {k: (v.dtype, list(v.shape)) for k, v in parts.items()} == {
        "qweight": (torch.int32, [in_features // pack, out_features]),
        "qzeros": (torch.int32, [groups, out_features // pack]),
        "scales": (torch.float16, [groups, out_features]),
        "g_idx": (torch.int32, [in_features]),
    }
    in_order = torch.arange(in_features) // (in_features if group_size == -1 else group_size)
    if desc_act and groups > 1:
        assert not torch.equal(parts["g_idx"].long(), in_order)
        # Still groups of group_size channels (the last one ragged), only permuted.
        assert torch.equal(torch.bincount(parts["g_idx"].long()), torch.bincount(in_order))
    else:
        assert torch.equal(parts["g_idx"].long(), in_order)

    dense = gptq.dequantize(**parts, bits=bits, group_size=group_size)
    assert dense.dtype == torch.float16 and list(dense.shape) == [out_features, in_features]
    assert torch.equal(dense, fake.to(torch.float16))
    assert torch.equal(gptq.dequantize(**parts, bits=bits, group_size=group_size, dtype=torch.float32), fake)

    # The quantizer itself: round to nearest is within half a step, plus the fp16
    # rounding of the scale (2^-11 relative) over the grid's span from its zero
    # point; asym also rounds the zero point, and the grid's top may clip by half a step.
    step = parts["scales"].float()[parts["g_idx"].long()].t()
    maxq = 2**bits - 1
    bound = 0.5 + (maxq + 1) / 2 * 2**-11 if sym else 1 + maxq * 2**-11
    assert bool(((fake - w).abs() <= step * bound + 1e-9).all())


def test_gptq_packing_convention() -> None:
    """Hand-packed tensors, independent of the quantizer: codes lowest bits first
    along the input dim in qweight, along the output dim in qzeros, and the stored
    zero is zero - 1 (0x7 nibbles mean a zero point of 8)."""
    out_features, in_features = 8, 8
    qweight = torch.full((1, out_features), 0x76543210, dtype=torch.int32)  # input channel i holds code i
    qzeros = torch.tensor([[0x77777777]], dtype=torch.int32)
    scales = torch.arange(1, out_features + 1, dtype=torch.float16).reshape(1, -1)  # output o scales by o + 1
    g_idx = torch.zeros(in_features, dtype=torch.int32)
    dense = gptq.dequantize(qweight, qzeros, scales, g_idx, bits=4, group_size=128, dtype=torch.float32)
    expected = (torch.arange(in_features) - 8).float()[None, :] * torch.arange(1, out_features + 1).float()[:, None]
    assert torch.equal(dense, expected)
    # A nibble with its top bit set (code 15) must not be read as negative.
    top = torch.tensor([[-0x10000000]], dtype=torch.int32)  # 0xF0000000
    assert gptq.unpack(top, 4, 0).flatten().tolist() == [0, 0, 0, 0, 0, 0, 0, 15]


def test_gptq_zero_point_bug_is_caught() -> None:
    """Storing zero instead of zero - 1 shifts every weight by exactly one step."""
    w = weight(96, 384)
    parts, fake = quantizers.gptq_tensor(w, bug="zero_point")
    dense = gptq.dequantize(**parts, bits=4, group_size=128, dtype=torch.float32)
    step = parts["scales"].float()[parts["g_idx"].long()].t()
    assert torch.equal(dense, fake - step)


# --- checkpoints: which tensors, and the config entries ------------------------------


def state_dict() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": weight(64, 256, 1),
        "model.layers.0.input_layernorm.weight": torch.ones(256),
        "model.layers.0.self_attn.q_proj.weight": weight(256, 256, 2),
        "model.layers.0.self_attn.q_proj.bias": torch.zeros(256),
        f"{PREFIX}.weight": weight(256, 384, 3),
        "model.norm.weight": torch.ones(256),
        "lm_head.weight": weight(64, 256, 4),
    }


def test_fp8_checkpoint_layout() -> None:
    result = quantizers.quantize(state_dict(), {"method": "fp8_block"})
    assert result.quantization_config == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128]}
    quantized = {"model.layers.0.self_attn.q_proj", PREFIX}
    assert {n.removesuffix(".weight_scale_inv") for n in result.tensors if n.endswith("_scale_inv")} == quantized
    for name, tensor in result.tensors.items():
        expected = (torch.float8_e4m3fn if name.removesuffix(".weight") in quantized
                    else torch.float32 if name.endswith("_scale_inv") else torch.bfloat16)
        assert tensor.dtype == expected, name
    assert set(result.reference) == set(state_dict())
    assert all(t.dtype == torch.float32 for t in result.reference.values())


def test_gptq_checkpoint_layout() -> None:
    result = quantizers.quantize(state_dict(), {"method": "gptq", "bits": 8, "desc_act": True})
    config = result.quantization_config
    assert (config["quant_method"], config["bits"], config["group_size"], config["sym"], config["desc_act"]) == (
        "gptq", 8, 128, True, True)
    names = set(result.tensors)
    for prefix in ("model.layers.0.self_attn.q_proj", PREFIX):
        assert {f"{prefix}.{p}" for p in gptq.PARTS} <= names
        assert f"{prefix}.weight" not in names
    assert "model.layers.0.self_attn.q_proj.bias" in names
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert result.tensors[name].dtype == torch.float16


@pytest.mark.parametrize(("spec", "problem"), [
    ({"method": "awq"}, "quantize.method"),
    ({"method": "gptq", "group": 128}, "unknown quantize option 'group'"),
    ({"method": "gptq", "bug": "inverted_scale"}, "unknown gptq bug"),
    ({"method": "fp8_block", "bug": "zero_point"}, "unknown fp8_block bug"),
    ({"method": "gptq", "bits": 3}, "bits must be 2, 4 or 8"),
])
def test_bad_quantize_spec(spec: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        quantizers.quantize(state_dict(), spec)


# --- the checkpoint stream, as the loader patch sees it ------------------------------


def stream(tensors: dict[str, torch.Tensor], patch: object, quant_cfg: dict, dtype: torch.dtype = torch.float32
           ) -> dict[str, torch.Tensor]:
    return dict(dequantized(iter(tensors.items()), patch, quant_cfg, dtype, "test"))


@pytest.mark.parametrize("method", ["fp8_block", "gptq"])
def test_stream_yields_dense_weights_and_records(method: str) -> None:
    result = quantizers.quantize(state_dict(), {"method": method})
    patch = fp8_block if method == "fp8_block" else gptq
    before = len(applied())
    # Scales ahead of the weights: assembly must not depend on the file's order.
    out = stream(dict(reversed(list(result.tensors.items()))), patch, result.quantization_config)
    assert set(out) == set(state_dict())
    for name, tensor in out.items():
        assert torch.equal(tensor.float(), result.reference[name]), name
    records = applied()
    assert len(records) == before + 1
    parts = ("weight", "weight_scale_inv") if method == "fp8_block" else gptq.PARTS
    consumed = sum(result.tensors[f"{p}.{part}"].nbytes for p in ("model.layers.0.self_attn.q_proj", PREFIX)
                   for part in parts)
    assert records[-1] == {"patch": patch.NAME, "model": "test", "dtype": "float32", "tensors": 2,
                           "bytes_before": consumed, "bytes_after": (256 * 256 + 256 * 384) * 4}


def test_stream_missing_fp8_scale_names_the_tensor() -> None:
    result = quantizers.quantize(state_dict(), {"method": "fp8_block"})
    del result.tensors[f"{PREFIX}.weight_scale_inv"]
    with pytest.raises(CheckpointError, match=f"{PREFIX}.weight_scale_inv is missing"):
        stream(result.tensors, fp8_block, result.quantization_config)


def test_stream_wrong_fp8_scale_shape_names_the_tensor() -> None:
    result = quantizers.quantize(state_dict(), {"method": "fp8_block"})
    result.tensors[f"{PREFIX}.weight_scale_inv"] = torch.ones(2, 2)
    with pytest.raises(CheckpointError, match=rf"{PREFIX}.weight_scale_inv: expected .* shape \[2, 3\]"):
        stream(result.tensors, fp8_block, result.quantization_config)


def test_stream_fp8_scale_without_weight_names_the_tensor() -> None:
    result = quantizers.quantize(state_dict(), {"method": "fp8_block"})
    del result.tensors[f"{PREFIX}.weight"]
    with pytest.raises(CheckpointError, match=f"{PREFIX}.weight_scale_inv has no float8 {PREFIX}.weight"):
        stream(result.tensors, fp8_block, result.quantization_config)


@pytest.mark.parametrize("part", gptq.PARTS)
def test_stream_missing_gptq_tensor_names_it(part: str) -> None:
    result = quantizers.quantize(state_dict(), {"method": "gptq"})
    del result.tensors[f"{PREFIX}.{part}"]
    with pytest.raises(CheckpointError, match=f"{PREFIX}.{part} is missing"):
        stream(result.tensors, gptq, result.quantization_config)


@pytest.mark.parametrize(("part", "bad", "problem"), [
    ("scales", torch.ones(2, 256, dtype=torch.float16), r"expected a float tensor of shape \[3, 256\]"),
    ("qzeros", torch.zeros(3, 256, dtype=torch.int32), r"expected an int32 tensor of shape \[3, 32\]"),
    ("g_idx", torch.zeros(100, dtype=torch.int32), r"expected an integer tensor of shape \[384\]"),
    ("g_idx", torch.full((384,), 3, dtype=torch.int32), r"group indices must lie in \[0, 3\)"),
    ("qweight", torch.zeros(48, 256, dtype=torch.float16), "expected a 2-D int32 tensor"),
])
def test_stream_malformed_gptq_tensor_names_it(part: str, bad: torch.Tensor, problem: str) -> None:
    result = quantizers.quantize(state_dict(), {"method": "gptq"})
    result.tensors[f"{PREFIX}.{part}"] = bad
    with pytest.raises(CheckpointError, match=rf"{PREFIX}.{part}: {problem}"):
        stream(result.tensors, gptq, result.quantization_config)


def test_stream_duplicate_tensor_is_an_error() -> None:
    result = quantizers.quantize(state_dict(), {"method": "gptq"})
    items = list(result.tensors.items()) + [(f"{PREFIX}.scales", result.tensors[f"{PREFIX}.scales"])]
    with pytest.raises(CheckpointError, match=f"{PREFIX}.scales appears more than once"):
        list(dequantized(iter(items), gptq, result.quantization_config, torch.float32, "test"))


# --- cached checkpoints --------------------------------------------------------------


def test_quantized_checkpoint_is_built_once_per_spec(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    base = tmp_path / "base"
    base.mkdir()
    save_file(state_dict(), base / "model.safetensors")
    (base / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "dtype": "float32"}')
    (base / "tokenizer.json").write_text("{}")
    cache = tmp_path / "cache"

    target = quantizers.quantized_checkpoint(base, cache, {"method": "gptq"})
    assert quantizers.quantized_checkpoint(base, cache, {"method": "gptq", "bits": 4}) == target
    config = json.loads((target / "config.json").read_text())
    assert (config["quantization_config"]["quant_method"], config["dtype"]) == ("gptq", "float16")
    assert (target / "tokenizer.json").is_file()

    twin = quantizers.quantized_checkpoint(base, cache, {"method": "gptq", "fake": True})
    assert twin != target and "quantization_config" not in json.loads((twin / "config.json").read_text())
    reference = quantizers.quantize(state_dict(), {"method": "gptq"}).reference
    loaded = load_file(twin / "model.safetensors")
    assert all(torch.equal(loaded[n], t) for n, t in reference.items())

    assert quantizers.quantized_checkpoint(base, cache, {"method": "gptq", "bits": 8}) not in (target, twin)
    with pytest.raises(ValueError, match="quantize.fake must be true or false"):
        quantizers.quantized_checkpoint(base, cache, {"method": "gptq", "fake": "yes"})
