"""Response-allocation bounds (docs/identity.md section 6, as Kiln validates them).

Owns the arithmetic that ties ``max_prompt_logprob_candidates`` to
``max_top_k`` and ``vocab_size``, with the relations Kiln's
``TeacherIdentityV1::validate`` makes (crates/kiln-train/src/teacher_identity.rs)::

    row_width = min(max_top_k + 1, vocab_size)
    row_width <= candidates <= 1_000_000

The server's ``validate()`` does not relate the budget to ``max_model_len``,
so neither does the identity here: a budget above ``max_model_len *
row_width`` is a valid identity, and a response is simply bounded by the
smaller of the two (``allocation_bound``).  Kiln's launcher is stricter: its
``build_identity`` (``scripts/vllm_teacher.py``) refuses a budget above
``max_model_len * row_width``, and so does this project's launcher
(``check_launcher_budget``, applied with ``launcher_strict``).
``default_max_candidates`` (the value a launch uses when the option is
omitted) is ``min(1_000_000, max_model_len * row_width)``.  A row may hold
``max_top_k + 1`` candidates because vLLM can return the observed token beside
the requested top-K.  Refusals are ``IdentityError`` with
``rule="bounds.<name>"``.  Imports: standard library and
``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

from kiln_registry.domain.errors import IdentityError

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
    """Most candidates a response of at most ``max_model_len`` positions can carry (<= 1M)."""
    width = row_width(max_top_k, vocab_size)
    length = _positive(max_model_len, "max_model_len")
    return min(MAX_CANDIDATES, length * width)


def default_max_candidates(max_top_k: int, vocab_size: int, max_model_len: int) -> int:
    """The value used when the operator omits the option: ``candidate_ceiling``."""
    return candidate_ceiling(max_top_k, vocab_size, max_model_len)


def validate_max_candidates(
    value: int, *, max_top_k: int, vocab_size: int, max_model_len: int
) -> int:
    """Return ``value`` if Kiln's ``validate()`` accepts it, else refuse naming the bound.

    ``max_model_len`` is checked to be a positive integer but bounds nothing
    here (Kiln makes no such relation); see ``allocation_bound``.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise IdentityError(
            f"max_prompt_logprob_candidates must be an integer, got {type(value).__name__}",
            rule="bounds.type",
        )
    width = row_width(max_top_k, vocab_size)
    _positive(max_model_len, "max_model_len")
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
    return value


def check_launcher_budget(
    value: int, *, max_top_k: int, vocab_size: int, max_model_len: int
) -> None:
    """Refuse a budget above ``max_model_len * row_width``, as Kiln's launcher does.

    Kiln's ``build_identity`` accepts ``row_width <= value <= min(1_000_000,
    max_model_len * row_width)``; ``validate_max_candidates`` checks the rest.
    """
    width = row_width(max_top_k, vocab_size)
    ceiling = _positive(max_model_len, "max_model_len") * width
    if value > ceiling:
        raise IdentityError(
            f"max_prompt_logprob_candidates {value} exceeds max_model_len * min(max_top_k + 1,"
            f" vocab_size) = {max_model_len} * {width} = {ceiling}: no response can carry more"
            " (Kiln's launcher refuses it)",
            rule="bounds.above_model_len",
            hint=f"omit the option (default {min(MAX_CANDIDATES, ceiling)}) or give at most"
            f" {ceiling}",
        )


def allocation_bound(max_candidates: int, *, prompt_len: int, k: int, vocab_size: int) -> int:
    """Most candidates a response to a ``prompt_len``-token request at top-``k`` may carry.

    The smaller of the identity's ``max_candidates`` and what the response
    can legitimately hold (``prompt_len - 1`` rows of ``min(k + 1, vocab_size)``):
    the bound a parser checks before it allocates a column.
    """
    width = min(_positive(k, "k") + 1, _positive(vocab_size, "vocab_size"))
    rows = max(0, _positive(prompt_len, "prompt_len") - 1)
    return min(_positive(max_candidates, "max_prompt_logprob_candidates"), rows * width)
