"""Card loading and validation: every shipped card loads, and a bad card fails
with one message naming the file and the field."""

from pathlib import Path

import pytest
import yaml

from fixtures.cards import CardError, adhoc_card, load_card, load_catalog

pytestmark = pytest.mark.unit

GOOD = {"name": "x", "architecture": "LlamaForCausalLM", "weights": {"synthetic": "llama"}}


def write(tmp_path: Path, data: dict, name: str = "x") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_catalog_loads_with_defaults_applied():
    catalog = load_catalog()
    assert {"synthetic-llama", "synthetic-granite", "synthetic-llama-bf16"} <= {n for n, c in catalog.items() if c.default}
    llama = catalog["synthetic-llama"]
    assert llama.thresholds.logprob_rel_err == 0.01 and llama.thresholds.cosine == 0.9999
    assert llama.trust_remote_code is False
    assert [p.id for p in llama.prompts][:1] == ["en_capital"]


def test_seed_cards_name_their_sources_and_patches():
    catalog = load_catalog()
    assert catalog["qwen1.5-0.5b-chat-gptq-int4"].weights.kind == "modelscope"
    assert catalog["qwen1.5-0.5b-chat-gptq-int4"].patch == "gptq"
    assert catalog["qwen3-4b-thinking-2507-fp8"].patch == "fp8_block"
    assert catalog["granite-4.1-8b"].platform("npu").perf.baseline_tok_s == {1: 21.0, 8: 120.0}


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
        ({"weights": {"synthetic": "llama", "hf": "a/b"}}, "weights", "exactly one of"),
        ({"weights": {"hf": "a/b", "mutate": {"zero": []}}}, "weights.mutate", "only synthetic"),
        ({"prompts": "nope"}, "prompts", "no prompt set"),
        ({"prompts": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}, "prompts", "duplicate"),
        ({"platforms": {"tpu": {}}}, "platforms.tpu", "unknown platform"),
        ({"platforms": {"cpu": {"env": {"X": 1}}}}, "platforms.cpu.env.X", "strings"),
        ({"platforms": {"npu": {"perf": {"batch_sizes": [1], "input_len": 8, "output_len": 8, "rounds": 1,
                                         "warmup_rounds": 0, "baseline_tok_s": {1: 10}}}}},
         "platforms.npu.perf.slack", "is required"),
        ({"platforms": {"npu": {"perf": {"batch_sizes": [1], "input_len": 8, "output_len": 8, "rounds": 1,
                                         "warmup_rounds": 0, "floor_tok_s": {4: 10}}}}},
         "platforms.npu.perf.floor_tok_s", "not in batch_sizes"),
        ({"engine": {"dtype": "float16"}}, "engine.dtype", "set by the suite"),
        ({"expect": {"verdict": "fail"}}, "expect.caught_by", "is required"),
        ({"architecture": None}, "architecture", "is required"),
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
