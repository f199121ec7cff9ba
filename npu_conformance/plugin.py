"""The suite's pytest plugin (registered as a pytest11 entry point, so it loads
wherever pytest starts): command-line options, the run's session object, card
parametrization and the session-wide fixtures (card, platform, report). The
engine, reference and server fixtures live in the repo's fixtures/ folder."""

from __future__ import annotations

import argparse
import collections
import json
import os
import traceback
from pathlib import Path
from typing import Any, NoReturn

import pytest

from npu_conformance import device_pool, golden, reports
from npu_conformance.cache import DEFAULT_ROOT
from npu_conformance.cards import (CATALOG_DIR, PROMPTS_DIR, VARIANT_MARK, Card, CardError, WeightSource, adhoc_card,
                                   load_catalog)
from npu_conformance.changes import ChangedCards, ChangesError, changed_cards
from npu_conformance.compare.precision import summary_line
from npu_conformance.baselines import BASELINES_DIR
from npu_conformance.perf import perf_batch_sizes, perf_cards
from npu_conformance.platforms import Platform, detect, expectation_error, force_isa
from npu_conformance.report import PrecisionReport


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "vLLM NPU conformance")
    group.addoption("--model", action="append", default=[], metavar="NAME",
                    help="card to run (repeatable; default: the cards marked default, i.e. the synthetic ones)")
    group.addoption("--model-path", type=Path, metavar="DIR",
                    help="run an ad-hoc local checkpoint with the default thresholds and prompts")
    group.addoption("--reference-path", type=Path, metavar="DIR",
                    help="build the reference from this checkpoint instead of the target's (quantized vs original), "
                         "or read it from the golden references --save-reference wrote there")
    group.addoption("--report-dir", type=Path, default=Path("results"), metavar="DIR",
                    help="where precision_report.json and the other reports go (default: results/)")
    group.addoption("--cache-dir", type=Path, metavar="DIR",
                    default=DEFAULT_ROOT,
                    help="synthetic checkpoints, downloads and reference results (env NPU_CONFORMANCE_CACHE)")
    group.addoption("--weights-dir", type=Path, metavar="DIR",
                    help="folder holding downloaded checkpoints as DIR/<org>--<name> or DIR/<name>")
    group.addoption("--offline", action="store_true", default=os.environ.get("NPU_CONFORMANCE_OFFLINE") == "1",
                    help="never contact a model hub (env NPU_CONFORMANCE_OFFLINE=1)")
    group.addoption("--boot-timeout", type=float, default=600.0, metavar="S",
                    help="seconds an engine may take to boot before the run fails it (default 600)")
    group.addoption("--request-timeout", type=float, default=600.0, metavar="S",
                    help="seconds one batched generate call may take (default 600)")
    group.addoption("--catalog", type=Path, default=CATALOG_DIR, metavar="DIR",
                    help="folder of model cards and their _defaults.yaml (default: the shipped catalog)")
    group.addoption("--diagnose", action="store_true",
                    help="diagnose every card's first prompt, passing cards too (a card that fails precision is "
                         "diagnosed anyway): the first layer and sublayer whose hidden states diverge")
    group.addoption("--changed-since", metavar="REF",
                    help="run the cards that the change since git REF touches (as a pull request's diff, plus "
                         "uncommitted files); with --model, only the named ones of those")
    group.addoption("--save-reference", type=Path, metavar="DIR",
                    help="write the selected cards' reference results as golden references into DIR/<card>, "
                         "for a later run's --reference-path DIR/<card>")
    group.addoption("--perf-record", action="store_true",
                    help="append each perf case's run to its card's baseline in --perf-baselines (run it in several "
                         "separate sessions: their spread is the gate's noise band), then commit the files")
    group.addoption("--perf-load", type=float, default=None, metavar="S",
                    help="run the perf tests under a CPU load switched on and off every S seconds (one process "
                         "spinning on one core), as a shared runner's neighbour comes and goes")
    group.addoption("--perf-baselines", type=Path, default=BASELINES_DIR, metavar="DIR",
                    help="where the cards' perf baselines are read and recorded, as DIR/<card>.json "
                         "(default: the shipped npu_conformance/data/perf_baselines)")
    group.addoption("--strict-gate", action=argparse.BooleanOptionalAction, default=None,
                    help="a selected card that produces no verdict fails, naming why (no weights, no device, memory "
                         "not freed, no kernel, no perf baseline) instead of skipping (default: on where the "
                         f"environment sets CI, else off; env {STRICT_ENV}=1/0 decides over CI)")
    group.addoption("--expect-platform", metavar="NAME",
                    help="fail at start unless vLLM's platform is NAME (npu, cpu, cuda) and comes from the plugin "
                         "npu_conformance/data/platforms.yaml names for it (vllm-ascend for npu)")
    group.addoption("--devices", metavar="LIST",
                    help="devices to split across xdist workers, as 0-7 or 0,2,4 (default: every device the "
                         "platform reports)")


STRICT_ENV = "NPU_CONFORMANCE_STRICT"


def strict_default(environ: dict[str, str]) -> bool:
    """Strict where the run is a gate: a CI job, unless NPU_CONFORMANCE_STRICT says otherwise."""
    if (value := environ.get(STRICT_ENV)) is not None:
        if value not in ("0", "1"):
            raise pytest.UsageError(f"{STRICT_ENV}={value!r}: 1 (strict) or 0 (skips stay skips)")
        return value == "1"
    return environ.get("CI", "").lower() not in ("", "0", "false")


PATH_OPTIONS = ("model_path", "reference_path", "report_dir", "cache_dir", "weights_dir", "catalog", "perf_baselines")


class ConformanceSession:
    """One per pytest run (as pytest-benchmark's BenchmarkSession): the catalog,
    the selected cards, the run's report and what each card's engine did."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        try:
            self.catalog = load_catalog(config.getoption("catalog"))
        except CardError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.changes: ChangedCards | None = None
        # --reference-path naming golden references (npu_conformance.golden), not a checkpoint.
        self.golden: Path | None = None
        self.selected = self._select()
        try:
            spec = config.getoption("devices")
            self.devices = device_pool.parse(spec) if spec else None
        except device_pool.DeviceError as exc:
            raise pytest.UsageError(str(exc)) from None
        strict = config.getoption("strict_gate")
        self.strict: bool = strict_default(dict(os.environ)) if strict is None else strict
        self.report = PrecisionReport()
        # Engine boots per card, and the cards whose engine is refused for the rest
        # of the run: card name -> ("fail", boot error) or ("skip", reason).
        self.boots: collections.Counter[str] = collections.Counter()
        self.engine_refusals: dict[str, tuple[str, str]] = {}
        self.report_path: Path | None = None
        self.rendered: list[Path] = []
        self.render_error: str | None = None

    def _select(self) -> dict[str, Card]:
        config = self.config
        names = config.getoption("model")
        unknown = [n for n in names if n not in self.catalog]
        if unknown:
            raise pytest.UsageError(f"unknown --model {unknown}; cards: {', '.join(sorted(self.catalog))}")
        selected = {n: self.catalog[n] for n in names}
        if since := config.getoption("changed_since"):
            # Intersection: --model narrows the changed cards (say, to those a runner can hold).
            try:
                self.changes = changed_cards(since, config.getoption("catalog"), PROMPTS_DIR)
            except ChangesError as exc:
                raise pytest.UsageError(str(exc)) from None
            selected = {n: self.catalog[n] for n in self.changes.cards if not names or n in names}
        if path := config.getoption("model_path"):
            try:
                adhoc = adhoc_card(path.resolve())
            except CardError as exc:
                raise pytest.UsageError(str(exc)) from None
            selected[adhoc.name] = adhoc
        # A change that touches no card runs none, not the defaults.
        if not selected and not since:
            selected = {n: c for n, c in self.catalog.items() if c.default}
        if (ref := config.getoption("reference_path")) and ref.is_dir() and golden.is_golden(ref):
            self.golden = ref.resolve()
            if config.getoption("save_reference"):
                raise pytest.UsageError(f"--reference-path={ref} holds golden references: nothing to save with "
                                        "--save-reference")
        elif ref:
            source = WeightSource("path", str(ref.resolve()))
            selected = {n: c.model_copy(update={"reference_weights": source}) for n, c in selected.items()}
        return selected

    def unavailable(self, card: Card, reason: str) -> NoReturn:
        """`card` cannot produce this verdict here: a skip that says why, or in
        strict mode, for a card the run selected, a failure (a gate that skips its
        cards gates nothing). The sensitivity cards a run picks itself skip."""
        if self.strict and card.base_name in self.selected:
            pytest.fail(f"strict gate: {reason} (a selected card must produce verdicts; run without "
                        f"--strict-gate, or with {STRICT_ENV}=0, to let it skip)", pytrace=False)
        pytest.skip(reason)

    def card(self, name: str) -> Card:
        """A card by name, or a variant of one (`<card>+<condition>`)."""
        base, _, condition = name.partition(VARIANT_MARK)
        card = {**self.catalog, **self.selected}[base]
        return card.variant(condition) if condition else card

    def placement(self, card: Card, platform: Platform) -> device_pool.Placement:
        """The devices `card`'s engine gets on this xdist worker (DeviceError if
        it cannot have them): a share of --devices, or of every device the
        platform reports."""
        pool = self.devices if self.devices is not None else list(range(platform.device_count))
        if unknown := [d for d in pool if d >= platform.device_count]:
            raise device_pool.DeviceError(f"--devices names {unknown}, and platform {platform.name} reports "
                                      f"{platform.device_count} devices")
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        share = device_pool.split(pool, workers)[device_pool.worker_index(os.environ.get("PYTEST_XDIST_WORKER"))]
        return device_pool.place(share, device_pool.needed(card.engine_args(platform.name)), platform.visible_devices_env)

    def cards_for(self, definition: pytest.Function) -> list[Card]:
        """The cards a test runs on: known-buggy ones for sensitivity tests (all of
        them unless cards were named), the selected passing ones otherwise."""
        if definition.get_closest_marker("sensitivity"):
            explicit = self.config.getoption("model") or self.config.getoption("model_path")
            pool = self.selected if explicit else self.catalog
            cards = [c for c in pool.values() if c.expect.verdict == "fail"]
        else:
            cards = [c for c in self.selected.values() if c.expect.verdict == "pass"]
        serving, scored = (definition.get_closest_marker(m) for m in ("serving", "accuracy"))
        cards = [c for c in cards if (c.serve.run or not serving) and (c.gates_accuracy or not scored)]
        return cards

    def finish(self) -> None:
        """Write precision_report.json and render the reports; runs after
        pytest-benchmark has written --benchmark-json and after the session
        fixtures' teardown has written perf_report.json."""
        report_dir = self.config.getoption("report_dir")
        if hasattr(self.config, "workeroutput"):
            # An xdist worker hands its cards to the controller, which writes one report of all.
            self.config.workeroutput[WORKER_REPORT] = json.dumps(self.report.models)
            return
        # Written whenever a model was seen: a serving-only run's verdicts live there too.
        if self.report.models:
            self.report_path = self.report.write(report_dir, detect())
        # Only a run that booted engines renders: a unit-only run must not re-render
        # an earlier run's files in the same directory.
        if self.report_path is not None:
            try:
                self.rendered = reports.render(report_dir, benchmark_json=self.config.getoption("benchmark_json", None))
            except Exception:  # noqa: BLE001 - a rendering bug must not hide the test results
                self.render_error = traceback.format_exc()

    def summary(self, terminalreporter: Any) -> None:
        if self.report.ran_precision():
            terminalreporter.section("precision conformance")
            for name, entry in self.report.models.items():
                if entry["prompts"]:
                    terminalreporter.line(summary_line(name, entry["prompts"]))
                for error in entry["errors"]:
                    terminalreporter.line(f"ERROR {name}: {error.splitlines()[0]}")
            terminalreporter.line(f"report: {self.report_path}")
        if self.render_error:
            terminalreporter.section("report rendering FAILED", red=True)
            terminalreporter.line(self.render_error, red=True)
            terminalreporter.line("the JSON reports are intact; retry with: python -m npu_conformance.reports "
                                  f"{self.config.getoption('report_dir')}")
        for path in self.rendered:
            terminalreporter.line(f"rendered: {path}")


# The key under which an xdist worker sends the controller its part of the report.
WORKER_REPORT = "npu_conformance_report"
SESSION = pytest.StashKey[ConformanceSession]()
PHASES = pytest.StashKey[dict[str, pytest.TestReport]]()


def session_of(config: pytest.Config) -> ConformanceSession:
    return config.stash[SESSION]


def phase_report(item: pytest.Item, when: str) -> pytest.TestReport | None:
    """The report of `item`'s setup, call or teardown phase, once that phase ran."""
    return item.stash.get(PHASES, {}).get(when)


def pytest_configure(config: pytest.Config) -> None:
    # pytest picks its root directory from every argument that names an existing
    # path, option values included: `--model-path DIR` would make DIR the root,
    # so the suite's tests and markers would not be found.
    for name in PATH_OPTIONS:
        value = config.getoption(name)
        if value is not None and Path(value).expanduser().resolve() == config.rootpath:
            flag = "--" + name.replace("_", "-")
            raise pytest.UsageError(f"write {flag}={value} (with '='): given as '{flag} {value}', pytest takes {value} for its root directory")
    try:
        # Before anything loads vLLM's kernels (platforms.FORCE_ISA_ENV).
        force_isa()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if (expected := config.getoption("expect_platform")) and (problem := expectation_error(detect(), expected)):
        raise pytest.UsageError(problem)
    config.stash[SESSION] = ConformanceSession(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n` (xdist's load modes), a card's tests and its variants' go to
    one worker, so its engine boots once per run: xdist's scope scheduling, with
    the card as the scope (the test ids carry the card's name)."""
    if config.getoption("dist", "no") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    names = sorted({*session_of(config).catalog, *session_of(config).selected}, key=len, reverse=True)

    class CardScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return card_of_test(nodeid, names) or nodeid

    return CardScheduling(config, log)


def card_of_test(nodeid: str, names: list[str]) -> str | None:
    """The card (its base name for a variant) a test id is parametrized by,
    given the card names longest first; None for a test without a card."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    param = nodeid[nodeid.index("[") + 1:-1]
    for name in names:
        if param == name or param.startswith((f"{name}-", f"{name}{VARIANT_MARK}")):
            return name
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: merge a finished worker's report into the run's."""
    part = getattr(node, "workeroutput", {}).get(WORKER_REPORT)
    if part is not None:
        session_of(node.config).report.merge(json.loads(part))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize by card (session scope, so pytest groups a card's tests and
    boots its engine once) and, where asked, by the card's prompts or by its perf
    batch sizes (those of every platform: no platform detection at collection)."""
    if "card" not in metafunc.fixturenames:
        return
    cards = session_of(metafunc.config).cards_for(metafunc.definition)
    # The second parameter's value carries the card's name: pytest groups a
    # session's tests by parameter value, and a bare prompt id or batch size shared
    # by two cards would interleave their tests and boot each engine again.
    if "prompt_case" in metafunc.fixturenames:
        pairs = [(c.name, (c.name, p.id)) for c in cards for p in c.prompts]
        metafunc.parametrize(["card", "prompt_case"], pairs, indirect=["card"], scope="session",
                             ids=[f"{c}-{p}" for c, (_, p) in pairs])
    elif "condition_case" in metafunc.fixturenames:
        # A condition with engine arguments runs on a variant card with an engine of its own.
        triples = [(c.variant(k).name if c.conditions[k].engine else c.name, (c.name, k, p.id))
                   for c in cards for k in c.run_conditions() for p in c.prompts]
        metafunc.parametrize(["card", "condition_case"], triples, indirect=["card"], scope="session",
                             ids=[f"{c}-{k}-{p}" for c, (_, k, p) in triples])
    elif "perf_case" in metafunc.fixturenames:
        # Each engine mode the card measures (its graph-mode variant has an engine of its own).
        pairs = [(v.name, (v.name, b)) for c in cards for v in perf_cards(c) for b in perf_batch_sizes(c)]
        metafunc.parametrize(["card", "perf_case"], pairs, indirect=["card"], scope="session",
                             ids=[f"{c}-bs{b}" if b else c for c, (_, b) in pairs])
    elif case := next((f for f in ("slowdown_case", "latency_case") if f in metafunc.fixturenames), None):
        kinds = ("control", "slowed") if case == "slowdown_case" else ("control", "decode", "prefill")
        pairs = [(c.name, (c.name, k)) for c in cards if case == "slowdown_case" or c.gates_latency for k in kinds]
        metafunc.parametrize(["card", case], pairs, indirect=["card"], scope="session",
                             ids=[f"{c}-{k}" for c, (_, k) in pairs])
    else:
        metafunc.parametrize("card", [c.name for c in cards], indirect=True, scope="session")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report in the item's stash, so a fixture's teardown can
    record the verdict of the test it served (see phase_report)."""
    rep = yield
    item.stash.setdefault(PHASES, {})[rep.when] = rep
    return rep


def pytest_sessionfinish(session: pytest.Session) -> None:
    if SESSION in session.config.stash:
        session_of(session.config).finish()


def pytest_report_header(config: pytest.Config) -> list[str]:
    if SESSION not in config.stash:
        return []
    session = session_of(config)
    lines = [f"strict gate: {'on (a selected card that cannot run fails)' if session.strict else 'off (skips stay skips)'}"]
    if session.changes is not None:
        lines += [*session.changes.describe(), f"selected: {', '.join(session.selected) or 'no card'}"]
    if period := config.getoption("perf_load"):
        lines.append(f"perf load: a process spinning on one core, switched on and off every {period:g} s")
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if SESSION in config.stash:
        session_of(config).summary(terminalreporter)


@pytest.fixture(scope="session")
def conformance(pytestconfig: pytest.Config) -> ConformanceSession:
    return session_of(pytestconfig)


@pytest.fixture(scope="session")
def platform() -> Platform:
    return detect()


@pytest.fixture(scope="session")
def report(conformance: ConformanceSession) -> PrecisionReport:
    return conformance.report


@pytest.fixture(scope="session")
def card(request: pytest.FixtureRequest, conformance: ConformanceSession, platform: Platform) -> Card:
    """The card as it deploys on this platform's devices (Card.on_device: a device part, e.g. TP=2 on 32 GB parts)."""
    return conformance.card(request.param).on_device(platform.name, platform.device_memory_gb)


@pytest.fixture
def prompt_id(prompt_case: tuple[str, str]) -> str:
    return prompt_case[1]
