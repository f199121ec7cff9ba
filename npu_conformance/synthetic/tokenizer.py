"""The synthetic checkpoints' tokenizer: byte-level BPE trained on the corpus with
`tokenizers`, written in the files transformers and vLLM read."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npu_conformance.synthetic.files import write_json

# Pre-tokenizer split, applied before the byte-level mapping. Unlike GPT-2's, it keeps
# the text where a prompt usually ends on the same token boundary as in training:
# runs of 2+ spaces/tabs (indentation) are their own piece instead of lending a space to
# the next word, so "\n    " ending a prompt is tokenized as in "\n    if ..."; every Han
# character is its own piece, so "我们一起去" is not a prefix of a merged "去公园";
# digits are single pieces. Otherwise: an optional space plus letters, or punctuation.
_PRETOKENIZE = (
    r"\r?\n|[ \t]{2,}|\p{Han}| ?[^\s\p{N}\p{P}\p{S}\p{Han}]+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+"
)


def train_tokenizer(docs: list[str], tok_spec: Mapping[str, Any], vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` of exactly `vocab_size` tokens, trained on `docs`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = tok_spec["special_tokens"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte stays encodable
        show_progress=False,
    )
    # Training does not split out special tokens, so keep them out of the merge counts.
    special = re.compile("|".join(re.escape(s) for s in specials))
    tokenizer.train_from_iterator([special.sub("", d) for d in docs], trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"corpus too small for a vocabulary of {vocab_size}: got {tokenizer.get_vocab_size()}"
        )
    return tokenizer


def save_tokenizer(tokenizer: Any, tok_spec: Mapping[str, Any], max_len: int, out: Path) -> None:
    """tokenizer.json, special_tokens_map.json and tokenizer_config.json into `out`."""
    # Written by hand rather than by save_pretrained: transformers 5 would name its own
    # "TokenizersBackend" class and put the template in chat_template.jinja, which older
    # transformers (an accelerator host's image may have one) cannot read.
    tokenizer.save(str(out / "tokenizer.json"))
    extra = [t for t in tok_spec["special_tokens"] if t not in (tok_spec["eos_token"], tok_spec["pad_token"])]
    special = {
        "bos_token": None,
        "eos_token": tok_spec["eos_token"],
        "pad_token": tok_spec["pad_token"],
        "additional_special_tokens": extra,
    }
    write_json(out / "special_tokens_map.json", special)
    write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "model_max_length": max_len,
            "clean_up_tokenization_spaces": False,
            "chat_template": tok_spec["chat_template"],
        },
    )
