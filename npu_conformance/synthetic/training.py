"""A recipe's trained base checkpoint: its tokenizer, then a model trained on CPU,
fp32, on the corpus, saved with the layout of a Hugging Face checkpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npu_conformance.synthetic.files import now, versions, write_json
from npu_conformance.synthetic.recipes import read_corpus
from npu_conformance.synthetic.tokenizer import save_tokenizer, train_tokenizer


def build_base(recipe: str, spec: Mapping[str, Any], key: str, out: Path) -> None:
    """Train `recipe` into `out`, build.json (with `key`) last."""
    import torch

    started = time.monotonic()
    entry = spec["recipes"][recipe]
    tok_spec = spec["tokenizer"]
    train = entry["train"]
    docs = read_corpus(spec["corpus"], tok_spec["eos_token"])
    tokenizer = train_tokenizer(docs, tok_spec, entry["config"]["vocab_size"])
    save_tokenizer(tokenizer, tok_spec, entry["config"]["max_position_embeddings"], out)

    threads = torch.get_num_threads()
    torch.set_num_threads(train["threads"])
    try:
        model, losses = _train_model(entry, tokenizer, tok_spec, docs)
    finally:
        torch.set_num_threads(threads)
    if "sharpen" in entry:
        # A logit temperature of 1/sharpen: every argmax stays, the distributions peak.
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(entry["sharpen"])
    model.save_pretrained(out)

    tail = losses[-10:]
    write_json(
        out / "build.json",
        {
            "recipe": recipe,
            "key": key,
            "built_at": now(),
            "build_seconds": round(time.monotonic() - started, 1),
            "initial_loss": round(losses[0], 4),
            "final_loss": round(sum(tail) / len(tail), 4),  # mean of the last steps
            "train": train,
            "versions": versions(),
        },
    )


def _train_model(
    entry: Mapping[str, Any], tokenizer: Any, tok_spec: Mapping[str, Any], docs: list[str]
) -> tuple[Any, list[float]]:
    import torch
    import transformers

    train = entry["train"]
    eos = tokenizer.token_to_id(tok_spec["eos_token"])
    model_cls = getattr(transformers, entry["architecture"])
    config = model_cls.config_class(
        **entry["config"],
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tokenizer.token_to_id(tok_spec["pad_token"]),
        dtype="float32",
    )
    torch.manual_seed(train["seed"])
    model = model_cls(config).float()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=None,
        eos_token_id=[tokenizer.token_to_id(t) for t in tok_spec["stop_tokens"]],
        pad_token_id=config.pad_token_id,
    )

    encoded = [tokenizer.encode(d, add_special_tokens=False).ids + [eos] for d in docs]
    generator = torch.Generator().manual_seed(train["seed"])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train["lr"], betas=(0.9, 0.95), weight_decay=train["weight_decay"]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, train))
    model.train()
    losses = []
    for _ in range(train["steps"]):
        batch = _sample_batch(encoded, train, generator)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return model, losses


def _lr_factor(step: int, train: Mapping[str, Any]) -> float:
    """Linear warm-up, then cosine decay to final_lr_fraction."""
    if step < train["warmup_steps"]:
        return (step + 1) / train["warmup_steps"]
    progress = (step - train["warmup_steps"]) / max(1, train["steps"] - train["warmup_steps"])
    floor = train["final_lr_fraction"]
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _sample_batch(encoded: list[list[int]], train: Mapping[str, Any], generator: Any) -> Any:
    import torch

    def pick(n: int) -> int:
        return int(torch.randint(n, (), generator=generator))

    repeat = train.get("repeat")
    if repeat and float(torch.rand((), generator=generator)) < repeat["share"]:
        # Long rows of one document chunk repeated, as the long prompts are built: the
        # model learns to copy (induction) at every position up to `length`, so it is
        # as confident on a long prompt's repeats as a real checkpoint is.
        low, high = repeat["chunk"]
        rows = []
        for _ in range(max(1, train["batch_size"] * train["seq_len"] // repeat["length"])):
            doc = encoded[pick(len(encoded))]
            size = low + pick(high - low + 1)
            start = pick(max(1, len(doc) - size))
            chunk = doc[start:start + size]
            rows.append((chunk * (repeat["length"] // len(chunk) + 1))[:repeat["length"]])
        return torch.tensor(rows, dtype=torch.long)
    # Every row starts at a document start, as a prompt does (there is no BOS), and
    # continues with random further documents, so eos -> new document is learned too.
    rows = []
    for _ in range(train["batch_size"]):
        row: list[int] = []
        while len(row) < train["seq_len"]:
            row += encoded[pick(len(encoded))]
        rows.append(row[:train["seq_len"]])
    return torch.tensor(rows, dtype=torch.long)
