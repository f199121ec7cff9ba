"""`vllm bench throughput` in its own process (npu_conformance.perf.bench): its command
line and the lines read back from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from npu_conformance.perf import bench as vllm_bench

pytestmark = pytest.mark.unit


def test_bench_output_parsed():
    text = "...\nThroughput: 35.48 requests/s, 3419.47 total tokens/s, 1135.24 output tokens/s\nTotal num ..."
    assert vllm_bench.bench_output_tok_s(text) == 1135.24
    with pytest.raises(ValueError, match="no 'Throughput"):
        vllm_bench.bench_output_tok_s("Traceback ...")


def test_bench_command_carries_the_cards_lengths_and_engine():
    from npu_conformance.cards import load_catalog

    card = load_catalog()["synthetic-llama"]
    spec = card.platform("cpu").perf
    cmd = vllm_bench.bench_command(Path("/ck"), card, "cpu", 4, spec, Path("/cal"), 10)
    assert cmd[1:6] == ["-m", vllm_bench.BENCH_MODULE, "--calibration", "/cal", "10"]
    text = " ".join(cmd)
    for part in (f"--random-input-len {spec.input_len}", f"--random-output-len {spec.output_len}",
                 f"--num-prompts {4 * spec.rounds}", "--max-num-seqs 4", "--enforce-eager", "--max-model-len 512"):
        assert part in text


def test_bench_wait_line_parsed() -> None:
    assert vllm_bench.WAIT_FIGURE.search(f"x\n{vllm_bench.WAIT_LINE} 0.042\n").group(1) == "0.042"
    assert vllm_bench.WAIT_FIGURE.search(f"{vllm_bench.WAIT_LINE} unmeasured").group(1) == "unmeasured"
