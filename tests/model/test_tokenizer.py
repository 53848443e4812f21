"""Tokenizer digests from the tokenizers and Transformers views, on real files."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import tokenizer_vocab_sha256
from kiln_registry.model.tokenizer import (
    MAX_TOKENIZER_JSON_BYTES,
    student_vocab,
    tokenizer_digests,
    tokenizers_view,
    transformers_view,
)
from tests.model.builders import tokenizer_entries, tokenizer_json, write_json, write_model


def expected_vocab_sha(width: int) -> str:
    tok = Tokenizer.from_str(tokenizer_json())
    return tokenizer_vocab_sha256(
        tok.get_vocab(with_added_tokens=True),
        vocab_size_with_added=tok.get_vocab_size(with_added_tokens=True),
        model_width=width,
    )


def test_tokenizers_view_has_added_tokens(tmp_path: Path) -> None:
    view = tokenizers_view(write_model(tmp_path / "m"))
    assert view.vocab["<extra>"] == tokenizer_entries() - 1
    assert view.size_with_added == len(view.vocab) == tokenizer_entries()
    assert view.backend_json == Tokenizer.from_str(tokenizer_json()).to_str()


def test_digests_without_transformers(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", vocab_size=128)
    digests = tokenizer_digests(root, 128, use_transformers=False)
    assert digests.vocab_sha256 == expected_vocab_sha(128)
    backend = Tokenizer.from_str(tokenizer_json()).to_str()
    assert digests.config_sha256 == hashlib.sha256(backend.encode()).hexdigest()
    assert digests.entries == tokenizer_entries()


def test_digests_with_transformers_agree_on_the_vocabulary(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", vocab_size=128)
    digests = tokenizer_digests(root, 128, use_transformers=True)
    assert digests.vocab_sha256 == expected_vocab_sha(128)
    backend = transformers_view(root).backend_json
    assert digests.config_sha256 == hashlib.sha256(backend.encode()).hexdigest()


def test_views_that_differ_fail_closed(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    write_json(
        root / "tokenizer_config.json",
        {"tokenizer_class": "PreTrainedTokenizerFast", "additional_special_tokens": ["<new>"]},
    )
    with pytest.raises(IdentityError) as err:
        tokenizer_digests(root, 128, use_transformers=True)
    assert err.value.rule == "tokenizer.views_differ"
    assert "<new>" in err.value.message


def test_transformers_load_failure_is_an_identity_error(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    (root / "tokenizer.json").write_bytes(b"{ not json")
    with pytest.raises(IdentityError) as err:
        transformers_view(root)
    assert err.value.rule == "tokenizer.transformers_load"


def test_missing_transformers_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Uninstalling transformers from the shared venv is not an option; a None
    # entry in sys.modules makes the import fail exactly as a missing package does.
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(IdentityError) as err:
        transformers_view(write_model(tmp_path / "m"))
    assert err.value.rule == "tokenizer.transformers_missing"
    assert "kiln-registry[launcher]" in err.value.hint


def test_id_beyond_model_width_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", vocab_size=10)
    with pytest.raises(IdentityError) as err:
        tokenizer_digests(root, 10, use_transformers=False)
    assert err.value.rule == "tokenizer_vocab.id_beyond_width"


def test_non_utf8_token_is_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    document = json.loads(tokenizer_json())
    document["model"]["vocab"]["\ud800"] = 90
    (root / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.load"
    assert "tokenizer.json" in err.value.message


def test_invalid_utf8_file_and_bad_json_are_refused(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    (root / "tokenizer.json").write_bytes(b'{"x": "\xff"}')
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.json_utf8"
    (root / "tokenizer.json").write_bytes(b'{"model": 1}')
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.load"


def test_oversized_tokenizer_json_is_refused_before_reading(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    os.truncate(root / "tokenizer.json", MAX_TOKENIZER_JSON_BYTES + 1)  # sparse: nothing read
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.json.too_large"


def test_symlinked_or_missing_tokenizer_json(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m")
    (root / "tokenizer.json").rename(root / "real.json")
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.json.missing"
    (root / "tokenizer.json").symlink_to(root / "real.json")
    with pytest.raises(IdentityError) as err:
        tokenizers_view(root)
    assert err.value.rule == "tokenizer.json.symlink"


def test_student_vocab_uses_config_width(tmp_path: Path) -> None:
    root = write_model(tmp_path / "m", vocab_size=128)
    assert student_vocab(root) == (expected_vocab_sha(128), 128)


def test_student_vocab_refuses_disagreeing_widths(tmp_path: Path) -> None:
    root = write_model(
        tmp_path / "m", config={"vocab_size": 128, "text_config": {"vocab_size": 256}}
    )
    with pytest.raises(IdentityError) as err:
        student_vocab(root)
    assert err.value.rule == "model.vocab_size_mismatch"
