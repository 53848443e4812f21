"""Tiny, deterministic Llama models built locally for tests, benchmarks and ``kiln demo``.

Owns: a byte-level BPE tokenizer trained on a built-in corpus, a random-weight
``LlamaForCausalLM`` written as safetensors (one or several shards), and a
PEFT-style LoRA adapter for it, all without a network or a model hub.  The
same arguments give byte-identical files.

Imports: the standard library and ``kiln_registry.domain.errors`` at module level;
``tokenizers``, ``torch``, ``transformers`` and ``safetensors`` only inside the
builders (they are the optional ``reference`` extra).  Never imports the API,
database, probe or launcher packages.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln_registry.domain.errors import InputError

SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>")
BOS_ID = 1
EOS_ID = 2
HIDDEN_SIZE = 128
NUM_HEADS = 4
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 256
MAX_POSITIONS = 512
TOKENIZER_ENTRIES = 512
MAX_SHARDS = 8
MAX_MODEL_WIDTH = 65_536
ADAPTER_BASE_NAME = "kiln-tiny-llama"
ADAPTER_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
_SAFETENSORS_METADATA = {"format": "pt"}

# Syllables for the training corpus: 20 x 20 two-syllable words give the BPE
# trainer enough distinct pairs to reach a 512-entry vocabulary.
_SYLLABLES: tuple[str, ...] = (
    "ka", "ve", "zy", "ne", "do", "an", "qu", "to", "pi", "la",
    "mo", "ri", "su", "te", "ge", "bo", "lu", "xe", "fa", "wi",
)  # fmt: skip
_SENTENCE = "the teacher speaks and the student listens to every token. "


@dataclass(frozen=True, slots=True)
class TinyModel:
    """A built tiny model directory and the facts tests check against."""

    path: Path
    model_width: int
    tokenizer_entries: int
    shards: int


def _corpus() -> list[str]:
    words = [a + b for a, b in itertools.product(_SYLLABLES, _SYLLABLES)]
    lines = [_SENTENCE * 3]
    lines.extend(" ".join(words[i : i + 10]) for i in range(0, len(words), 10))
    return lines


def _prepare_dest(dest_dir: Path | str, names: tuple[str, ...]) -> Path:
    dest = Path(dest_dir)
    if dest.exists() and not dest.is_dir():
        raise InputError(f"{dest} exists and is not a directory", rule="tiny_model.dest")
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (dest / name).exists() or (dest / name).is_symlink():
            raise InputError(
                f"{dest / name} already exists; tiny model builders never overwrite",
                rule="tiny_model.dest_not_empty",
            )
    return dest


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _train_bpe(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise InputError(
            f"the built-in corpus gave {tok.get_vocab_size()} tokens, not {vocab_size}",
            rule="tiny_model.vocab_size",
        )
    return tok


def build_tokenizer(dest_dir: Path | str, *, vocab_size: int = TOKENIZER_ENTRIES) -> None:
    """Train a byte-level BPE tokenizer and save it the way Transformers does.

    Writes ``tokenizer.json`` and ``tokenizer_config.json`` (Transformers'
    ``save_pretrained``) plus a ``special_tokens_map.json`` for older readers.
    """
    if not 300 <= vocab_size <= 4096:
        raise InputError(
            f"tokenizer vocab_size {vocab_size} is outside 300..=4096",
            rule="tiny_model.vocab_size",
        )
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    dest = _prepare_dest(dest_dir, names)
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _train_bpe(vocab_size)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(str(dest))
    _write_json(
        dest / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    )


def _check_model_args(model_width: int | None, shards: int, dtype: str) -> int:
    width = TOKENIZER_ENTRIES if model_width is None else model_width
    if isinstance(width, bool) or not TOKENIZER_ENTRIES <= width <= MAX_MODEL_WIDTH:
        raise InputError(
            f"model_width {width!r} must be an integer in {TOKENIZER_ENTRIES}..={MAX_MODEL_WIDTH}"
            " (at least the tokenizer size)",
            rule="tiny_model.model_width",
        )
    if isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise InputError(f"shards {shards!r} must be in 1..={MAX_SHARDS}", rule="tiny_model.shards")
    if dtype not in _DTYPES:
        raise InputError(
            f"dtype {dtype!r} is not one of {', '.join(_DTYPES)}", rule="tiny_model.dtype"
        )
    return width


def _shard_names(shards: int) -> tuple[str, ...]:
    if shards == 1:
        return ("model.safetensors",)
    return tuple(f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1))


def _split_shards(tensors: dict[str, Any], shards: int) -> list[dict[str, Any]]:
    """Contiguous groups of tensors (module order) with roughly equal byte sizes."""
    sizes = {name: t.numel() * t.element_size() for name, t in tensors.items()}
    target = sum(sizes.values()) / shards
    groups: list[dict[str, Any]] = [{} for _ in range(shards)]
    filled = 0
    for name, tensor in tensors.items():
        # A tensor goes to the shard that holds the midpoint of its bytes.
        index = min(shards - 1, int((filled + sizes[name] / 2) // target))
        groups[index][name] = tensor
        filled += sizes[name]
    if any(not group for group in groups):
        raise InputError(
            f"{shards} shards leave one empty for this model", rule="tiny_model.shards"
        )
    return groups


def _write_weights(dest: Path, tensors: dict[str, Any], shards: int) -> None:
    from safetensors.torch import save_file

    names = _shard_names(shards)
    groups = _split_shards(tensors, shards)
    weight_map: dict[str, str] = {}
    for file_name, group in zip(names, groups, strict=True):
        save_file(group, str(dest / file_name), metadata=dict(_SAFETENSORS_METADATA))
        weight_map.update(dict.fromkeys(group, file_name))
    if shards > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_json(dest / "model.safetensors.index.json", index)


def _llama_config(width: int, dtype: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=width,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        dtype=dtype,
    )


def build_tiny_llama(
    dest_dir: Path | str,
    *,
    seed: int = 0,
    model_width: int | None = None,
    shards: int = 1,
    dtype: str = "float32",
) -> TinyModel:
    """Build a 2-layer random Llama (hidden 128, 4 heads of 32) with its tokenizer.

    ``model_width`` above the tokenizer's 512 entries pads the embedding and
    output rows (``config.vocab_size`` > tokenizer entries).
    """
    width = _check_model_args(model_width, shards, dtype)
    index_name = ("model.safetensors.index.json",) if shards > 1 else ()
    dest = _prepare_dest(dest_dir, ("config.json", *_shard_names(shards), *index_name))
    build_tokenizer(dest, vocab_size=TOKENIZER_ENTRIES)
    import torch
    from transformers import LlamaForCausalLM

    config = _llama_config(width, dtype)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    torch_dtype = getattr(torch, dtype)
    tensors = {
        name: t.detach().to(torch_dtype).contiguous() for name, t in model.state_dict().items()
    }
    _write_weights(dest, tensors, shards)
    config.to_json_file(str(dest / "config.json"), use_diff=False)
    return TinyModel(
        path=dest, model_width=width, tokenizer_entries=TOKENIZER_ENTRIES, shards=shards
    )


def _adapter_config(r: int) -> dict[str, Any]:
    return {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": ADAPTER_BASE_NAME,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": 2 * r,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": r,
        "rank_pattern": {},
        "revision": None,
        "target_modules": list(ADAPTER_TARGETS),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def _projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    # (in_features, out_features) of each targeted projection
    return {"q_proj": (hidden, heads * head_dim), "v_proj": (hidden, kv_heads * head_dim)}


def build_peft_adapter(dest_dir: Path | str, *, base: TinyModel, r: int = 8, seed: int = 0) -> None:
    """Write a PEFT LoRA adapter (q_proj, v_proj) for ``base`` without the peft package.

    Tensor names follow PEFT's saved form:
    ``base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight``
    with ``lora_A`` of shape (r, in) and ``lora_B`` of shape (out, r).  Both are
    random (PEFT would start ``lora_B`` at zero) so the adapter changes outputs.
    """
    if isinstance(r, bool) or not 1 <= r <= 512:
        raise InputError(f"adapter rank r={r!r} is outside 1..=512", rule="tiny_model.rank")
    dest = _prepare_dest(dest_dir, ("adapter_config.json", "adapter_model.safetensors"))
    config = json.loads((base.path / "config.json").read_text(encoding="utf-8"))
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    shapes = _projection_shapes(config)
    for layer in range(int(config["num_hidden_layers"])):
        for target in ADAPTER_TARGETS:
            fan_in, fan_out = shapes[target]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, fan_in, generator=generator) * 0.05
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, r, generator=generator) * 0.05
    save_file(
        tensors, str(dest / "adapter_model.safetensors"), metadata=dict(_SAFETENSORS_METADATA)
    )
    _write_json(dest / "adapter_config.json", _adapter_config(r))
