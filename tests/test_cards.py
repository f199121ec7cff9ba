"""Card loading and validation: every shipped card loads, and a bad card fails
with one message naming the file and the field."""

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from npu_conformance.cards import CATALOG_DIR, CardError, adhoc_card, engine_arg_names, load_card, load_catalog
from npu_conformance.cards import prompts as prompt_sets

pytestmark = pytest.mark.unit

GOOD = {"name": "x", "architecture": "LlamaForCausalLM", "weights": {"synthetic": "llama"}}
ROOT = Path(__file__).resolve().parents[1]
needs_vllm = pytest.mark.skipif(engine_arg_names() is None, reason="vllm is not installed: no EngineArgs to check")


def write(tmp_path: Path, data: dict, name: str = "x") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_catalog_loads_with_defaults_applied():
    catalog = load_catalog()
    assert {"synthetic-llama", "synthetic-granite", "synthetic-llama-bf16"} <= {n for n, c in catalog.items() if c.default}
    llama = catalog["synthetic-llama"]
    assert llama.thresholds.mission_rel_err == 0.01 and llama.thresholds.cosine == 0.9999
    assert llama.trust_remote_code is False
    assert [p.id for p in llama.prompts][:1] == ["en_capital"]


def test_seed_cards_name_their_sources_and_patches():
    catalog = load_catalog()
    assert catalog["qwen1.5-0.5b-chat-gptq-int4"].weights.kind == "modelscope"
    assert catalog["qwen1.5-0.5b-chat-gptq-int4"].patch == "gptq"
    assert catalog["qwen3-4b-thinking-2507-fp8"].patch == "fp8_block"
    from npu_conformance import baselines

    seed = {e.key.batch_size: e.tok_s for e in baselines.load("granite-4.1-8b").entries}
    assert seed == {1: 21.0, 8: 120.0}


def test_platform_overrides_merge_over_common_engine_args(tmp_path):
    card = load_card(write(tmp_path, {**GOOD, "engine": {"max_model_len": 64},
                                      "platforms": {"npu": {"engine": {"max_model_len": 128}}}}))
    assert card.engine_args("npu")["max_model_len"] == 128
    assert card.engine_args("cuda")["max_model_len"] == 64


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"dtype": "fp8"}, "dtype", "must be one of"),
        ({"max_tokens": "ten"}, "max_tokens", "expected int"),
        ({"max_tokens": True}, "max_tokens", "got bool"),
        ({"max_tokens": 0}, "max_tokens", "must be > 0"),
        ({"thresholds": {"cosine": 2}}, "thresholds.cosine", "[-1, 1]"),
        ({"thresholds": {"cosin": 0.9}}, "thresholds.cosin", "unknown field"),
        ({"thresholds": {"noise": {"floor": {"float32": 0.0}}}}, "thresholds.noise.floor.float32", "must be > 0"),
        ({"reference": {"dtype": "bfloat16"}}, "reference.dtype", "golden reference runs in float32"),
        ({"weights": {"synthetic": "llama", "hf": "a/b"}}, "weights", "exactly one of"),
        ({"weights": {"hf": "a/b", "mutate": {"zero": []}}}, "weights.mutate", "only synthetic"),
        ({"prompts": "nope"}, "prompts", "no prompt set"),
        ({"prompts": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, "prompts", "duplicate"),
        ({"platforms": {"tpu": {}}}, "platforms.tpu", "unknown platform"),
        ({"platforms": {"cpu": {"env": {"X": 1}}}}, "platforms.cpu.env.X", "strings"),
        ({"platforms": {"npu": {"perf": {"batch_sizes": [1], "input_len": 8, "output_len": 8, "rounds": 1,
                                         "warmup_rounds": 0, "noise_k": 2.0, "detect_slowdown": 1.25}}}},
         "platforms.npu.perf.slack", "required"),
        ({"platforms": {"npu": {"perf": {"batch_sizes": [1], "input_len": 8, "output_len": 8, "rounds": 1,
                                         "warmup_rounds": 0, "slack": 1.0, "noise_k": 2.0,
                                         "detect_slowdown": 1.25}}}},
         "platforms.npu.perf.slack", "must be < 1"),
        ({"platforms": {"npu": {"perf": {"batch_sizes": [1], "input_len": 8, "output_len": 8, "rounds": 1,
                                         "warmup_rounds": 0, "floor_tok_s": {1: 10}}}}},
         "platforms.npu.perf.floor_tok_s", "unknown field"),
        ({"engine": {"dtype": "float16"}}, "engine.dtype", "set by the suite"),
        ({"engine": {"load_format": "dummy"}}, "engine.load_format", "set by the suite"),
        ({"platforms": {"npu": {"engine": {"model": "x"}}}}, "platforms.npu.engine.model", "set by the suite"),
        ({"quant_path": "patch"}, "quant_path", "sets no patch"),
        ({"patch": "gptq", "quant_path": "dequant"}, "quant_path", "must be one of"),
        ({"allow_model_impl_fallback": "yes"}, "allow_model_impl_fallback", "expected bool"),
        ({"prompts": "../catalog/_defaults"}, "prompts", "no prompt set"),
        ({"prompts": [{"id": "a", "text": "x"}, {"id": "b"}]}, "prompts[1].text", "is required"),
        ({"reference": {"dtype": "float32", "weight": {"hf": "a/b"}}}, "reference.weight", "unknown field"),
        ({"expect": {"verdict": "fail"}}, "expect.caught_by", "is required"),
        ({"fault": {"path": "decode", "scale": 0.1}}, "fault", "only a known-buggy card"),
        ({"fault": {"path": "prefill", "scale": 0.1}, "expect": {"verdict": "fail", "caught_by": ["cosine"]}},
         "fault.path", "must be one of"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "passes": ["cosine"]}}, "expect.passes",
         "cannot both"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "reaches": ["nope"]}}, "expect.reaches",
         "not in the card's prompts"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "conditions": {"graph": "fail"}}},
         "expect.conditions.graph", "without engine arguments"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "diagnosis": {"sublayer": "self_attn"}}},
         "expect.diagnosis.layer", "is required for sublayer 'self_attn'"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "diagnosis": {"sublayer": "attn", "layer": 0}}},
         "expect.diagnosis.sublayer", "attn"),
        ({"architecture": None}, "architecture", "is required"),
        # A real model's card cannot declare itself buggy and so leave the gate's runs.
        ({"weights": {"modelscope": "org/m"}, "expect": {"verdict": "fail", "caught_by": ["cosine"]}},
         "expect.verdict", "synthetic weights); this card's weights are modelscope"),
        ({"weights": {"hf": "org/m"}, "fault": {"path": "decode", "scale": 0.1},
          "expect": {"verdict": "fail", "caught_by": ["cosine"]}}, "expect.verdict", "this card's weights are hf"),
        ({"platforms": {"cpu": {"perf_exempt": "measured elsewhere"}}}, "platforms.cpu", "set perf: null with it"),
        ({"accuracy": {"alpha": 0.5, "power": 0.4}}, "accuracy.power", "at most alpha"),
        ({"accuracy": {"alpha": 0}}, "accuracy.alpha", "must be > 0"),
        ({"accuracy": {"tasks": "gsm8k"}}, "accuracy.tasks", "unknown field"),
        ({"accuracy": {"reference": "gpu"}}, "accuracy.reference", "'cpu' or 'baseline'"),
        # A score is a fraction, as lm-eval reports it, not a percentage.
        ({"accuracy": {"baselines": {"npu": {"value": 81, "n": 1319, "source": "x"}}}}, "accuracy.baselines.npu.value",
         "must be <= 1.0, got 81"),
        ({"accuracy": {"baselines": {"npu": {"value": 0.81, "n": 1319}}}}, "accuracy.baselines.npu.source",
         "is required"),
        ({"expect": {"verdict": "fail", "caught_by": ["cosine"], "accuracy": "failed"}}, "expect.accuracy",
         "'pass' or 'fail'"),
    ],
)
def test_bad_card_names_file_and_field(tmp_path, change, field, words):
    path = write(tmp_path, {**GOOD, **change})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.field == field
    assert str(path) in str(err.value) and words in str(err.value)


def test_name_must_match_file(tmp_path):
    with pytest.raises(CardError, match="must match the file name"):
        load_card(write(tmp_path, GOOD, name="other"))


def test_invalid_yaml_is_reported_with_its_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: [unclosed", encoding="utf-8")
    with pytest.raises(CardError, match="not valid YAML") as err:
        load_card(path)
    assert str(path) in str(err.value)


def test_adhoc_card_reads_architecture_from_config(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["GraniteForCausalLM"]}', encoding="utf-8")
    card = adhoc_card(tmp_path, reference_path=Path("/ref"))
    assert card.architecture == "GraniteForCausalLM" and card.weights.kind == "path"
    assert card.reference_weights.ref == "/ref"


def test_adhoc_card_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(CardError, match="no config.json"):
        adhoc_card(tmp_path)


def test_quant_path_and_fallback_defaults(tmp_path):
    plain = load_card(write(tmp_path, GOOD))
    assert plain.quant_path == "auto" and plain.allow_model_impl_fallback is False
    patched = load_card(write(tmp_path, {**GOOD, "patch": "gptq", "quant_path": "kernel",
                                         "allow_model_impl_fallback": True}))
    assert patched.quant_path == "kernel" and patched.allow_model_impl_fallback is True


@needs_vllm
@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"engine": {"max_model_lenn": 512}}, "engine.max_model_lenn",
         "unknown vLLM engine argument (did you mean max_model_len?)"),
        ({"platforms": {"cpu": {"engine": {"enforce_eagr": True}}}}, "platforms.cpu.engine.enforce_eagr",
         "did you mean enforce_eager?"),
    ],
)
def test_unknown_engine_argument_is_named_with_a_suggestion(tmp_path, change, field, words):
    path = write(tmp_path, {**GOOD, **change})
    with pytest.raises(CardError) as err:
        load_card(path)
    assert err.value.field == field
    assert str(path) in str(err.value) and words in str(err.value)


def test_engine_check_is_skipped_without_vllm(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    engine_arg_names.cache_clear()
    try:
        card = load_card(write(tmp_path, {**GOOD, "engine": {"not_an_engine_arg": 1}}))
        assert card.engine["not_an_engine_arg"] == 1
        # The suite's own keys are refused with or without vllm.
        with pytest.raises(CardError, match="set by the suite"):
            load_card(write(tmp_path, {**GOOD, "engine": {"model": "m"}}))
    finally:
        engine_arg_names.cache_clear()


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("prompts: [unclosed", "<yaml>", "not valid YAML"),
        ("", "<top>", "mapping with a 'prompts' list"),
        ("- id: a\n  text: b\n", "<top>", "mapping with a 'prompts' list"),
        ("prompts: []\n", "prompts", "non-empty list"),
        ("prompts: [{id: a, text: b}, {id: a, text: c}]\n", "prompts", "duplicate"),
        ("prompts: [{id: a, text: 1}]\n", "prompts[0].text", "expected str"),
        ("prompts: [{id: a, txt: b}]\n", "prompts[0].txt", "unknown field"),
        ("prompts: [{id: a, 1: b}]\n", "prompts[0].1", "unknown field"),
        ("prompts: [{id: a, text: b}]\nextra: 1\n", "extra", "unknown field"),
    ],
)
def test_bad_prompt_set_names_its_own_file(tmp_path, monkeypatch, text, field, words):
    prompts_dir = tmp_path / "prompts"
    prompts_dir.mkdir()
    prompt_file = prompts_dir / "mine.yaml"
    prompt_file.write_text(text, encoding="utf-8")
    monkeypatch.setattr(prompt_sets, "PROMPTS_DIR", prompts_dir)
    with pytest.raises(CardError) as err:
        load_card(write(tmp_path, {**GOOD, "prompts": "mine"}))
    assert err.value.file == str(prompt_file) and err.value.field == field, err.value
    assert words in str(err.value)


def _bad_catalog(tmp_path: Path) -> tuple[Path, Path]:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CATALOG_DIR / "_defaults.yaml", catalog)
    return catalog, write(catalog, {**GOOD, "name": "typo", "engine": {"max_model_lenn": 512}}, name="typo")


# Measured on the 2-core dev box: a run stopped by this card took 4.5-4.7 s of
# wall time, all of it pytest's own start-up (the same `--collect-only` of one
# small test file took 4.4-5.5 s); the card check itself is ~0.1 s. 10 s leaves
# room for a loaded machine and still fails a run that imports vllm (~9 s) or
# builds a model before reading the cards.
COLLECTION_LIMIT_S = 10.0


@needs_vllm
def test_unknown_engine_argument_stops_the_run_at_collection(tmp_path):
    catalog, card_file = _bad_catalog(tmp_path)
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          f"--catalog={catalog}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert str(card_file) in output and "engine.max_model_lenn" in output and "max_model_len?" in output, output
    assert elapsed < COLLECTION_LIMIT_S, f"{elapsed:.1f} s to report a bad card"


@needs_vllm
def test_engine_check_does_not_import_vllm(tmp_path):
    catalog, _ = _bad_catalog(tmp_path)
    probe = ("import sys; from pathlib import Path; from npu_conformance.cards import CardError, load_catalog\n"
             f"try: load_catalog(Path({str(catalog)!r}))\n"
             "except CardError as exc: print(exc.field)\n"
             "print('vllm' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["engine.max_model_lenn", "False"], run.stdout + run.stderr


def test_no_shipped_card_overrides_a_precision_threshold():
    """A faithful card is judged by the catalog's rules alone: a limit raised for
    one dtype or one host's rounding makes the verdict depend on where it ran.
    Only a sensitivity card (expect.verdict: fail) may set what it expects."""
    overriding = sorted(path.name for path in CATALOG_DIR.glob("*.yaml")
                        if not path.name.startswith("_")
                        and "thresholds" in (data := yaml.safe_load(path.read_text(encoding="utf-8")))
                        and data.get("expect", {}).get("verdict", "pass") == "pass")
    assert not overriding, f"cards that override precision thresholds: {overriding}"


def test_thresholds_resolve_for_the_cards_dtype(tmp_path):
    """The dtype floor, the cosine rule and the diagnosis limit follow the target's dtype."""
    by_dtype = {dtype: load_card(write(tmp_path, {**GOOD, "dtype": dtype})).thresholds
                for dtype in ("float32", "float16", "bfloat16")}
    floors = [by_dtype[d].dtype_floor for d in ("float32", "float16", "bfloat16")]
    assert floors == sorted(floors) and floors[0] < floors[-1]
    assert by_dtype["bfloat16"].cosine_rule == "noise" and by_dtype["float16"].cosine_rule == "absolute"
    assert load_card(write(tmp_path, {**GOOD, "dtype": "bfloat16"})).noise_dtype == "bfloat16"
    assert load_card(write(tmp_path, GOOD)).noise_dtype is None
