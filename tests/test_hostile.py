"""Hostile and broken input: every user-supplied file (card, prompt set, prompt
file, a checkpoint's config.json) stops the run with one message naming the file
and what is wrong, never a traceback; a card cannot move a server off 127.0.0.1,
run a checkpoint's code behind the card's back or take the server's key; and a
server does not outlive the pytest process that started it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_cards import GOOD, ROOT, needs_vllm, write

from npu_conformance import cli
from npu_conformance import serving as sv
from npu_conformance.cards import CATALOG_DIR, CardError, adhoc_card, load_card, load_catalog, parse_card
from npu_conformance.engines.server import HOST, group_members
from npu_conformance.engines.target import NO_TELEMETRY, EngineBootError, VllmRunner, EXIT_STUCK, deadline, descendants
from npu_conformance.platforms import Platform
from npu_conformance.weights import PROBE_TIMEOUT_S, hub_answers, resolve

pytestmark = pytest.mark.robustness

# Long enough for the engine to start its first process, short of a boot here.
# 20 s once ran out before the TP=2 card spawned its ranks, late in a long
# session on this loaded 2-core host ("the engine started no process to freeze").
HUNG_BOOT_DEADLINE_S = 40.0


def usage_error(args: list[str], prompts_dir: Path | None = None) -> str:
    """The output of a pytest run (collection only) that must stop with a usage
    error (exit code 4), not an INTERNALERROR or a traceback. `prompts_dir`
    stands in for the package's prompt sets."""
    argv = ["--collect-only", "-q", "-p", "no:cacheprovider", *args, "tests/test_layout.py"]
    patch = f"from npu_conformance.cards import prompts; prompts.PROMPTS_DIR = Path({str(prompts_dir)!r})\n" if prompts_dir else ""
    code = f"import sys\nfrom pathlib import Path\nimport pytest\n{patch}sys.exit(pytest.main({argv!r}))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    return output


def catalog_with(tmp_path: Path, card: dict[str, Any]) -> tuple[Path, Path]:
    """A catalog of the shipped defaults and one card: (its folder, the card's file)."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CATALOG_DIR / "_defaults.yaml", catalog)
    return catalog, write(catalog, card)


# ---- files that cannot be parsed ----


BAD_CONFIGS = [
    (b"{not json", "<json>", "not valid JSON"),
    (b"[1, 2]", "<top>", "JSON object, got list"),
    (b'{"architectures": "LlamaForCausalLM"}', "architectures", "expected a list of str"),
    (b"\xff\xfe{}", "<file>", "not UTF-8"),
]


@pytest.mark.parametrize("text, field, words", BAD_CONFIGS)
def test_bad_config_json_names_the_file(tmp_path: Path, text: bytes, field: str, words: str) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(text)
    with pytest.raises(CardError) as err:
        adhoc_card(tmp_path)
    assert err.value.file == str(config) and err.value.field == field, err.value
    assert str(err.value).startswith("checkpoint config ") and words in str(err.value)


@pytest.mark.parametrize("text, field, words", BAD_CONFIGS[:2])
def test_bad_config_json_under_model_path_is_a_usage_error(tmp_path: Path, text: bytes, field: str,
                                                          words: str) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(text)
    output = usage_error([f"--model-path={tmp_path}"])
    assert f"checkpoint config {config}: field '{field}'" in output and words in output, output


# Invalid, a list and empty: each named by tests/test_cards.py's test_bad_prompt_set_names_its_own_file,
# and the same error stops a run.
@pytest.mark.parametrize("text, field, words", [
    ("prompts: [unclosed", "<yaml>", "not valid YAML"),
    ("- id: a\n  text: b\n", "<top>", "got list"),
])
def test_bad_prompt_set_is_a_usage_error(tmp_path: Path, text: str, field: str, words: str) -> None:
    prompts_dir = tmp_path / "prompts"
    prompts_dir.mkdir()
    (prompts_dir / "mine.yaml").write_text(text, encoding="utf-8")
    catalog, _ = catalog_with(tmp_path, {**GOOD, "prompts": "mine"})
    output = usage_error([f"--catalog={catalog}"], prompts_dir)
    assert f"prompt set {prompts_dir / 'mine.yaml'}: field '{field}'" in output and words in output, output


@pytest.mark.parametrize("name", ["../catalog/_defaults", "/etc/passwd", "..", "a/b", "mine.yaml", ""])
def test_prompt_set_name_is_a_name_not_a_path(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, {**GOOD, "prompts": name})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.file == str(path) and err.value.field == "prompts", err.value
    assert "no path" in str(err.value)


def test_prompt_set_path_stops_the_run(tmp_path: Path) -> None:
    catalog, card = catalog_with(tmp_path, {**GOOD, "prompts": "../catalog/_defaults"})
    output = usage_error([f"--catalog={catalog}"])
    assert f"model card {card}: field 'prompts'" in output and "no path" in output, output


@pytest.mark.parametrize("text, field, words", [
    (None, "<file>", "cannot be read"),
    ("{not json", "<json>", "not valid JSON"),
    ('{"prompts": 3}', "prompts", "non-empty JSON list"),
    ("[]", "<top>", "non-empty JSON list"),
    ('["ok", {"prompt": 1}]', "[1]", "expected a string"),
])
def test_bad_prompt_file_is_a_cli_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None,
                                              field: str, words: str) -> None:
    """Read while the command line is parsed: exit 2 with argparse's usage line,
    before any model is touched (`--model` names nothing that exists)."""
    prompt_file = tmp_path / "prompts.json"
    if text is not None:
        prompt_file.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inference", "--model", "no-such-model", "--prompt-file", str(prompt_file)])
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2, stderr
    assert stderr.startswith("usage:") and "error: argument --prompt-file: " in stderr, stderr
    assert f"prompt file {prompt_file}: field '{field}'" in stderr and words in stderr, stderr


# ---- a card does not own the server's security settings ----

SECTIONS = {
    "engine": lambda key, value: {"engine": {key: value}},
    "platforms.cpu.engine": lambda key, value: {"platforms": {"cpu": {"engine": {key: value}}}},
    "conditions.graph.engine": lambda key, value: {"conditions": {"graph": {"run": False, "engine": {key: value}}}},
    "serve.args": lambda key, value: {"serve": {"args": {key: value}}},
}
HOSTILE = {"trust_remote_code": True, "host": "0.0.0.0", "port": 80, "load_format": "dummy", "api_key": "mine",
           "model": "/elsewhere", "dtype": "float16"}


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("key", HOSTILE)
def test_suite_flags_are_refused_in_every_section(tmp_path: Path, section: str, key: str) -> None:
    path = write(tmp_path, {**GOOD, **SECTIONS[section](key, HOSTILE[key])})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.file == str(path) and err.value.field == f"{section}.{key}", err.value
    assert "set by the suite" in str(err.value)


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("key, value, words", [
    ("trust-remote-code", True, "snake_case"),
    ("Host", "0.0.0.0", "snake_case"),
    ("host=0.0.0.0", True, "snake_case"),
    ("served_model_name", ["m", "--host=0.0.0.0"], "reads as a flag"),
    ("served_model_name", "--trust-remote-code", "reads as a flag"),
])
def test_flags_smuggled_past_the_names_are_refused(tmp_path: Path, section: str, key: str, value: Any,
                                                   words: str) -> None:
    path = write(tmp_path, {**GOOD, **SECTIONS[section](key, value)})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.file == str(path) and err.value.field == f"{section}.{key}", err.value
    assert words in str(err.value)


def test_hostile_card_stops_the_run(tmp_path: Path) -> None:
    catalog, card = catalog_with(tmp_path, {**GOOD, "serve": {"args": {"host": "0.0.0.0"}}})
    output = usage_error([f"--catalog={catalog}"])
    assert f"model card {card}: field 'serve.args.host'" in output and "set by the suite" in output, output


def test_server_command_line_binds_loopback_whatever_the_card(tmp_path: Path) -> None:
    """A card built around the schema (model_copy does not validate) still gets a
    server on 127.0.0.1 without a checkpoint's code: the suite's flags are the last
    ones, and argparse, as vLLM's parser, takes the last of a repeated flag."""
    card = parse_card(GOOD, "x.yaml")
    bypass = {"host": "0.0.0.0", "trust_remote_code": True, "served_model_name": ["m", "--host=0.0.0.0"]}
    card = card.model_copy(update={"engine": {**card.engine, **bypass},
                                   "serve": card.serve.model_copy(update={"args": {"host": "::", "port": 80}})})
    options = sv.server_options(card, card.serve, "cpu", tmp_path, None)
    argv = sv.server_command(options)(1234)[3:]
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction)
    parsed, _ = parser.parse_known_args(argv)
    assert (parsed.host, parsed.port, parsed.trust_remote_code) == (HOST, 1234, False), argv
    assert options["host"] == HOST and list(options)[-4:] == ["model", "host", "dtype", "trust_remote_code"]


def test_the_servers_key_is_the_suites(tmp_path: Path) -> None:
    path = write(tmp_path, {**GOOD, "serve": {"env": {"VLLM_API_KEY": "known"}}})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.field == "serve.env.VLLM_API_KEY" and "set by the suite" in str(err.value)
    card = load_card(write(tmp_path, GOOD))
    options = sv.server_options(card, card.serve, "cpu", tmp_path, None)
    first, second = (sv.new_server(card, card.serve, "cpu", options, tmp_path, "real", 1.0) for _ in range(2))
    assert first.api_key and len(first.api_key) == 32 and first.api_key != second.api_key
    assert first.env["VLLM_API_KEY"] == first.api_key and first.api_key not in " ".join(first.command(1))
    assert first.env["VLLM_NO_USAGE_STATS"] == first.env["DO_NOT_TRACK"] == "1"


def test_in_process_engines_send_no_usage_statistics(tmp_path: Path) -> None:
    runner = VllmRunner(tmp_path, "float32", False, {}, {"DO_NOT_TRACK": "0"}, 1.0, 1.0)
    assert {k: runner.env[k] for k in NO_TELEMETRY} == NO_TELEMETRY == {
        "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1"}


# ---- a server does not outlive the run that started it ----

STARTER = """
import json, sys, time
from pathlib import Path
from npu_conformance import serving as sv
from npu_conformance.cards import load_catalog
from npu_conformance.weights import PROBE_TIMEOUT_S, hub_answers, resolve
name, cache, report_dir, platform, boot_timeout, out = sys.argv[1:]
card = load_catalog()[name]
checkpoint = resolve(card.weights, Path(cache), None, True)
options = sv.server_options(card, card.serve, platform, checkpoint, None)
server = sv.new_server(card, card.serve, platform, options, Path(report_dir), "real", float(boot_timeout))
server.start()
Path(out).write_text(json.dumps({"pid": server.pid, "port": server.port, "log": str(server.log_path)}))
time.sleep(3600)
"""
# The kernel's SIGKILL is immediate; the rest is the engine's processes noticing.
GONE_WITHIN_S = 10.0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


@needs_vllm
def test_server_dies_with_a_killed_pytest(tmp_path: Path, platform: Platform, pytestconfig: pytest.Config) -> None:
    """A process that started a server through the suite's code is SIGKILLed (no
    handler runs): the server and its engine processes go, and the port is free."""
    name = "synthetic-llama"
    assert load_catalog()[name].serve.run
    out = tmp_path / "started.json"
    boot_timeout = pytestconfig.getoption("boot_timeout")
    starter = subprocess.Popen([sys.executable, "-c", STARTER, name, str(pytestconfig.getoption("cache_dir")),
                                str(tmp_path), platform.name, str(boot_timeout), str(out)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + boot_timeout + 120
        while not out.is_file() and starter.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert out.is_file(), f"no server started:\n{starter.stdout.read() if starter.poll() is not None else ''}"
        server = json.loads(out.read_text())
        members = group_members(server["pid"])
        assert members, "the server is not running"
        starter.kill()
        starter.wait(30)
        deadline = time.monotonic() + GONE_WITHIN_S
        while (group_members(server["pid"]) or not _port_free(server["port"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in group_members(server["pid"]) if p.is_running()]
        assert not left, f"server processes outlive the killed starter: {left}"
        assert _port_free(server["port"]), f"port {server['port']} still taken"
    finally:
        if starter.poll() is None:
            starter.kill()
        if server:
            for proc in group_members(server["pid"]):
                with contextlib.suppress(psutil.Error):
                    proc.kill()


# ---- deadlines that hold ----


def test_watchdog_ends_a_call_stuck_where_no_handler_runs() -> None:
    """SIGALRM blocked stands in for C code that runs no signal handler: the
    watchdog kills the process the call waits on, which ends the wait, and the
    call fails with a TimeoutError that says so."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as err:
            with deadline(0.5, "a stuck call", lambda: [psutil.Process(child.pid)], grace_s=1.0):
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                try:
                    os.read(child.stdout.fileno(), 1)  # returns (EOF) only once the child is gone
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    finally:
        child.kill()
        child.wait()
    assert f"a stuck call did not finish within 0 s and was stuck 1 s more where no signal handler runs; the " \
           f"watchdog killed its processes [{child.pid}]" == str(err.value)
    assert not psutil.pid_exists(child.pid), "the process the call waited on was not killed"
    assert time.monotonic() - start < 30, "the call was not ended by the watchdog"


# A process the boot started that lives this long is the engine's, not a
# short-lived helper such as a CPU-info query, which its caller reaps itself.
ENGINE_PROCESS_AGE_S = 2.0
ENGINE_WITH_PROCESSES = "synthetic-llama-tp2"


STUCK_IN_PROCESS = """
import os, signal, sys
from npu_conformance.engines.target import deadline
read, _ = os.pipe()
with deadline(0.5, "an in-process engine", lambda: [], grace_s=1.0):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    os.read(read, 1)  # nothing ever writes: stuck for good
"""


def test_watchdog_ends_a_process_stuck_with_nothing_to_kill() -> None:
    """An in-process engine stuck in C code has no process of its own to kill:
    the watchdog ends the whole process, saying why and where its threads are."""
    run = subprocess.run([sys.executable, "-c", STUCK_IN_PROCESS], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == EXIT_STUCK, run.stderr
    assert ("an in-process engine did not finish within 0 s and was stuck 1 s more where no signal handler runs; "
            "the watchdog killed its processes [], and it is still stuck 1 s later: ending this process "
            f"(exit status {EXIT_STUCK})") in run.stderr, run.stderr
    assert 'File "<string>", line 7' in run.stderr, run.stderr  # the main thread's traceback, at the stuck read


def _freeze_engine(before: set[psutil.Process], frozen: list[psutil.Process], stop: threading.Event) -> None:
    while not stop.is_set():
        for proc in descendants() - before - set(frozen):
            with contextlib.suppress(psutil.Error):
                if time.time() - proc.create_time() >= ENGINE_PROCESS_AGE_S:
                    proc.suspend()
                    frozen.append(proc)
        time.sleep(0.05)


@needs_vllm
def test_hung_boot_is_ended_and_leaves_no_engine_process(platform: Platform, pytestconfig: pytest.Config) -> None:
    """The processes of an engine that has some (the TP=2 card's ranks; the CPU
    cards' engines are in-process) are frozen (SIGSTOP) once they have run a
    moment, so the boot hangs: the deadline fails it, and every process it started is gone."""
    card = load_catalog()[ENGINE_WITH_PROCESSES]
    checkpoint = resolve(card.weights, pytestconfig.getoption("cache_dir"), None, True)
    before, frozen, stop = descendants(), [], threading.Event()
    watcher = threading.Thread(target=_freeze_engine, args=(before, frozen, stop), daemon=True)
    watcher.start()
    runner = VllmRunner(checkpoint, card.dtype, False, card.engine_args(platform.name), card.env(platform.name),
                        boot_timeout_s=HUNG_BOOT_DEADLINE_S, request_timeout_s=60.0)
    try:
        with pytest.raises(EngineBootError) as err:
            with runner:
                pass
    finally:
        stop.set()
        watcher.join()
        for proc in frozen:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    assert frozen, f"the engine started no process to freeze; its boot ended: {err.value}"
    message = str(err.value)
    assert f"did not finish within {HUNG_BOOT_DEADLINE_S:.0f} s; killed its processes [" in message, message
    killed = message.split("killed its processes")[1]
    assert all(str(proc.pid) in killed for proc in frozen), (frozen, message)
    left = [(p.pid, p.name()) for p in descendants() - before if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"the hung boot left processes: {left}"


def test_hub_probe_is_bounded_with_the_name_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that never answers (stood in for by a getaddrinfo that sleeps)
    costs the probe its deadline, not the resolver's."""
    def stalled(*args: Any, **kwargs: Any) -> Any:
        time.sleep(600)

    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    hub_answers.cache_clear()
    start = time.monotonic()
    try:
        why = hub_answers("http://hub.example.invalid")
    finally:
        hub_answers.cache_clear()
    assert why == f"did not answer within {PROBE_TIMEOUT_S:g} s (name lookup included)"
    assert time.monotonic() - start < PROBE_TIMEOUT_S + 5, "the probe waited on the resolver"
