"""The tiny model builders: determinism, loadability and each variant's properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.digests import adapter_rank_cap
from kiln_registry.testing.tiny_models import (
    TinyModel,
    build_peft_adapter,
    build_tiny_llama,
    build_tokenizer,
)


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _weights(model: TinyModel) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model.path.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def test_same_seed_gives_byte_identical_files(tmp_path: Path, tiny_model: TinyModel) -> None:
    again = build_tiny_llama(tmp_path / "again")
    assert _files(again.path) == _files(tiny_model.path)


def test_other_seed_changes_weights_only(tmp_path: Path, tiny_model: TinyModel) -> None:
    other = build_tiny_llama(tmp_path / "seed1", seed=1)
    theirs, ours = _files(other.path), _files(tiny_model.path)
    assert theirs["model.safetensors"] != ours["model.safetensors"]
    assert theirs["tokenizer.json"] == ours["tokenizer.json"]
    assert theirs["config.json"] == ours["config.json"]


def test_layout_and_config(tiny_model: TinyModel) -> None:
    assert sorted(p.name for p in tiny_model.path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((tiny_model.path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_attention_heads"]) == (128, 4)
    assert config["hidden_size"] // config["num_attention_heads"] == 32
    assert (config["num_hidden_layers"], config["max_position_embeddings"]) == (2, 512)
    assert config["vocab_size"] == tiny_model.model_width == tiny_model.tokenizer_entries == 512
    assert config["tie_word_embeddings"] is False


def test_loads_with_transformers_local_files_only(tiny_model: TinyModel) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model.path), local_files_only=True)
    assert len(tokenizer) == 512
    ids = tokenizer("the teacher").input_ids
    assert ids[0] == tokenizer.bos_token_id == 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the teacher"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model.path), local_files_only=True)
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 512)


def test_sharded_variant_has_index_and_same_tensors(
    tiny_model: TinyModel, tiny_model_sharded: TinyModel
) -> None:
    root = tiny_model_sharded.path
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert not (root / "model.safetensors").exists()
    sharded, single = _weights(tiny_model_sharded), _weights(tiny_model)
    assert sorted(index["weight_map"]) == sorted(sharded) == sorted(single)
    assert all(torch.equal(sharded[name], single[name]) for name in single)
    total = sum(t.numel() * t.element_size() for t in single.values())
    assert index["metadata"]["total_size"] == total


def test_padded_variant_is_wider_than_its_tokenizer(tiny_model_padded: TinyModel) -> None:
    assert (tiny_model_padded.model_width, tiny_model_padded.tokenizer_entries) == (544, 512)
    config = json.loads((tiny_model_padded.path / "config.json").read_text())
    assert config["vocab_size"] == 544
    weights = _weights(tiny_model_padded)
    assert weights["model.embed_tokens.weight"].shape == (544, 128)
    assert weights["lm_head.weight"].shape == (544, 128)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_padded.path), local_files_only=True)
    assert len(tokenizer) == 512


def test_adapter_is_peft_shaped(tiny_adapter: Path) -> None:
    config = json.loads((tiny_adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["target_modules"] == ["q_proj", "v_proj"]
    assert (config["r"], config["rank_pattern"]) == (8, {})
    assert adapter_rank_cap(config) == 8
    tensors = load_file(tiny_adapter / "adapter_model.safetensors")
    assert len(tensors) == 2 * 2 * 2  # layers x targets x (A, B)
    prefix = "base_model.model.model.layers.1.self_attn"
    assert tensors[f"{prefix}.q_proj.lora_A.weight"].shape == (8, 128)
    assert tensors[f"{prefix}.v_proj.lora_B.weight"].shape == (128, 8)


def test_adapter_is_deterministic(
    tmp_path: Path, tiny_model: TinyModel, tiny_adapter: Path
) -> None:
    build_peft_adapter(tmp_path / "again", base=tiny_model)
    assert _files(tmp_path / "again") == _files(tiny_adapter)


def test_builders_never_overwrite(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    with pytest.raises(InputError) as caught:
        build_tokenizer(tmp_path)
    assert caught.value.rule == "tiny_model.dest_not_empty"
    assert "tokenizer.json" in caught.value.message


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"model_width": 511}, "tiny_model.model_width"),
        ({"shards": 0}, "tiny_model.shards"),
        ({"shards": 9}, "tiny_model.shards"),
        ({"dtype": "int8"}, "tiny_model.dtype"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict[str, object], rule: str) -> None:
    with pytest.raises(InputError) as caught:
        build_tiny_llama(tmp_path / "m", **kwargs)  # type: ignore[arg-type]
    assert caught.value.rule == rule
    assert not (tmp_path / "m").exists()


def test_inspection_accepts_the_tiny_models(
    tiny_model: TinyModel, tiny_model_sharded: TinyModel, tiny_model_padded: TinyModel
) -> None:
    from kiln_registry.identity.hashing import ReadRateLimiter
    from kiln_registry.model.inspect import inspect_model

    single = inspect_model(tiny_model.path, limiter=ReadRateLimiter(None))
    sharded = inspect_model(tiny_model_sharded.path, limiter=ReadRateLimiter(None))
    padded = inspect_model(tiny_model_padded.path, limiter=ReadRateLimiter(None))
    assert (single.vocab_size, single.tokenizer_entries) == (512, 512)
    assert (padded.vocab_size, padded.tokenizer_entries) == (544, 512)
    assert sharded.tokenizer_vocab_sha256 == single.tokenizer_vocab_sha256
    assert sharded.base_model_sha256 != single.base_model_sha256
