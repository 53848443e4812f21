"""Generation settings of the reference teacher and its next-token choice.

``Sampling`` is what a request asks of the generated tokens: ``temperature``
(absent or 0 is greedy: ``argmax`` of the raw logits, exactly what
Transformers' greedy decoding picks), ``top_p``, ``seed`` (a per-request
``torch.Generator``; a fresh random seed when absent), ``logprobs`` (top
entries per generated token, None for none), ``return_token_ids`` and
``return_tokens_as_token_ids`` (vLLM's switches).  Logprobs are vLLM's
``raw_logprobs``: ``log_softmax`` of the unscaled logits, whatever the
temperature.

Imports: standard library and torch only.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool = False
    tokens_as_ids: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator | None:
        if self.greedy:
            return None
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return torch.Generator().manual_seed(seed)


GREEDY = Sampling()


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token id from one row of raw logits."""
    if sampling.greedy or generator is None:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < sampling.top_p
        keep[0] = True
        filtered = torch.zeros_like(probs)
        filtered[order[keep]] = ordered[keep]
        probs = filtered / filtered.sum()
    return int(torch.multinomial(probs, 1, generator=generator))
