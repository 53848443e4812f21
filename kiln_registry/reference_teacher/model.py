"""The reference teacher's model: eager Transformers on CPU in float32.

Owns loading a local model directory (no hub, no remote code), the prompt
logprob rows (``torch.log_softmax`` of the eager logits, exactly), vLLM's rank
rule, a deterministic top-K (ties: lower token id first), token decoding the
way vLLM reports ``decoded_token``, and bounded greedy generation.

Imports: standard library, torch, ``kiln_registry.domain.errors`` and
``reference_teacher.protocol`` / ``responses``; transformers only inside ``load``.  Never the
API, database, probe or launcher packages.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.reference_teacher.protocol import Limits
from kiln_registry.reference_teacher.responses import PositionScores, ScoredPrompt
from kiln_registry.reference_teacher.sampling import GREEDY, Sampling, next_token

RANK_CHUNK_ROWS = 256
MAX_DECODE_CACHE = 1 << 20
_REPLACEMENT = "\ufffd"


def _checked_int(value: object, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(
            f"{name} must be an integer in {low}..={high}, got {value!r}",
            rule=f"reference.{name}",
        )
    return value


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist", rule="reference.model_path")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} is not readable JSON: {exc}", rule="reference.config") from None
    if not isinstance(config, dict):
        raise InputError(f"{path} is not a JSON object", rule="reference.config")
    return config


def _check_limits(config: dict[str, Any], max_top_k: int, max_model_len: int) -> int:
    """The model width, after checking top-K and length against config.json."""
    width = _checked_int(config.get("vocab_size"), "vocab_size", 1, 16_777_216)
    positions = _checked_int(
        config.get("max_position_embeddings", 16_777_216), "max_position_embeddings", 1, 16_777_216
    )
    _checked_int(max_top_k, "max_top_k", 1, min(65_536, width))
    _checked_int(max_model_len, "max_model_len", 1, positions)
    return width


def _load_local(model_dir: Path) -> tuple[Any, Any]:
    """Fast tokenizer and float32 model from local files only, no remote code."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # The loading bar would be the only stderr output of a healthy start.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = AutoTokenizer.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=False, use_fast=True
    )
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        local_files_only=True,
        trust_remote_code=False,
        use_safetensors=True,
        dtype=torch.float32,
    )
    model.eval()
    return tokenizer, model


def top_entries(logprobs: torch.Tensor, top_k: int) -> list[tuple[tuple[int, float], ...]]:
    """Per row, the ``top_k`` best (id, logprob), best first, ties by lower id."""
    rows = logprobs.shape[0]
    if top_k == 0 or rows == 0:
        return [() for _ in range(rows)]
    values, ids = torch.topk(logprobs, top_k, dim=1)
    kth = values[:, -1:]
    crowded = (logprobs >= kth).sum(dim=1) > top_k
    tied = (values[:, 1:] == values[:, :-1]).any(dim=1)
    # torch.topk orders ties arbitrarily; redo only the rows where a tie matters.
    for row in (crowded | tied).nonzero().flatten().tolist():
        candidates = (logprobs[row] >= kth[row]).nonzero().flatten()
        order = torch.sort(logprobs[row, candidates], descending=True, stable=True).indices
        ids[row] = candidates[order[:top_k]]
        values[row] = logprobs[row, ids[row]]
    return [
        tuple(zip(id_row, value_row, strict=True))
        for id_row, value_row in zip(ids.tolist(), values.tolist(), strict=True)
    ]


def true_ranks(logprobs: torch.Tensor, actual: torch.Tensor) -> list[int]:
    """vLLM's rank: how many entries have a logprob >= the actual token's."""
    ranks: list[int] = []
    for block, scores in zip(
        torch.split(logprobs, RANK_CHUNK_ROWS), torch.split(actual, RANK_CHUNK_ROWS), strict=True
    ):
        ranks.extend((block >= scores.unsqueeze(1)).sum(dim=1).tolist())
    return ranks


def prompt_rows(
    logprobs: torch.Tensor, targets: torch.Tensor, top_k: int
) -> tuple[PositionScores, ...]:
    """Rows for positions 1..T-1: ``logprobs[p]`` scores ``targets[p]``."""
    actual = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    ranks = true_ranks(logprobs, actual)
    tops = top_entries(logprobs, top_k)
    return tuple(
        PositionScores(token_id=t, logprob=lp, rank=r, top=top)
        for t, lp, r, top in zip(targets.tolist(), actual.tolist(), ranks, tops, strict=True)
    )


class ReferenceTeacher:
    """A loaded model plus what it serves; thread-safe (one forward at a time)."""

    def __init__(
        self,
        *,
        model: Any,
        tokenizer: Any,
        served_model_id: str,
        max_top_k: int,
        max_model_len: int,
        vocab_width: int,
        system_fingerprint: str,
        version: str,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._decoded: dict[int, str] = {}
        self.system_fingerprint = system_fingerprint
        self.version = version
        self.limits = Limits(
            served_model_id=served_model_id,
            max_top_k=max_top_k,
            max_model_len=max_model_len,
            vocab_width=vocab_width,
            max_token_id=len(tokenizer) - 1,
        )
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos: int | None = eos if isinstance(eos, int) else None

    def __repr__(self) -> str:
        return f"ReferenceTeacher(served_model_id={self.limits.served_model_id!r})"

    @classmethod
    def load(
        cls,
        model_path: Path | str,
        *,
        served_model_id: str,
        max_top_k: int,
        max_model_len: int,
        system_fingerprint: str,
        version: str = "",
    ) -> ReferenceTeacher:
        """Load a local model directory in float32 on CPU, refusing bad limits."""
        model_dir = Path(model_path)
        width = _check_limits(_read_config(model_dir), max_top_k, max_model_len)
        tokenizer, model = _load_local(model_dir)
        return cls(
            model=model,
            tokenizer=tokenizer,
            served_model_id=served_model_id,
            max_top_k=max_top_k,
            max_model_len=max_model_len,
            vocab_width=width,
            system_fingerprint=system_fingerprint,
            version=version,
        )

    def decode_token(self, token_id: int) -> str:
        """``decode([id])`` like vLLM: "" past the tokenizer or for a partial UTF-8 byte."""
        cached = self._decoded.get(token_id)
        if cached is not None:
            return cached
        text = ""
        if 0 <= token_id <= self.limits.max_token_id:
            text = self._tokenizer.decode([token_id])
            if text.endswith(_REPLACEMENT):
                text = ""
        if len(self._decoded) < MAX_DECODE_CACHE:
            self._decoded[token_id] = text
        return text

    def logprobs(self, prompt: Sequence[int]) -> torch.Tensor:
        """``log_softmax`` of the eager logits for every position of ``prompt``."""
        with self._lock, torch.no_grad():
            logits = self._model(torch.tensor([list(prompt)], dtype=torch.long)).logits
            return torch.log_softmax(logits[0].float(), dim=-1)

    def score(
        self,
        prompt: Sequence[int],
        top_k: int | None,
        max_tokens: int,
        sampling: Sampling = GREEDY,
    ) -> ScoredPrompt:
        """Prompt logprob rows (or None) and a continuation of ``max_tokens`` (``sampling``)."""
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        with self._lock, torch.no_grad():
            out = self._model(ids)
            logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
            if torch.isnan(logprobs).any():
                raise KilnError("the model produced NaN logprobs", code="reference_model_nan")
            rows = None
            if top_k is not None:
                rows = prompt_rows(logprobs[:-1], ids[0, 1:], top_k)
            generated, gen_rows, finish = self._decode(out, max_tokens, sampling)
        kept = [t for t in generated if t != self._eos]
        text = self._tokenizer.decode(kept, skip_special_tokens=True) if kept else ""
        return ScoredPrompt(
            token_count=len(prompt),
            rows=rows,
            text=text.rstrip(_REPLACEMENT),
            completion_tokens=len(generated),
            finish_reason=finish,
            token_ids=tuple(generated),
            prompt_ids=tuple(prompt),
            gen_rows=gen_rows,
        )

    def _step_row(self, logits: torch.Tensor, token: int, k: int) -> PositionScores:
        """The generated token's raw logprob, its true rank and the top ``k`` entries."""
        logprobs = torch.log_softmax(logits.float(), dim=-1).unsqueeze(0)
        if torch.isnan(logprobs).any():
            raise KilnError("the model produced NaN logprobs", code="reference_model_nan")
        return prompt_rows(logprobs, torch.tensor([token]), k)[0]

    def _decode(
        self, out: Any, max_tokens: int, sampling: Sampling
    ) -> tuple[list[int], tuple[PositionScores, ...] | None, str]:
        """Tokens from the prompt's last position (greedy or sampled), stopping at EOS."""
        tokens: list[int] = []
        rows: list[PositionScores] = []
        generator = sampling.generator()
        logits, past = out.logits[0, -1], out.past_key_values
        for step in range(max_tokens):
            token = next_token(logits, sampling, generator)
            tokens.append(token)
            if sampling.logprobs is not None:
                rows.append(self._step_row(logits, token, sampling.logprobs))
            if token == self._eos:
                return tokens, self._rows(rows, sampling), "stop"
            if step + 1 < max_tokens:
                nxt = self._model(
                    torch.tensor([[token]], dtype=torch.long), past_key_values=past, use_cache=True
                )
                logits, past = nxt.logits[0, -1], nxt.past_key_values
        return tokens, self._rows(rows, sampling), "length"

    @staticmethod
    def _rows(rows: list[PositionScores], sampling: Sampling) -> tuple[PositionScores, ...] | None:
        return tuple(rows) if sampling.logprobs is not None else None
