"""The target: vLLM on the current platform, one engine per card per session.

The runner takes the full raw logit vector of every position: of the
free-running greedy output, and of the teacher-forced prompt positions when the
reference continuation is fed back as the prompt. Its workers record them as
arrays (engines.capture); vLLM, built with `logprobs_mode="raw_logits"`, returns
a few raw logits per position, by which the rows are matched to the requests.
After boot the runner holds the engine's evidence (engines.evidence): what vLLM
actually instantiated.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import psutil

from npu_conformance import patches, process, vllm_api
from npu_conformance.cards import Card
from npu_conformance.engines import capture, evidence, worker


# Every engine the suite starts, in process or as a server, sends no usage
# statistics: they win over the card's environment and the caller's.
NO_TELEMETRY = {"VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1"}


class EngineBootError(RuntimeError):
    """vLLM failed or timed out while starting; the message carries its log tail."""


class _LogTail(logging.Handler):
    def __init__(self, lines: int) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: collections.deque[str] = collections.deque(maxlen=lines)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self.records)


# How long a call may stay stuck past its deadline where SIGALRM's handler cannot
# run (C code that retries on EINTR, a wait inside a native collective) before
# the watchdog kills the engine's processes, which ends any wait on them.
WATCHDOG_GRACE_S = 10.0
# How long killed engine processes get to be reaped.
REAP_WAIT_S = 10.0
# The exit status of a run the watchdog ends: the call stayed stuck although the
# engine's processes were killed (or it has none: an in-process engine stuck in
# C code). Nothing but ending the process frees the thread, and a CI job that
# hangs until its global limit says less than this status and the message.
EXIT_STUCK = 86
# Where that message goes: the stderr this process had when this module was
# imported (pytest imports it with its plugin, before output capture starts).
# A capture later points fd 2 at a file that ending the process discards.
try:
    _STDERR = os.fdopen(os.dup(2), "w", closefd=True)
except OSError:
    _STDERR = sys.__stderr__


def descendants() -> set[psutil.Process]:
    """Every process this one started, and theirs."""
    return set(psutil.Process().children(recursive=True))


@contextlib.contextmanager
def deadline(seconds: float, what: str, processes: Callable[[], Iterable[psutil.Process]],
             grace_s: float = WATCHDOG_GRACE_S) -> Iterator[None]:
    """Raise TimeoutError after `seconds`, and kill `processes()` (the engine's):
    a hung boot or request must fail the run, not stall CI, and leave nothing
    running. SIGALRM raises in the main thread. Where the main thread is stuck
    and runs no handler, a watchdog thread kills the processes `grace_s` later,
    which ends any wait on them, and if the call is stuck `grace_s` after that
    (an in-process engine in C code), ends this process with EXIT_STUCK and
    every thread's traceback on stderr."""
    killed: list[int] = []
    reaped, left = threading.Event(), threading.Event()
    lock = threading.Lock()

    def reap() -> None:
        with lock:
            if reaped.is_set():
                return
            reaped.set()
            procs = list(processes())
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
                    killed.append(proc.pid)
            psutil.wait_procs(procs, timeout=REAP_WAIT_S)

    def watch() -> None:
        reap()
        if not left.wait(grace_s):
            with contextlib.suppress(Exception):  # the process ends whatever its output does
                _STDERR.write(f"\n{_stuck(what, seconds, grace_s, killed)}, and it is still stuck {grace_s:.0f} s "
                              f"later: ending this process (exit status {EXIT_STUCK}). Where its threads are:\n")
                _STDERR.flush()
                faulthandler.dump_traceback(_STDERR, all_threads=True)
            os._exit(EXIT_STUCK)

    watchdog = threading.Timer(seconds + grace_s, watch)
    watchdog.daemon = True
    main = threading.current_thread() is threading.main_thread()
    if main:
        def expire(signum: int, frame: object) -> None:
            raise TimeoutError(f"{what} did not finish within {seconds:.0f} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    watchdog.start()
    try:
        yield
    except BaseException as exc:
        if reaped.is_set():
            raise TimeoutError(_stuck(what, seconds, grace_s, killed)) from exc
        if isinstance(exc, TimeoutError):
            reap()
            raise TimeoutError(f"{exc}; killed its processes {killed}") from exc
        raise
    finally:
        left.set()
        watchdog.cancel()
        if main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    if reaped.is_set():
        raise TimeoutError(_stuck(what, seconds, grace_s, killed))


def _stuck(what: str, seconds: float, grace_s: float, killed: list[int]) -> str:
    return (f"{what} did not finish within {seconds:.0f} s and was stuck {grace_s:.0f} s more where no signal "
            f"handler runs; the watchdog killed its processes {killed}")


@dataclass(frozen=True)
class TargetResult:
    """One prompt's outputs of both target passes."""

    tokens: list[int]  # free-running greedy continuation
    greedy_logits: np.ndarray  # [N, V] raw logits that chose each greedy token (the decode path)
    forced_logits: np.ndarray  # [P + N - 1, V] teacher-forced over prompt and reference continuation
    cached_tokens: int = 0  # prefix-cache hits of the greedy request


class VllmRunner:
    """Owns one vLLM engine; use as a context manager, which frees it on exit."""

    def __init__(
        self,
        checkpoint: Path,
        dtype: str,
        trust_remote_code: bool,
        engine_args: Mapping[str, Any],
        env: Mapping[str, str],
        boot_timeout_s: float,
        request_timeout_s: float,
        fault: Mapping[str, Any] | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.kwargs = dict(
            model=str(checkpoint),
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            # The few log-probs per position that the runner asks for are then the
            # raw logits by which engines.capture matches the recorded rows.
            logprobs_mode="raw_logits",
            max_logprobs=-1,
            # Per-request metrics (TTFT, TPOT) for the perf tests; LLM turns them off by default.
            disable_log_stats=False,
            # Lets the runner ask every worker what it instantiated (engines.evidence)
            # and install a sensitivity card's fault (engines.faults).
            worker_extension_cls=worker.WORKER_EXTENSION,
            **engine_args,
        )
        self.env = {**env, **NO_TELEMETRY}
        self.fault = dict(fault) if fault else None
        self.boot_timeout_s = boot_timeout_s
        self.request_timeout_s = request_timeout_s
        self.llm = None
        self.load_time_s: float | None = None
        self.vocab_size = 0
        self.evidence: dict[str, Any] = {}
        self.cached_tokens: list[int] = []
        self.processes: set[psutil.Process] = set()
        self._log = _LogTail(200)
        self._stack = contextlib.ExitStack()

    @classmethod
    def for_card(cls, card: Card, checkpoint: Path, platform: str, boot_timeout_s: float, request_timeout_s: float,
                 env: Mapping[str, str] | None = None) -> "VllmRunner":
        """The engine `card` deploys on `platform`: its dtype, engine arguments,
        environment (`env` over it: a device placement's) and fault, if it has one."""
        return cls(checkpoint, dtype=card.dtype, trust_remote_code=card.trust_remote_code,
                   engine_args=card.engine_args(platform), env={**card.env(platform), **(env or {})},
                   boot_timeout_s=boot_timeout_s, request_timeout_s=request_timeout_s,
                   fault=card.fault.model_dump() if card.fault else None)

    def log_tail(self) -> str:
        return self._log.text()

    def __enter__(self) -> "VllmRunner":
        self._stack.enter_context(process.env_overrides(self.env))
        vllm_api.forget_environment()
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(self._log)
        self._stack.callback(vllm_logger.removeHandler, self._log)
        start = time.perf_counter()
        records, decisions = len(patches.applied()), len(patches.decisions())
        before = descendants()
        try:
            with deadline(self.boot_timeout_s, f"vLLM boot of {self.checkpoint}", lambda: descendants() - before):
                self.llm = vllm_api.llm(**self.kwargs)
                architecture = (self.llm.llm_engine.model_config.architectures or ["unknown"])[0]
                self.evidence = evidence.collect(self.llm, architecture, records, decisions)
                if self.fault:
                    self.evidence["fault"] = self.llm.collective_rpc("conformance_install_fault", args=(self.fault,))[0]
        except BaseException as exc:
            self._free()
            self._stack.close()
            raise EngineBootError(
                f"vLLM failed to boot {self.checkpoint} with {self.kwargs} "
                f"({type(exc).__name__}: {exc})\n--- engine log tail ---\n{self.log_tail()}"
            ) from exc
        # The engine's processes, which a hung request's watchdog ends.
        self.processes = descendants() - before
        self.load_time_s = time.perf_counter() - start
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._free()
        self._stack.close()

    def _free(self) -> None:
        if self.llm is not None:
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.llm = None
        vllm_api.cleanup_distributed()
        gc.collect()

    def fault_record(self) -> dict[str, Any] | None:
        """The installed fault (a sensitivity card's) with the steps and tokens it perturbed so far."""
        return self.llm.collective_rpc("conformance_fault_record")[0] if self.fault else None

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """Run token-id prompts through the engine under the request deadline."""
        with deadline(self.request_timeout_s, f"vLLM generate on {self.checkpoint}", lambda: self.processes):
            outputs = self.llm.generate([vllm_api.tokens_prompt(p) for p in prompts], params, use_tqdm=False)
        # Evidence of prefix-cache hits, per request of the last call.
        self.cached_tokens = [o.num_cached_tokens or 0 for o in outputs]
        return outputs

    def scored(self, prompts: list[list[int]], params: Any,
               scores: Callable[[list[int], Any], list[dict[int, float]]]) -> list[tuple[Any, np.ndarray]]:
        """Run `prompts` while the workers record every logit row (engines.capture):
        each output with its rows [n, V], which `scores(prompt, output)` names by
        the {token: raw logit} vLLM returned for each row."""
        with tempfile.TemporaryDirectory(prefix="conformance-logits-", dir=capture.RECORD_DIR) as folder:
            self.llm.collective_rpc("conformance_record", args=(folder,))
            try:
                outputs = self.generate(prompts, params)
            finally:
                records = self.llm.collective_rpc("conformance_recorded")
            record = next((r for r in records if r["rows"]), None)
            if record is None:
                raise capture.CaptureError(f"no worker of {self.checkpoint} recorded a logit row")
            wanted = [scores(p, o) for p, o in zip(prompts, outputs)]
            index = capture.assign_rows(capture.read_rows(record), wanted)
            found = [capture.gather_rows(record, i, self.vocab_size) for i in index]
        return list(zip(outputs, found))

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], np.ndarray]]:
        """Free-running greedy continuations with the raw logits that chose each token."""

        def scores(prompt: list[int], out: Any) -> list[dict[int, float]]:
            return [{t: p.logprob for t, p in position.items()} for position in out.outputs[0].logprobs]

        params = vllm_api.sampling_params(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                          logprobs=capture.SIGNATURE_TOP_K)
        return [(list(out.outputs[0].token_ids), logits) for out, logits in self.scored(prompts, params, scores)]

    def hidden_states(self, prompt_ids: list[int]) -> dict[str, np.ndarray]:
        """The hidden states at each tapped place (engines.taps) of one prefill of the prompt."""
        # A prefix-cache hit would skip the prompt's cached positions.
        self.llm.reset_prefix_cache()
        self.llm.collective_rpc("conformance_tap", args=(len(prompt_ids),))
        try:
            self.generate([prompt_ids], vllm_api.sampling_params(temperature=0.0, max_tokens=1))
        finally:
            tapped = self.llm.collective_rpc("conformance_tapped")[0]
        return tapped

    def teacher_forced(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """Raw logits at every position of each sequence fed as a prompt (one
        prefill): row j predicts sequence[j + 1], as the reference's rows do."""

        def scores(sequence: list[int], out: Any) -> list[dict[int, float]]:
            # prompt_logprobs[j] scores token j given tokens < j (None at 0).
            return [{t: p.logprob for t, p in position.items()} for position in out.prompt_logprobs[1:]]

        params = vllm_api.sampling_params(temperature=0.0, max_tokens=1, prompt_logprobs=capture.SIGNATURE_TOP_K)
        return [logits for _, logits in self.scored(sequences, params, scores)]
