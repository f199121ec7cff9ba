"""One measurement: the suite's rounds, each after a calibration run, timed by
pytest-benchmark or the clock, with the rounds that waited for a CPU left out;
and the tok/s, latency and contention figures read from them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from npu_conformance import baselines, contention
from npu_conformance.engines.target import VllmRunner
from npu_conformance.host_load import SwitchingLoad
from npu_conformance.perf.calibration import Calibration
from npu_conformance.perf.workload import exact_length_params, fresh_prompts


def request_latencies(rounds: Iterable[list[Any]]) -> tuple[list[float], list[float]] | None:
    """TTFT and TPOT in seconds of every request, from vLLM's request metrics;
    None when the engine keeps none (built with disable_log_stats=True)."""
    ttft, tpot = [], []
    for outputs in rounds:
        for out in outputs:
            m = out.metrics
            if m is None or not hasattr(m, "first_token_latency"):
                return None
            ttft.append(m.first_token_latency)
            # Engine-core timestamps of the first and last token: decode time only.
            if m.num_generation_tokens > 1:
                tpot.append((m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1))
    return ttft, tpot


def load_figures(load: SwitchingLoad | None, windows: Sequence[tuple[float, float]]) -> dict[str, Any] | None:
    """What the run's switching load (--perf-load) did during `windows`: its
    description and the share of the rounds' time it was on; None without one."""
    if load is None or not windows:
        return None
    total = sum(end - start for start, end in windows)
    on = sum(load.on_fraction(start, end) * (end - start) for start, end in windows)
    return {"load": load.describe(), "on_fraction": on / total}


def _ms(values: list[float], how: Callable[[list[float]], float]) -> float | None:
    return how(values) * 1e3 if values else None


def spread(values: Sequence[float]) -> float:
    """Half the interquartile range over the median: the within-run scatter of rounds."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / 2 / statistics.median(values)


@dataclass(frozen=True)
class Measurement:
    batch_size: int
    input_len: int
    output_len: int
    round_s: tuple[float, ...]  # timed rounds, as pytest-benchmark measured them
    lengths: frozenset[tuple[int, int]]  # (prompt tokens, generated tokens) seen
    latencies: tuple[list[float], list[float]] | None
    # The calibration's seconds run just before each round, and its tokens per run.
    calibration_s: tuple[float, ...] = ()
    calibration_tokens: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    # The wait share (contention.py) of each (calibration, round) pair kept, and of those left out.
    wait_shares: tuple[float | None, ...] = ()
    left_out: tuple[float, ...] = ()

    @classmethod
    def of(cls, batch_size: int, input_len: int, output_len: int, round_s: Iterable[float],
           rounds: list[list[Any]], calibration_s: Iterable[float] = (), calibration_tokens: int = 0,
           versions: dict[str, str] | None = None, wait_shares: Iterable[float | None] = (),
           left_out: Iterable[float] = ()) -> "Measurement":
        lengths = frozenset((len(o.prompt_token_ids), len(o.outputs[0].token_ids)) for r in rounds for o in r)
        return cls(batch_size, input_len, output_len, tuple(round_s), lengths, request_latencies(rounds),
                   tuple(calibration_s), calibration_tokens, dict(versions or {}), tuple(wait_shares),
                   tuple(left_out))

    def _tok_s(self, seconds: float, tokens_per_request: int | None = None) -> float:
        return self.batch_size * (tokens_per_request or self.output_len) / seconds

    @property
    def output_tok_s(self) -> float:
        """Generated tokens per second over the median round: the figure the gate
        reads. Single rounds of a small model scatter 10-20% on a shared 2-core
        host, so the card's rounds are many and their median is taken."""
        return self._tok_s(statistics.median(self.round_s))

    @property
    def output_tok_s_overall(self) -> float:
        """Generated tokens over the summed round times: how `vllm bench throughput`
        counts (its figure is over all requests, not per round)."""
        return self._tok_s(statistics.mean(self.round_s))

    @property
    def output_tok_s_best(self) -> float:
        return self._tok_s(min(self.round_s))

    @property
    def total_tok_s(self) -> float:
        """Prompt plus generated tokens per second, median round (vLLM's throughput
        benchmark's 'total')."""
        return self._tok_s(statistics.median(self.round_s), self.input_len + self.output_len)

    @property
    def calibration_tok_s(self) -> float | None:
        return self.calibration_tokens / statistics.median(self.calibration_s) if self.calibration_s else None

    @property
    def normalized_rounds(self) -> list[float]:
        """Each round's tok/s over the tok/s of the calibration run just before it."""
        return [self._tok_s(r) / (self.calibration_tokens / c) for r, c in zip(self.round_s, self.calibration_s)]

    @property
    def normalized(self) -> float | None:
        """Median over rounds of the round's tok/s over its calibration's tok/s."""
        return statistics.median(self.normalized_rounds) if self.calibration_s else None

    def contention_figures(self) -> dict[str, Any]:
        measured = [w for w in self.wait_shares if w is not None]
        return {"rounds_left_out": len(self.left_out), "left_out_wait_shares": list(self.left_out),
                "max_wait_share_kept": max(measured) if measured else None,
                "measured": bool(measured) or bool(self.left_out)}

    def as_run(self) -> baselines.Run:
        """This measurement as one recorded baseline run."""
        return baselines.Run(recorded_at=baselines.now(), rounds=len(self.round_s), tok_s=self.output_tok_s,
                             normalized=self.normalized, calibration_tok_s=self.calibration_tok_s)

    def figures(self) -> dict[str, Any]:
        ttft, tpot = self.latencies or ([], [])
        return {
            "batch_size": self.batch_size,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "rounds": len(self.round_s),
            "round_s": list(self.round_s),
            "round_spread": spread(self.round_s),
            "output_tok_s": self.output_tok_s,
            "output_tok_s_best": self.output_tok_s_best,
            "output_tok_s_overall": self.output_tok_s_overall,
            "total_tok_s": self.total_tok_s,
            "calibration_s": list(self.calibration_s),
            "calibration_tok_s": self.calibration_tok_s,
            "normalized": self.normalized,
            "contention": self.contention_figures(),
            "versions": self.versions,
            "ttft_ms_median": _ms(ttft, statistics.median),
            "ttft_ms_max": _ms(ttft, max),
            "tpot_ms_median": _ms(tpot, statistics.median),
            "tpot_ms_max": _ms(tpot, max),
            "latency_source": "vLLM RequestOutput.metrics" if self.latencies else
                              "unavailable: engine built with disable_log_stats=True",
        }


class HostBusy(Exception):
    """Too few rounds ran without waiting for a CPU to give a figure."""


@dataclass(frozen=True)
class ContentionLimit:
    """Which rounds the gate reads (data/perf.yaml `contention`): those whose wait
    share is at most `max_wait_share`, if they are at least `min_clean_share` of the rounds."""

    max_wait_share: float
    min_clean_share: float

    @classmethod
    def from_settings(cls) -> "ContentionLimit":
        return cls(**baselines.settings()["contention"])

    def clean(self, shares: Sequence[float | None]) -> list[bool]:
        return [w is None or w <= self.max_wait_share for w in shares]

    def check(self, shares: Sequence[float | None]) -> None:
        """HostBusy where too few of these rounds are clean."""
        kept = sum(self.clean(shares))
        if kept < self.min_clean_share * len(shares):
            waited = sorted(w for w in shares if w is not None)
            raise HostBusy(
                f"the host was busy: {len(shares) - kept} of {len(shares)} rounds waited for a CPU more than "
                f"{self.max_wait_share:g} s per s (wait shares {waited[0]:.2f}-{waited[-1]:.2f}, median "
                f"{statistics.median(waited):.2f}), and at least {self.min_clean_share:.0%} must not "
                f"(data/perf.yaml contention); no figure is read from a host shared this much")

    def describe(self) -> str:
        return (f"rounds that waited for a CPU more than {self.max_wait_share:g} s per s (run delay of this "
                f"process tree plus the host's steal time) are left out")


class Rounds:
    """The suite's round (fresh random prompts at exact lengths through the
    runner's generate), each preceded by a calibration run; timed by
    pytest-benchmark (`measure`) or by the clock (`time_rounds`). `windows` holds
    each (calibration, round) pair's start and end (time.monotonic), and
    `wait_shares` how long the process tree waited for a CPU meanwhile, so a
    round can be matched with what the host did. A measurement reads only the
    rounds that did not wait (ContentionLimit)."""

    def __init__(self, runner: VllmRunner, batch_size: int, input_len: int, output_len: int,
                 calibration: Calibration | None, limit: ContentionLimit | None = None) -> None:
        self.runner, self.batch_size, self.input_len, self.output_len = runner, batch_size, input_len, output_len
        self.calibration = calibration
        self.limit = limit or ContentionLimit.from_settings()
        self.params = exact_length_params(output_len)
        self.outputs: list[list[Any]] = []
        self.calibration_s: list[float] = []
        self.windows: list[tuple[float, float]] = []
        self.wait_shares: list[float | None] = []
        self._contention = contention.Contention()
        self._started = 0.0
        self._waited: float | None = None

    def setup(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self._started = time.monotonic()
        self._waited = self._contention.waited_s()
        if self.calibration is not None:
            self.calibration_s.append(self.calibration.run())
        return (fresh_prompts(self.runner.vocab_size, self.batch_size, self.input_len),), {}

    def one_round(self, prompts: list[list[int]]) -> None:
        self.outputs.append(self.runner.generate(prompts, self.params))
        end = time.monotonic()
        self.windows.append((self._started, end))
        self.wait_shares.append(contention.share(self._waited, self._contention.waited_s(), end - self._started))

    def result(self, round_s: Iterable[float], warmup_rounds: int, rounds: int,
               versions: dict[str, str]) -> Measurement:
        """The timed rounds' measurement, read from the clean ones (HostBusy where
        too few are). Warm-up rounds ran first; anything after the timed rounds
        (cProfile) is not timed."""
        indices = range(warmup_rounds, warmup_rounds + rounds)
        self.limit.check([self.wait_shares[i] for i in indices])
        return self.pick(indices, list(round_s), versions, clean_only=True)

    def pick(self, indices: Sequence[int], round_s: Sequence[float], versions: dict[str, str],
             clean_only: bool = False) -> Measurement:
        """The measurement of the rounds at `indices` (counted from the first round
        run, warm-up included), which took `round_s`; with `clean_only`, of those
        that did not wait for a CPU."""
        shares = [self.wait_shares[i] for i in indices]
        keep = self.limit.clean(shares) if clean_only else [True] * len(shares)
        kept = [i for i, k in zip(indices, keep) if k]
        calibration = self.calibration
        return Measurement.of(self.batch_size, self.input_len, self.output_len,
                              [t for t, k in zip(round_s, keep) if k], [self.outputs[i] for i in kept],
                              [self.calibration_s[i] for i in kept] if calibration else (),
                              calibration.tokens if calibration else 0, versions,
                              [self.wait_shares[i] for i in kept],
                              [w for w, k in zip(shares, keep) if not k and w is not None])


class Alternating:
    """Two kinds of rounds taken in turn, A, B, A, B, ..., each with a calibration
    run just before it: `switch(side)` (0 for A, 1 for B) prepares the engine for
    the side about to run. A load that comes and goes during the session falls on
    both sides alike, so the two compare without a baseline from another session."""

    def __init__(self, sides: tuple[Rounds, Rounds], switch: Callable[[int], None]) -> None:
        self.sides, self.switch = sides, switch
        self._side = 0

    def setup(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self.switch(self._side)
        return self.sides[self._side].setup()

    def one_round(self, prompts: list[list[int]]) -> None:
        self.sides[self._side].one_round(prompts)
        self._side ^= 1


def measure(benchmark: Any, rounds_of: Rounds, rounds: int, warmup_rounds: int,
            versions: dict[str, str]) -> Measurement:
    """Time `rounds` rounds (after `warmup_rounds`) with pytest-benchmark."""
    benchmark.pedantic(rounds_of.one_round, setup=rounds_of.setup, rounds=rounds, warmup_rounds=warmup_rounds,
                       iterations=1)
    return rounds_of.result(benchmark.stats.stats.data, warmup_rounds, rounds, versions)


def measure_alternating(benchmark: Any, alternating: Alternating, rounds: int, warmup_rounds: int,
                        versions: dict[str, str]) -> tuple[Measurement, Measurement]:
    """`rounds` rounds of each side, taken in turn after `warmup_rounds` of each,
    timed with pytest-benchmark: the two sides' measurements."""
    benchmark.pedantic(alternating.one_round, setup=alternating.setup, rounds=2 * rounds,
                       warmup_rounds=2 * warmup_rounds, iterations=1)
    data = benchmark.stats.stats.data
    a, b = (side.result(data[i::2], warmup_rounds, rounds, versions) for i, side in enumerate(alternating.sides))
    return a, b


def time_rounds(rounds_of: Rounds, rounds: int, warmup_rounds: int, versions: dict[str, str]) -> Measurement:
    """The same rounds timed by the clock (perf_counter, pytest-benchmark's default
    timer), where pytest-benchmark's one timing per test is taken."""
    times = []
    for i in range(warmup_rounds + rounds):
        args, _ = rounds_of.setup()
        start = time.perf_counter()
        rounds_of.one_round(*args)
        if i >= warmup_rounds:
            times.append(time.perf_counter() - start)
    return rounds_of.result(times, warmup_rounds, rounds, versions)
