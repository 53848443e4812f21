"""Response-allocation bounds (identity-spec.md section 6).

Owns the arithmetic that ties ``max_prompt_logprob_candidates`` to
``max_top_k``, ``vocab_size`` and ``max_model_len``:

    row_width = min(max_top_k + 1, vocab_size)
    row_width <= candidates <= min(1_000_000, max_model_len * row_width)

A row may hold ``max_top_k + 1`` candidates because vLLM can return the
sampled token beside the requested top-K.  Refusals are ``IdentityError``
with ``rule="bounds.<name>"``.  Imports: standard library and
``kiln_registry.errors`` only.
"""

from __future__ import annotations

from kiln_registry.errors import IdentityError

MAX_CANDIDATES = 1_000_000


def _positive(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise IdentityError(
            f"{name} must be an integer, got {type(value).__name__}", rule="bounds.type"
        )
    if value < 1:
        raise IdentityError(f"{name} must be at least 1, got {value}", rule="bounds.range")
    return value


def row_width(max_top_k: int, vocab_size: int) -> int:
    """Most candidates one prompt position can carry."""
    top_k = _positive(max_top_k, "max_top_k")
    vocab = _positive(vocab_size, "vocab_size")
    return min(top_k + 1, vocab)


def candidate_ceiling(max_top_k: int, vocab_size: int, max_model_len: int) -> int:
    """The largest allowed ``max_prompt_logprob_candidates``."""
    width = row_width(max_top_k, vocab_size)
    length = _positive(max_model_len, "max_model_len")
    return min(MAX_CANDIDATES, length * width)


def default_max_candidates(max_top_k: int, vocab_size: int, max_model_len: int) -> int:
    """The value used when the operator omits the option: the ceiling itself."""
    return candidate_ceiling(max_top_k, vocab_size, max_model_len)


def validate_max_candidates(
    value: int, *, max_top_k: int, vocab_size: int, max_model_len: int
) -> int:
    """Return ``value`` if it lies within section 6's bounds, else refuse naming the bound."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise IdentityError(
            f"max_prompt_logprob_candidates must be an integer, got {type(value).__name__}",
            rule="bounds.type",
        )
    width = row_width(max_top_k, vocab_size)
    if value < width:
        raise IdentityError(
            f"max_prompt_logprob_candidates {value} is below one full row"
            f" (min(max_top_k + 1, vocab_size) = {width})",
            rule="bounds.below_row_width",
        )
    if value > MAX_CANDIDATES:
        raise IdentityError(
            f"max_prompt_logprob_candidates {value} exceeds {MAX_CANDIDATES}",
            rule="bounds.above_max",
        )
    length = _positive(max_model_len, "max_model_len")
    if value > length * width:
        raise IdentityError(
            f"max_prompt_logprob_candidates {value} exceeds max_model_len * row_width"
            f" = {length} * {width} = {length * width}",
            rule="bounds.above_model_len",
        )
    return value
