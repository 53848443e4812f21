"""Tokenizer digests (docs/identity.md section 3) from two independent views.

Owns ``tokenizers_view`` (``tokenizer.json`` loaded with the ``tokenizers``
library alone), ``transformers_view`` (``AutoTokenizer`` with local files
only, no remote code, fast tokenizer: the view vLLM uses),
``tokenizer_digests`` (which fails closed when the two views' vocabularies
differ, and, as Kiln does, parses the backend JSON strictly before hashing
it: ``backend_config_sha256``) and ``student_vocab`` (the registry server's student: tokenizers
view only).  Third-party load failures become ``IdentityError`` here.

Imports: standard library, ``tokenizers``, ``kiln_registry.identity``,
``kiln_registry.model``; ``transformers`` only lazily inside
``transformers_view``; never torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.identity.digests import tokenizer_config_sha256, tokenizer_vocab_sha256
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.model.files import read_json_object, read_small_file
from kiln_registry.model.shards import model_width

MAX_TOKENIZER_JSON_BYTES = 512 * 1024 * 1024
TOKENIZER_JSON = "tokenizer.json"
LAUNCHER_EXTRA_HINT = (
    "install the launcher extra: pip install 'kiln-registry[launcher]'"
    " (or use the tokenizers-only view where the command offers it)"
)


@dataclass(frozen=True)
class TokenizerView:
    """What one library reports for a tokenizer."""

    source: str
    vocab: Mapping[str, int]
    size_with_added: int
    backend_json: str


@dataclass(frozen=True)
class TokenizerDigests:
    vocab_sha256: str
    config_sha256: str
    entries: int


def load_tokenizer_json(
    path: str | os.PathLike[str], *, limiter: ReadRateLimiter | None = None
) -> TokenizerView:
    """Load one ``tokenizer.json`` file with the ``tokenizers`` library."""
    from tokenizers import Tokenizer

    text_path = os.fspath(path)
    data = read_small_file(
        text_path, max_bytes=MAX_TOKENIZER_JSON_BYTES, rule="tokenizer.json", limiter=limiter
    )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IdentityError(
            f"{text_path} is not valid UTF-8 (byte {exc.start})", rule="tokenizer.json_utf8"
        ) from None
    try:
        tokenizer = Tokenizer.from_str(text)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        backend = tokenizer.to_str()
    except Exception as exc:  # the tokenizers library raises plain Exception
        raise IdentityError(
            f"{text_path} cannot be loaded by the tokenizers library: {str(exc)[:200]}",
            rule="tokenizer.load",
        ) from None
    return TokenizerView(text_path, vocab, size, backend)


def tokenizers_view(
    model_dir: str | os.PathLike[str], *, limiter: ReadRateLimiter | None = None
) -> TokenizerView:
    return load_tokenizer_json(os.path.join(os.fspath(model_dir), TOKENIZER_JSON), limiter=limiter)


def transformers_view(model_dir: str | os.PathLike[str]) -> TokenizerView:
    """Load the tokenizer as vLLM does: Transformers, local files, fast, no remote code."""
    directory = os.fspath(model_dir)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise IdentityError(
            "transformers is not installed; it is needed to cross-check the tokenizer",
            rule="tokenizer.transformers_missing",
            hint=LAUNCHER_EXTRA_HINT,
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            directory, local_files_only=True, trust_remote_code=False, use_fast=True
        )
        backend = tokenizer.backend_tokenizer
        vocab = tokenizer.get_vocab()
        size = backend.get_vocab_size(with_added_tokens=True)
        backend_json = backend.to_str()
    except Exception as exc:  # Transformers raises many unrelated types; all mean "cannot load"
        raise IdentityError(
            f"Transformers cannot load a fast tokenizer from {directory}: {str(exc)[:200]}",
            rule="tokenizer.transformers_load",
        ) from None
    if not isinstance(vocab, Mapping) or not isinstance(backend_json, str):
        raise IdentityError(
            f"Transformers returned an unexpected tokenizer shape for {directory}",
            rule="tokenizer.transformers_load",
        )
    return TokenizerView(directory, dict(vocab), int(size), backend_json)


def _first_difference(a: Mapping[str, int], b: Mapping[str, int]) -> str:
    for token in sorted(set(a) ^ set(b))[:1]:
        return f"token {token!r} is in only one view"
    for token in sorted(a):
        if a[token] != b[token]:
            return f"token {token!r} has id {a[token]} in one view and {b[token]} in the other"
    return "the views differ"


def backend_config_sha256(view: TokenizerView) -> str:
    """``tokenizer_config_sha256`` of a view, its backend JSON parsed strictly first.

    As Kiln does before hashing: the backend JSON must be non-empty strict
    JSON (no duplicate keys, no NaN or Infinity) holding one object.
    """
    what = f"{view.source}: backend tokenizer JSON"
    if not view.backend_json:
        raise IdentityError(f"{what} is empty", rule="tokenizer.backend_json")
    value = strict_json_loads(view.backend_json, what=what, max_bytes=MAX_TOKENIZER_JSON_BYTES)
    if not isinstance(value, dict):
        raise IdentityError(
            f"{what} is a JSON {type(value).__name__}, not an object",
            rule="tokenizer.backend_json",
        )
    return tokenizer_config_sha256(view.backend_json)


def tokenizer_digests(
    model_dir: str | os.PathLike[str],
    model_width: int,
    *,
    use_transformers: bool,
    limiter: ReadRateLimiter | None = None,
) -> TokenizerDigests:
    """Vocabulary and backend-config digests; with Transformers, both views must agree."""
    base = tokenizers_view(model_dir, limiter=limiter)
    chosen = base
    if use_transformers:
        chosen = transformers_view(model_dir)
        if dict(chosen.vocab) != dict(base.vocab):
            raise IdentityError(
                f"{base.source}: the Transformers and tokenizers vocabularies differ:"
                f" {_first_difference(chosen.vocab, base.vocab)}",
                rule="tokenizer.views_differ",
            )
    vocab_sha = tokenizer_vocab_sha256(
        chosen.vocab, vocab_size_with_added=chosen.size_with_added, model_width=model_width
    )
    return TokenizerDigests(
        vocab_sha256=vocab_sha,
        config_sha256=backend_config_sha256(chosen),
        entries=len(chosen.vocab),
    )


def student_vocab(
    model_dir: str | os.PathLike[str], *, limiter: ReadRateLimiter | None = None
) -> tuple[str, int]:
    """``(tokenizer_vocab_sha256, model_width)`` of a student, without Transformers."""
    digest, width, _ = student_shape(model_dir, limiter=limiter)
    return digest, width


def student_shape(
    model_dir: str | os.PathLike[str], *, limiter: ReadRateLimiter | None = None
) -> tuple[str, int, int]:
    """``(tokenizer_vocab_sha256, model_width, tokenizer_size)`` of a student.

    ``tokenizer_size`` counts the added tokens (what Kiln's loaded tokenizer
    reports as its vocabulary size).
    """
    directory = os.fspath(model_dir)
    _, config = read_json_object(
        os.path.join(directory, "config.json"), rule="model.config", limiter=limiter
    )
    width = model_width(config, source=os.path.join(directory, "config.json"))
    view = tokenizers_view(directory, limiter=limiter)
    digest = tokenizer_vocab_sha256(
        view.vocab, vocab_size_with_added=view.size_with_added, model_width=width
    )
    return digest, width, view.size_with_added
