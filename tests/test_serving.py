"""Serving conformance: the OpenAI-compatible server booted per card and used as
clients use it (the `openai` package; raw HTTP where the wire format is the point).

Per card, Stage A boots with `--load-format dummy` (architecture and kernels, no
weights) and Stage B with the real weights; Stage B's server is shared by the
card's other checks. Each check's verdict, and each stage's boot time and the
memory the engine logged, go to the card's `serving` section of
precision_report.json. A failing check shows the server's log tail. The serving
tests carry the `serving` mark; the serve section's and the judging rules' own
tests (no engine) the `unit` mark. ServerProcess is tested in test_server_process.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import psutil
import pytest

from npu_conformance import serving as sv
from npu_conformance.cards import Card, CardError, Thresholds, load_catalog, parse_card
from npu_conformance.compare.metrics import log_softmax
from npu_conformance.engines.server import HOST, ServerBootError, group_members, started_groups, stop_all
from npu_conformance.engines.target import VllmRunner
from fixtures.server import ServerFactory, attach

def _complete(server: sv.Served, prompt: Any, max_tokens: int, **extra: Any) -> Any:
    return server.client.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens,
                                            temperature=0.0, extra_body=extra or None)


def _messages(serve: sv.ServeSpec, text: str, system: bool = True) -> list[dict[str, str]]:
    head = [{"role": "system", "content": serve.system_prompt}] if system else []
    return head + [{"role": "user", "content": text}]


# ---- the machinery proves itself: a killed server fails only its test ----

PROBE_OUTCOMES = {
    "probe_killed_mid_request": "failed",
    "probe_dead_server_fails_fast": "error",
    "probe_later_tests_still_run": "passed",
}


def _inner_selection(card: Card, checkpoint: Path, config: pytest.Config) -> list[str]:
    """The outer run's card and where its weights are, for the inner pytest."""
    model_path = config.getoption("model_path")
    adhoc = model_path is not None and Path(model_path).resolve() == checkpoint.resolve()
    argv = [f"--model-path={checkpoint}"] if adhoc else [f"--model={card.name}"]
    argv += [f"--cache-dir={config.getoption('cache_dir')}", f"--boot-timeout={config.getoption('boot_timeout')}",
             f"--request-timeout={config.getoption('request_timeout')}"]
    if config.getoption("weights_dir"):
        argv.append(f"--weights-dir={config.getoption('weights_dir')}")
    if config.getoption("offline"):
        argv.append("--offline")
    return argv


def _junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """Test name (without its parameters) -> (outcome, failure or error text)."""
    verdicts = {"failure": "failed", "error": "error", "skipped": "skipped"}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        kind = next((c for c in case if c.tag in verdicts), None)
        if kind is None:
            out[name] = ("passed", "")
        else:
            out[name] = (verdicts[kind.tag], kind.get("message", "") + "\n" + (kind.text or ""))
    return out


def _failure_block(output: str, test: str) -> str:
    """The part of pytest's FAILURES section about `test`."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("_") and f" {test}[" in line), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("____", "===="))), len(lines))
    return "\n".join(lines[start:end])


@pytest.mark.serving
def test_server_death_fails_only_its_test(card: Card, checkpoint: Path, record: dict[str, Any],
                                          pytestconfig: pytest.Config, request: pytest.FixtureRequest,
                                          tmp_path: Path) -> None:
    """An inner pytest run of this module's probe_* functions on a server of its
    own: the server is killed in the middle of a test, which must fail with the
    server log tail; the next test on that server must fail at once; the rest of
    the run must go on, and the killed server must leave no process. Once per run:
    it proves the machinery, not the card."""
    first = next(i for i in request.session.items if getattr(i, "originalname", None) == request.node.originalname)
    if first is not request.node:
        pytest.skip(f"proved once per run, on {first.callspec.params['card']}")
    junit, report_dir = tmp_path / "junit.xml", tmp_path / "report"
    argv = [sys.executable, "-m", "pytest", __file__, "-o", "python_functions=probe_*", "-p", "no:cacheprovider",
            "-q", "-rA", f"--junitxml={junit}", f"--report-dir={report_dir}",
            *_inner_selection(card, checkpoint, pytestconfig)]
    limit = pytestconfig.getoption("boot_timeout") + 300
    start = time.perf_counter()
    inner = subprocess.Popen(argv, cwd=pytestconfig.rootpath, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        output, _ = inner.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        # SIGTERM: the inner run's handler ends its server before it dies.
        inner.terminate()
        try:
            output, _ = inner.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            inner.kill()
            output, _ = inner.communicate()
        pytest.fail(f"inner run did not finish within {limit:.0f} s:\n{output[-6000:]}")
    record["inner_run_s"] = round(time.perf_counter() - start, 1)
    record["inner_exit_code"] = inner.returncode
    context = f"inner run: {' '.join(argv)}\n--- its output (tail) ---\n{output[-6000:]}"
    assert junit.is_file(), context
    outcomes = _junit_outcomes(junit)
    record["outcomes"] = {name: verdict for name, (verdict, _) in outcomes.items()}
    assert record["outcomes"] == PROBE_OUTCOMES, context
    # pytest's "some tests failed", not an interrupted or crashed run.
    assert inner.returncode == pytest.ExitCode.TESTS_FAILED, context

    models = json.loads((report_dir / "precision_report.json").read_text(encoding="utf-8"))["models"]
    (stage,) = [m["serving"]["stages"]["real"] for m in models.values()]
    last_log_line = Path(stage["log"]).read_text(errors="replace").rstrip().splitlines()[-1]
    killed = _failure_block(output, "probe_killed_mid_request")
    assert "server log tail" in killed and last_log_line in killed, f"no server log tail on the failure\n{context}"
    _, fast_error = outcomes["probe_dead_server_fails_fast"]
    assert "has exited" in fast_error and "server log tail" in fast_error, context
    assert not group_members(stage["pid"]), f"the killed server's processes remain: {group_members(stage['pid'])}"


def probe_killed_mid_request(server: sv.Served) -> None:
    """Inner run only: the server is killed while it streams, so this test must fail."""
    stream = server.client.completions.create(model=server.model, prompt="Once upon a time", temperature=0.0,
                                              max_tokens=server.max_model_len // 2, stream=True,
                                              extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 0:
            os.killpg(server.process.pid, signal.SIGKILL)


def probe_dead_server_fails_fast(server: sv.Served) -> None:
    """Inner run only: the `server` fixture must fail this test before its body runs."""
    raise AssertionError("the server fixture handed out a dead server")


def probe_later_tests_still_run(served: sv.Served) -> None:
    """Inner run only: the run goes on, and the killed server's group is empty."""
    deadline = time.monotonic() + 10
    while group_members(served.process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_members(served.process.pid)


# ---- Stage A / Stage B ----


def _smoke(server: sv.Served, serve: sv.ServeSpec, record: dict[str, Any]) -> None:
    ids = [m.id for m in server.client.models.list().data]
    assert set(server.names) <= set(ids), f"/v1/models lists {ids}, expected {server.names}"
    out = _complete(server, "Hello", serve.max_tokens, ignore_eos=True)
    record["generated_tokens"] = out.usage.completion_tokens
    assert out.usage.completion_tokens == serve.max_tokens, f"asked for {serve.max_tokens} tokens: {out}"


@pytest.mark.serving
@pytest.mark.parametrize("stage", ["dummy", "real"])
def test_stage_boot(stage: str, serve: sv.ServeSpec, new_server: ServerFactory, record: dict[str, Any],
                    pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> None:
    """Stage A (`--load-format dummy`: architecture and kernels, no weights) and
    Stage B (real weights) boot, list the model and generate."""
    if stage == "real":
        # The shared Stage B server; `served` records its boot figures.
        _smoke(request.getfixturevalue("server"), serve, record)
        return
    process, options = new_server("dummy", "dummy")
    try:
        process.start()
    except ServerBootError as exc:
        record["error"] = str(exc)
        raise
    attach(request.node, process)
    try:
        record.update(sv.stage_record(process, serve, options))
        with contextlib.closing(sv.connect(process, options, pytestconfig.getoption("request_timeout"))) as server:
            _smoke(server, serve, record)
    finally:
        process.stop()


# ---- the API as clients use it ----


@pytest.mark.serving
def test_models_lists_served_name(server: sv.Served, record: dict[str, Any]) -> None:
    resp = server.http.get("/v1/models")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json"), resp.text
    body = resp.json()
    ids = [m["id"] for m in body["data"]]
    record["ids"] = ids
    assert body["object"] == "list" and all(m["object"] == "model" for m in body["data"]), body
    assert set(server.names) <= set(ids), f"expected {server.names} among {ids}"


@pytest.mark.serving
def test_completions_return_text(server: sv.Served, card: Card, serve: sv.ServeSpec, record: dict[str, Any]) -> None:
    """Every card prompt (English, Chinese, code, arithmetic) at temperature 0."""
    record["texts"] = {}
    for prompt in card.prompts:
        choice = _complete(server, prompt.text, serve.max_tokens).choices[0]
        record["texts"][prompt.id] = choice.text
        assert choice.finish_reason in ("stop", "length"), f"{prompt.id}: {choice}"
        assert isinstance(choice.text, str) and choice.text, f"{prompt.id}: no text: {choice}"


@pytest.mark.serving
def test_chat_completions(server: sv.Served, serve: sv.ServeSpec, chat_template: bool,
                          record: dict[str, Any]) -> None:
    """System prompt plus an English and a Chinese user turn, at temperature 0."""
    def chat(text: str, system: bool = True, max_tokens: int = serve.max_tokens) -> Any:
        return server.client.chat.completions.create(model=server.model, messages=_messages(serve, text, system),
                                                     max_tokens=max_tokens, temperature=0.0)

    if not chat_template:
        with pytest.raises(openai.BadRequestError) as refused:
            chat(serve.chat[0].text)
        record["refusal"] = str(refused.value)
        assert "chat template" in str(refused.value).lower(), refused.value
        assert server.process.healthy()
        pytest.skip("the checkpoint has no chat template: chat got the clear 400 it must; no chat output to check")
    record["texts"] = {}
    for turn in serve.chat:
        out = chat(turn.text)
        message = out.choices[0].message
        record["texts"][turn.id] = message.content
        assert message.role == "assistant" and out.choices[0].finish_reason in ("stop", "length"), out
        assert isinstance(message.content, str) and message.content, f"{turn.id}: no text: {out}"
        bare = chat(turn.text, system=False, max_tokens=1)
        assert out.usage.prompt_tokens > bare.usage.prompt_tokens, "the system prompt is not in the rendered prompt"


@pytest.mark.serving
def test_streaming_matches_non_streaming(server: sv.Served, card: Card, serve: sv.ServeSpec, chat_template: bool,
                                         record: dict[str, Any]) -> None:
    """Same tokens and text, streamed or not (completions; chat too where there is a template)."""
    extra = {"return_tokens_as_token_ids": True}
    for prompt in card.prompts:
        whole = server.client.completions.create(model=server.model, prompt=prompt.text, max_tokens=serve.max_tokens,
                                                 temperature=0.0, logprobs=1, extra_body=extra).choices[0]
        tokens, text = [], ""
        for chunk in server.client.completions.create(model=server.model, prompt=prompt.text, stream=True,
                                                      max_tokens=serve.max_tokens, temperature=0.0, logprobs=1,
                                                      extra_body=extra):
            for choice in chunk.choices:
                text += choice.text
                tokens += sv.token_ids(choice.logprobs.tokens) if choice.logprobs else []
        assert tokens == sv.token_ids(whole.logprobs.tokens), f"{prompt.id}: streamed tokens differ"
        assert text == whole.text, f"{prompt.id}: streamed text {text!r} vs {whole.text!r}"
    if not chat_template:
        record["chat"] = "not checked: no chat template"
        return
    for turn in serve.chat:
        kwargs = dict(model=server.model, messages=_messages(serve, turn.text), max_tokens=serve.max_tokens,
                      temperature=0.0)
        whole = server.client.chat.completions.create(**kwargs).choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in server.client.chat.completions.create(
            stream=True, **kwargs) if c.choices)
        assert streamed == whole, f"chat {turn.id}: streamed {streamed!r} vs {whole!r}"


@pytest.mark.serving
def test_stream_wire_format(server: sv.Served, serve: sv.ServeSpec, record: dict[str, Any]) -> None:
    """Server-sent events as OpenAI clients parse them: `data: {json}` lines, then `data: [DONE]`."""
    body = {"model": server.model, "prompt": "Hello", "max_tokens": serve.max_tokens, "temperature": 0.0,
            "stream": True}
    with server.http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream"), resp.headers
        events = [line for line in resp.iter_lines() if line]
    record["events"] = len(events)
    assert events and all(e.startswith("data: ") for e in events), events[:5]
    assert events[-1] == "data: [DONE]", events[-3:]
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(c["object"] == "text_completion" and c["choices"] is not None for c in chunks), chunks[:3]


@pytest.mark.serving
def test_logprobs_match_offline_engine(server: sv.Served, target: VllmRunner, card: Card,
                                       record: dict[str, Any]) -> None:
    """The server's top-k log-probs equal log_softmax of the offline engine's raw
    logits for the same prompt tokens, within the card's precision rule (same
    relative error limit and floor): serving must add no error of its own."""
    k = card.thresholds.logprob_top_k
    record["prompts"] = {}
    for prompt in card.prompts:
        choice = _complete(server, prompt.text, card.max_tokens, logprobs=k, ignore_eos=True,
                           return_tokens_as_token_ids=True, return_token_ids=True).choices[0]
        tokens = sv.token_ids(choice.logprobs.tokens)
        assert tokens == choice.token_ids, "logprob tokens and token_ids disagree"
        # One prompt per call: the server ran it alone too, so both sides batch alike.
        [(offline_tokens, logits)] = target.greedy([choice.prompt_token_ids], card.max_tokens)
        result = sv.compare_logprobs(tokens, choice.logprobs.top_logprobs, offline_tokens, logits, card.thresholds)
        record["prompts"][prompt.id] = result
    failed = {p: r for p, r in record["prompts"].items() if not r["passed"]}
    assert not failed, json.dumps(failed, indent=1)


@pytest.mark.serving
def test_concurrent_requests(server: sv.Served, card: Card, serve: sv.ServeSpec, record: dict[str, Any]) -> None:
    """`serve.concurrency` requests at once (the seeds' --max-num-seqs) all complete in full."""
    prompts = [card.prompts[i % len(card.prompts)].text for i in range(serve.concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(serve.concurrency) as pool:
        futures = [pool.submit(_complete, server, p, serve.max_tokens, ignore_eos=True) for p in prompts]
        results, errors = [], []
        for future in futures:
            try:
                results.append(future.result())
            except openai.OpenAIError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    record.update(requests=len(prompts), errors=errors, wall_s=round(time.perf_counter() - start, 2))
    assert not errors, errors
    lengths = [r.usage.completion_tokens for r in results]
    assert lengths == [serve.max_tokens] * len(prompts), lengths


@pytest.mark.serving
def test_bad_requests_get_4xx(server: sv.Served, serve: sv.ServeSpec, record: dict[str, Any]) -> None:
    """Each `serve.bad_requests` case: a 4xx whose message names the problem, and a
    server that is still healthy and serving afterwards."""
    context = {"model": server.model, "max_model_len": server.max_model_len}
    record["cases"] = {}
    for case in serve.bad_requests:
        resp = server.http.post("/v1/completions", headers={"content-type": "application/json"},
                                content=sv.bad_request_body(case, server.model, server.max_model_len))
        result = sv.judge_bad_request(case, resp.status_code, resp.text, context)
        if not server.process.healthy():
            result["problems"].append("server unhealthy afterwards")
        record["cases"][case.id] = result
    after = _complete(server, "Hello", 2)
    assert after.usage.completion_tokens >= 1, after
    failed = {c: r for c, r in record["cases"].items() if r["problems"]}
    assert not failed, json.dumps(failed, indent=1, ensure_ascii=False)


# ---- self-tests of the machinery: no engine ----

GOOD_CARD = {"name": "x", "architecture": "LlamaForCausalLM", "weights": {"synthetic": "llama"}}


def _card(serve: dict[str, Any]) -> Card:
    return parse_card({**GOOD_CARD, "serve": serve}, "x.yaml")


@pytest.mark.unit
def test_every_card_serve_section_is_valid() -> None:
    specs = {name: card.serve for name, card in load_catalog().items()}
    assert specs["granite-4.1-8b"].args == {"served_model_name": "granite-4.1-8b"}
    assert all(s.concurrency == 16 and s.bad_requests and s.chat for s in specs.values())


@pytest.mark.unit
@pytest.mark.parametrize("serve, field", [
    ({"args": {"port": 8000}}, "serve.args.port"),
    ({"args": {"max_num_seqs": None}}, "serve.args.max_num_seqs"),
    ({"bogus": 1}, "serve.bogus"),
    ({"concurrency": 0}, "serve.concurrency"),
    ({"env": {"X": 1}}, "serve.env.X"),
    ({"engine_log": {"kv": "KV cache [0-9]+"}}, "serve.engine_log.kv"),
    ({"bad_requests": [{"id": "a", "raw": "{", "body": {"x": 1}, "mentions": ["json"]}]}, "serve.bad_requests[0].raw"),
    ({"bad_requests": [{"id": "a", "mentions": []}]}, "serve.bad_requests[0].mentions"),
    ({"bad_requests": [{"id": "a", "mentions": ["{max_len}"]}]}, "serve.bad_requests[0].mentions"),
    ({"chat": [{"id": "en", "text": "a"}, {"id": "en", "text": "b"}]}, "serve.chat"),
])
def test_bad_serve_section_names_the_field(serve: dict[str, Any], field: str) -> None:
    with pytest.raises(CardError) as exc:
        _card(serve)
    assert exc.value.field == field, exc.value


@pytest.mark.unit
def test_options_become_flags_generically(tmp_path: Path) -> None:
    card = _card({"args": {"served_model_name": ["a", "b"], "enable_prefix_caching": False}})
    options = sv.server_options(card, card.serve, "cpu", tmp_path, "dummy")
    argv = sv.server_command(options)(1234)
    assert argv[:3] == [sys.executable, "-m", sv.SERVER_MODULE] and argv[-2:] == ["--port", "1234"]
    flags = argv[3:-2]
    # The suite's own flags come last: the server's parser takes the last of a repeated flag.
    assert flags[-9:] == ["--model", str(tmp_path), "--host", HOST, "--dtype", "float32", "--no-trust-remote-code",
                          "--load-format", "dummy"]
    for expected in (["--max-model-len", "512"], ["--enforce-eager"], ["--served-model-name", "a", "b"],
                     ["--no-enable-prefix-caching"]):
        assert any(flags[i:i + len(expected)] == expected for i in range(len(flags))), (expected, flags)
    assert sv.served_names(options) == ["a", "b"]
    assert sv.cli_flags({"compilation_config": {"mode": 0}}) == ["--compilation-config", '{"mode": 0}']
    assert "load_format" not in sv.server_options(card, card.serve, "cpu", tmp_path, None)
    with pytest.raises(ValueError, match="'seed'"):
        sv.cli_flags({"seed": None})


@pytest.mark.unit
def test_engine_figures_read_from_boot_log() -> None:
    spec = _card({}).serve
    cpu = ("INFO [cpu_worker.py:260] Explicitly set (1.0/7.84) GiB for KV cache on node 0.\n"
           "INFO [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency\n"
           "INFO [default_loader.py:501] Loading weights took 0.03 seconds\n")
    assert sv.engine_figures(cpu, spec.engine_log) == {"kv_cache_gib": 1.0, "kv_cache_tokens": 1048576.0,
                                                       "weights_load_s": 0.03}
    npu = "Loading model weights took 7.7133 GB\nAvailable KV cache memory: 40.50 GiB\n"
    assert sv.engine_figures(npu, spec.engine_log) == {"model_weights_gib": 7.7133, "kv_cache_gib": 40.5}


@pytest.mark.unit
def test_logprob_comparison_rule() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50)) * 3
    lp = log_softmax(logits)
    tokens = [int(t) for t in logits.argmax(axis=-1)]
    t = Thresholds(mission_rel_err=0.01, cosine=0.9999, cosine_rule="absolute", tie_margin=0.05, logprob_top_k=3,
                   logprob_floor=0.01, noise_k=2.0, noise_k_max=3.0, dtype_floor=6.1e-5,
                   dtype_eps=2.0 ** -23, diagnosis_rel_l2=0.01)

    def top(scale: float) -> list[dict[str, float]]:
        return [{f"token_id:{j}": float(lp[i, j] * scale) for j in np.argsort(lp[i])[-3:]} for i in range(4)]

    same = sv.compare_logprobs(tokens, top(1.0), tokens, logits, t)
    assert same["passed"] and same["logprob_rel_err_max"] < 1e-12 and same["positions_compared"] == 4
    assert not sv.compare_logprobs(tokens, top(1.05), tokens, logits, t)["passed"]
    other = [tokens[0], int(np.argsort(lp[1])[-2]), *tokens[2:]]
    diverged = sv.compare_logprobs(other, top(1.0), tokens, logits, t)
    assert diverged["first_divergence"] == 1 and diverged["positions_compared"] == 2
    assert diverged["passed"] == bool(lp[1].max() - lp[1, other[1]] <= t.tie_margin)


@pytest.mark.unit
def test_bad_request_judgement() -> None:
    case = sv.BadRequest("long", {}, None, " hi", ("{max_model_len}",))
    body = json.loads(sv.bad_request_body(case, "m", 8))
    assert body["prompt"] == " hi" * 9 and body["model"] == "m"
    ctx = {"model": "m", "max_model_len": 8}
    good = json.dumps({"error": {"message": "maximum context length is 8 tokens"}})
    assert sv.judge_bad_request(case, 400, good, ctx)["problems"] == []
    assert sv.judge_bad_request(case, 500, good, ctx)["problems"] == ["status 500, expected 4xx"]
    vague = json.dumps({"error": {"message": "no"}})
    assert "mentions none" in sv.judge_bad_request(case, 400, vague, ctx)["problems"][0]
    assert "no {'error'" in sv.judge_bad_request(case, 400, "oops", ctx)["problems"][0]


# ---- last: pytest runs unparametrized tests after the card groups ----


@pytest.mark.serving
def test_no_server_left_behind() -> None:
    """Ends the servers still up (the session fixtures' own stop), then requires
    that no server process of this run remains: no api_server child of this
    pytest process, and nothing left in any server's process group."""
    stop_all()
    children = [p for p in psutil.Process().children(recursive=True) if _is_server(p)]
    remaining = {pgid: [p.pid for p in group_members(pgid)] for pgid in started_groups()}
    assert not children, f"api_server processes left: {[p.pid for p in children]}"
    assert not {g: m for g, m in remaining.items() if m}, f"server process groups not empty: {remaining}"


def _is_server(proc: psutil.Process) -> bool:
    try:
        return sv.SERVER_MODULE in " ".join(proc.cmdline())
    except psutil.Error:
        return False
