"""Small model directories for the model, identity and CLI tests.

Built with the ``tokenizers`` library only (no torch, no transformers):
a tiny byte-level BPE tokenizer, a config.json with ``vocab_size`` and fake
``.safetensors``-named shards (shard selection only needs bytes).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

CORPUS = ("hello world", "the quick brown fox jumps", "héllo wörld ✓ teacher student")


@functools.cache
def tokenizer_json() -> str:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(list(CORPUS), trainer=trainer)
    tok.add_tokens(["<extra>"])
    return tok.to_str()


def tokenizer_entries() -> int:
    return Tokenizer.from_str(tokenizer_json()).get_vocab_size(with_added_tokens=True)


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value), encoding="utf-8")


def write_model(
    root: Path,
    *,
    shards: dict[str, bytes] | None = None,
    vocab_size: int | None = 128,
    config: dict[str, object] | None = None,
    transformers_config: bool = True,
) -> Path:
    """A model directory; ``shards`` maps relative paths to bytes."""
    root.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = {"model_type": "llama"}
        if vocab_size is not None:
            config["vocab_size"] = vocab_size
    write_json(root / "config.json", config)
    (root / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    if transformers_config:
        write_json(root / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})
    for rel, data in (
        shards if shards is not None else {"model.safetensors": b"weight-v1"}
    ).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def write_adapter(
    root: Path, *, r: int = 8, weights: str = "adapter_model.safetensors", data: bytes = b"lora"
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "adapter_config.json", {"r": r, "peft_type": "LORA"})
    (root / weights).write_bytes(data)
    return root
