"""Signed corpora: the trailer, the registry key, and that any single-byte change is refused.

The keys are real Ed25519 keys created by ``jobs.core.signing`` in ``tmp_path``;
verification runs in-process on a tiny corpus so every byte can be flipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kiln_registry.domain.errors import InputError
from kiln_registry.jobs.core.signing import CorpusSigner, PublicKey
from kiln_registry.jobs.kinds import verify_corpus
from kiln_registry.jobs.scoring.corpus import CorpusWriter, RowContext, trailer_line
from tests.jobs.test_corpus import IDENTITY, K, keyring, make_signer, scored, write_corpus

TRAILER = '{"kiln.corpus-trailer.v1":'


@pytest.fixture
def signer(tmp_path: Path) -> CorpusSigner:
    return make_signer(tmp_path / "registry")


@pytest.fixture
def other(tmp_path: Path) -> CorpusSigner:
    return make_signer(tmp_path / "elsewhere")


def _refused(path: Path, keys: dict[str, PublicKey]) -> InputError:
    with pytest.raises(InputError) as caught:
        verify_corpus(path, keys)
    return caught.value


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def test_the_trailer_signs_the_sha256_of_everything_before_it(
    tmp_path: Path, signer: CorpusSigner
) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4]], signer)
    raw = path.read_bytes()
    body, trailer = raw[: raw.rindex(b"\n", 0, -1) + 1], raw[raw.rindex(b"\n", 0, -1) + 1 :]
    fields = json.loads(trailer)["kiln.corpus-trailer.v1"]
    assert list(fields) == ["sha256", "key_id", "signature"]
    assert fields["sha256"] == hashlib.sha256(body).hexdigest()
    assert fields["key_id"] == signer.public.key_id
    assert signer.public.verifies(fields["sha256"], bytes.fromhex(fields["signature"]))
    assert trailer == trailer_line(fields["sha256"], fields["key_id"], fields["signature"])
    summary = verify_corpus(path, keyring(signer))
    assert (summary.sha256, summary.key_id) == (fields["sha256"], signer.public.key_id)


def test_commit_reports_the_digest_and_size_of_the_published_file(
    tmp_path: Path, signer: CorpusSigner
) -> None:
    writer = CorpusWriter(tmp_path / "c.jsonl", RowContext("job-x", "t", IDENTITY, K), signer)
    writer.write("a", np.array([1, 2], dtype=np.int32), scored(2))
    sha, size = writer.commit()
    data = (tmp_path / "c.jsonl").read_bytes()
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))


def test_an_edited_score_is_refused(tmp_path: Path, signer: CorpusSigner) -> None:
    """The issue's case: a well-formed edit of topk_logprobs (every line still valid)."""
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4, 5]], signer)
    lines = _lines(path)
    row = json.loads(lines[1])
    row["topk_logprobs"][0][-1] = row["topk_logprobs"][0][-1] - 1.0  # still sorted, negative
    lines[1] = json.dumps(row, separators=(",", ":"))
    _write(path, lines)
    error = _refused(path, keyring(signer))
    assert error.rule == "corpus.sha256" and "changed after it was signed" in error.message


def test_a_corpus_without_a_trailer_is_unsigned(tmp_path: Path, signer: CorpusSigner) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    _write(path, _lines(path)[:-1])
    error = _refused(path, keyring(signer))
    assert error.rule == "corpus.unsigned"
    assert "unsigned" in error.message and "submit the job again" in error.hint


def test_a_line_after_the_trailer_makes_the_corpus_unsigned(
    tmp_path: Path, signer: CorpusSigner
) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4]], signer)
    lines = _lines(path)
    _write(path, [*lines, lines[1]])
    assert _refused(path, keyring(signer)).rule == "corpus.unsigned"


def test_a_missing_final_newline_is_refused(tmp_path: Path, signer: CorpusSigner) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    path.write_bytes(path.read_bytes()[:-1])
    assert _refused(path, keyring(signer)).rule == "corpus.truncated"


def test_a_corpus_signed_by_another_key_is_refused(
    tmp_path: Path, signer: CorpusSigner, other: CorpusSigner
) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], other)
    error = _refused(path, keyring(signer))
    assert error.rule == "corpus.unknown_key"
    assert other.public.key_id in error.message and signer.public.key_id in error.message
    assert verify_corpus(path, keyring(other)).sequences == 1


def test_a_trailer_forged_with_another_key_under_the_registry_key_id_is_refused(
    tmp_path: Path, signer: CorpusSigner, other: CorpusSigner
) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    lines = _lines(path)
    fields = json.loads(lines[-1])["kiln.corpus-trailer.v1"]
    forged = other.sign(fields["sha256"]).hex()
    lines[-1] = trailer_line(fields["sha256"], signer.public.key_id, forged).decode().rstrip()
    _write(path, lines)
    assert _refused(path, keyring(signer)).rule == "corpus.signature"


def test_a_rewritten_trailer_for_edited_content_is_refused(
    tmp_path: Path, signer: CorpusSigner, other: CorpusSigner
) -> None:
    """Editing the scores and re-signing with one's own key gives an unknown key."""
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    lines = _lines(path)
    lines[1] = lines[1].replace('"id":"s0"', '"id":"forged"')
    body = ("\n".join(lines[:-1]) + "\n").encode()
    sha = hashlib.sha256(body).hexdigest()
    lines[-1] = trailer_line(sha, other.public.key_id, other.sign(sha).hex()).decode().rstrip()
    _write(path, lines)
    assert _refused(path, keyring(signer)).rule == "corpus.unknown_key"


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace(":", ": "),
        lambda t: t.replace('"sha256"', '"SHA256"'),
        lambda t: t.replace("}}", ',"extra":1}}'),
        lambda t: t[:-2] + "}",
    ],
    ids=["spaces", "renamed", "extra", "broken"],
)
def test_a_malformed_trailer_is_refused(
    tmp_path: Path, signer: CorpusSigner, change: object
) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    lines = _lines(path)
    assert callable(change)
    lines[-1] = change(lines[-1])
    _write(path, lines)
    assert _refused(path, keyring(signer)).rule == "corpus.trailer"


def test_the_hex_in_a_trailer_must_be_lowercase(tmp_path: Path, signer: CorpusSigner) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3]], signer)
    lines = _lines(path)
    fields = json.loads(lines[-1])["kiln.corpus-trailer.v1"]
    lines[-1] = lines[-1].replace(fields["signature"], fields["signature"].upper())
    _write(path, lines)
    assert _refused(path, keyring(signer)).rule == "corpus.trailer"


def test_progress_reaches_the_signed_size(tmp_path: Path, signer: CorpusSigner) -> None:
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4]], signer)
    seen: list[tuple[int, int]] = []
    verify_corpus(path, keyring(signer), on_progress=lambda done, total: seen.append((done, total)))
    signed = len(path.read_bytes()) - len(_lines(path)[-1]) - 1
    assert seen[-1] == (signed, signed) and len(seen) >= 3


def test_every_single_byte_change_anywhere_is_refused(tmp_path: Path, signer: CorpusSigner) -> None:
    """Flip each byte of a tiny corpus in turn (two different flips per byte)."""
    path = write_corpus(tmp_path / "c.jsonl", [[1, 2]], signer)
    keys = keyring(signer)
    original = path.read_bytes()
    assert verify_corpus(path, keys).sequences == 1
    rules: set[str] = set()
    fd = os.open(path, os.O_RDWR)
    try:
        for index, byte in enumerate(original):
            for mask in (0x01, 0x20):
                os.pwrite(fd, bytes([byte ^ mask]), index)  # the one changed byte, in place
                with pytest.raises(InputError) as caught:
                    verify_corpus(path, keys)
                rules.add(str(caught.value.rule))
            os.pwrite(fd, bytes([byte]), index)
    finally:
        os.close(fd)
    assert path.read_bytes() == original
    assert {"corpus.sha256", "corpus.signature", "corpus.trailer", "corpus.unknown_key"} <= rules
