"""pytest wiring of the conformance suite: card parametrization and the
session-scoped fixtures that hand out one engine per model. The machinery itself
lives in fixtures/."""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path
from typing import Any, Iterator

import pytest

import patches
import reports
from fixtures import cards as card_catalog
from fixtures.cards import Card, CardError
from fixtures.perf import perf_batch_sizes
from fixtures.platform import Platform, detect
from fixtures.precision import TargetResult, compare, run_target, summary_line
from fixtures.reference import ReferenceResult, reference_results, tokenize_prompts
from fixtures.report import PrecisionReport
from fixtures.serving import serve_spec
from fixtures.target import EngineBootError, VllmRunner
from fixtures.weights import WeightsUnavailable, resolve

REPORT = pytest.StashKey[PrecisionReport]()
REPORT_PATH = pytest.StashKey[Path]()
RENDERED = pytest.StashKey[list[Path]]()
RENDER_ERROR = pytest.StashKey[str]()
SELECTED = pytest.StashKey[dict[str, Card]]()
CATALOG = pytest.StashKey[dict[str, Card]]()


def _select(config: pytest.Config, catalog: dict[str, Card]) -> dict[str, Card]:
    names = config.getoption("model")
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise pytest.UsageError(f"unknown --model {unknown}; cards: {', '.join(sorted(catalog))}")
    selected = {n: catalog[n] for n in names}
    if path := config.getoption("model_path"):
        try:
            adhoc = card_catalog.adhoc_card(path.resolve())
        except CardError as exc:
            raise pytest.UsageError(str(exc)) from None
        selected[adhoc.name] = adhoc
    if not selected:
        selected = {n: c for n, c in catalog.items() if c.default}
    if ref := config.getoption("reference_path"):
        source = card_catalog.WeightSource("path", str(ref.resolve()))
        selected = {n: dataclasses.replace(c, reference_weights=source) for n, c in selected.items()}
    return selected


def pytest_configure(config: pytest.Config) -> None:
    try:
        catalog = card_catalog.load_catalog()
    except CardError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[CATALOG] = catalog
    config.stash[SELECTED] = _select(config, catalog)
    config.stash[REPORT] = PrecisionReport()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize by card (session scope, so pytest groups a card's tests and
    boots its engine once) and, where asked, by the card's prompts or by its perf
    batch sizes (those of every platform: no platform detection at collection)."""
    if "card" not in metafunc.fixturenames:
        return
    config = metafunc.config
    if metafunc.definition.get_closest_marker("sensitivity"):
        # Known-buggy cards run when nothing was selected, or when named.
        explicit = config.getoption("model") or config.getoption("model_path")
        pool = config.stash[SELECTED] if explicit else config.stash[CATALOG]
        cards = [c for c in pool.values() if c.expect.verdict == "fail"]
    else:
        cards = [c for c in config.stash[SELECTED].values() if c.expect.verdict == "pass"]
    if metafunc.definition.get_closest_marker("serving"):
        cards = [c for c in cards if serve_spec(c).run]
    # The second parameter's value carries the card's name: pytest groups a
    # session's tests by parameter value, and a bare prompt id or batch size shared
    # by two cards would interleave their tests and boot each engine again.
    if "prompt_case" in metafunc.fixturenames:
        pairs = [(c.name, (c.name, p.id)) for c in cards for p in c.prompts]
        metafunc.parametrize(["card", "prompt_case"], pairs, indirect=["card"], scope="session",
                             ids=[f"{c}-{p}" for c, (_, p) in pairs])
    elif "perf_case" in metafunc.fixturenames:
        pairs = [(c.name, (c.name, b)) for c in cards for b in perf_batch_sizes(c)]
        metafunc.parametrize(["card", "perf_case"], pairs, indirect=["card"], scope="session",
                             ids=[f"{c}-bs{b}" if b else c for c, (_, b) in pairs])
    else:
        metafunc.parametrize("card", [c.name for c in cards], indirect=True, scope="session")


@pytest.fixture(scope="session")
def platform() -> Platform:
    return detect()


@pytest.fixture
def prompt_id(prompt_case: tuple[str, str]) -> str:
    return prompt_case[1]


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> PrecisionReport:
    return pytestconfig.stash[REPORT]


@pytest.fixture(scope="session")
def card(request: pytest.FixtureRequest) -> Card:
    config = request.config
    return {**config.stash[CATALOG], **config.stash[SELECTED]}[request.param]


def _checkpoint(config: pytest.Config, source: card_catalog.WeightSource) -> Path:
    try:
        return resolve(source, config.getoption("cache_dir"), config.getoption("weights_dir"), config.getoption("offline"))
    except WeightsUnavailable as exc:
        pytest.skip(f"weights unavailable: {exc}")


@pytest.fixture(scope="session")
def checkpoint(card: Card, pytestconfig: pytest.Config) -> Path:
    return _checkpoint(pytestconfig, card.weights)


@pytest.fixture(scope="session")
def reference_checkpoint(card: Card, checkpoint: Path, pytestconfig: pytest.Config) -> Path:
    return _checkpoint(pytestconfig, card.reference_weights) if card.reference_weights else checkpoint


@pytest.fixture(scope="session")
def reference(card: Card, checkpoint: Path, reference_checkpoint: Path, pytestconfig: pytest.Config) -> dict[str, ReferenceResult]:
    # The target's tokenizer makes the token ids both sides see: tokenization is not under test.
    prompts = tokenize_prompts(checkpoint, card.prompts, card.trust_remote_code)
    return reference_results(reference_checkpoint, card.reference_dtype, card.trust_remote_code,
                             prompts, card.max_tokens, pytestconfig.getoption("cache_dir"))


@pytest.fixture(scope="session")
def target(card: Card, checkpoint: Path, platform: Platform, report: PrecisionReport,
           pytestconfig: pytest.Config) -> Iterator[VllmRunner]:
    runner = VllmRunner(
        checkpoint,
        dtype=card.dtype,
        trust_remote_code=card.trust_remote_code,
        engine_args=card.engine_args(platform.name),
        env=card.env(platform.name),
        boot_timeout_s=pytestconfig.getoption("boot_timeout"),
        request_timeout_s=pytestconfig.getoption("request_timeout"),
    )
    loads = len(patches.applied())
    try:
        with runner:
            entry = report.model(card)
            entry["load_time_s"] = runner.load_time_s
            # The renderer decodes the run's token ids with this checkpoint's tokenizer.
            entry["checkpoint"] = str(checkpoint)
            # What the load-time patches did for this engine: recorded in the process
            # that loaded the weights (this one, with the in-process engine); empty
            # with a multiprocess engine or when no patch ran.
            entry["patches"] = patches.applied()[loads:]
            yield runner
    except EngineBootError as exc:
        report.add_error(card, str(exc))
        raise


@pytest.fixture(scope="session")
def precision_results(card: Card, reference: dict[str, ReferenceResult], target: VllmRunner,
                      report: PrecisionReport) -> dict[str, dict[str, Any]]:
    """Every prompt's comparison for the card, computed once and recorded in the report."""
    outputs: dict[str, TargetResult] = run_target(target, reference, card.max_tokens)
    texts = {p.id: p.text for p in card.prompts}
    results = {}
    for pid, ref in reference.items():
        results[pid] = compare(ref, outputs[pid], card.thresholds)
        report.add_prompt(card, pid, texts[pid], results[pid])
    return results


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Keep each phase's report on the item (item.rep_setup / rep_call), so a
    fixture's teardown can record the verdict of the test it served."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep




def pytest_sessionfinish(session: pytest.Session) -> None:
    # Runs after pytest-benchmark's hookwrapper has written --benchmark-json, and after
    # the session fixtures' teardown has written perf_report.json.
    config = session.config
    report = config.stash.get(REPORT, None)
    report_dir = config.getoption("report_dir")
    # Written whenever a model was seen: a serving-only run's verdicts live there too.
    if report is not None and report.models:
        config.stash[REPORT_PATH] = report.write(report_dir, detect())
    # Only a run that booted engines renders: a unit-only run must not re-render
    # an earlier run's files in the same directory.
    if REPORT_PATH in config.stash:
        try:
            config.stash[RENDERED] = reports.render(report_dir, benchmark_json=config.getoption("benchmark_json", None))
        except Exception:  # noqa: BLE001 - a rendering bug must not hide the test results
            config.stash[RENDER_ERROR] = traceback.format_exc()


def _render_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if RENDER_ERROR in config.stash:
        terminalreporter.section("report rendering FAILED", red=True)
        terminalreporter.line(config.stash[RENDER_ERROR], red=True)
        terminalreporter.line(f"the JSON reports are intact; retry with: python -m reports {config.getoption('report_dir')}")
    for path in config.stash.get(RENDERED, []):
        terminalreporter.line(f"rendered: {path}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(REPORT, None)
    if report is None or not report.ran_precision():
        _render_summary(terminalreporter, config)
        return
    terminalreporter.section("precision conformance")
    for name, entry in report.models.items():
        if entry["prompts"]:
            terminalreporter.line(summary_line(name, entry["prompts"]))
        for error in entry["errors"]:
            terminalreporter.line(f"ERROR {name}: {error.splitlines()[0]}")
    terminalreporter.line(f"report: {config.stash[REPORT_PATH]}")
    _render_summary(terminalreporter, config)
