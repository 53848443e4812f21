"""Our v3 cache entries, merges and archives follow Kiln's ``logit_cache.rs``, case by case.

Each case names the Kiln test (``crates/kiln-train/src/logit_cache.rs``, module
``tests``, stored commit 65c7cc8e) whose values or rule it takes; the reading
side is ``tests/kiln_conformance/logit_cache_rules.py``, re-implemented from
Kiln's source, never our module.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.jobs.scoring import logit_cache as lc
from kiln_registry.jobs.scoring.logit_cache_store import put_entry, write_archive
from tests.kiln_conformance import logit_cache_rules as kiln

A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def identity(model: str = "served", base: str = A) -> TeacherIdentity:
    """``identity(model, base)`` of Kiln's tests: (B, C, None, 64, 8, 4096, 64, "test/1", D)."""
    return TeacherIdentity(model, base, B, C, None, 64, 8, 4096, 64, "test/1", D)


def valid_row(position: int, top_k: int) -> lc.CacheRow:
    """Kiln's ``valid_entry``: ids ``position * 8 + c``, logprobs ``-2.0 - c``."""
    return lc.CacheRow(
        tuple(position * 8 + c for c in range(top_k)),
        tuple(-2.0 - c for c in range(top_k)),
        "2026-05-15T00:00:00Z",
    )


def put(root: Path, ident: TeacherIdentity, tokens: list[int], pos: int, row: lc.CacheRow) -> str:
    return put_entry(root, lc.make_entry(ident, tokens, pos, row))


def jtext(ident: TeacherIdentity) -> str:
    return ident.canonical_bytes().decode()


def test_prefix_hash_is_domain_separated_fixed_width_sha256() -> None:
    # Kiln: prefix_hash_is_domain_separated_fixed_width_sha256.
    assert len(lc.prefix_sha256([])) == 64
    assert lc.prefix_sha256([1, 2]) != lc.prefix_sha256([1, 2, 0])
    assert lc.prefix_sha256([1, 23]) != lc.prefix_sha256([12, 3])
    vector = "b7406ca42b3cd294d001cfc8549fc986fa3590b0fb3ca7101a1e97eade910ccf"
    assert lc.prefix_sha256([1, 2, 3]) == kiln.hash_prefix([1, 2, 3]) == vector
    for tokens in ([], [0], [4294967295, 7], list(range(300))):
        assert lc.prefix_sha256(tokens) == kiln.hash_prefix(tokens)


def test_canonical_entry_bytes_path_and_round_trip(tmp_path: Path) -> None:
    # Kiln: v3_put_get_round_trip_and_path_are_identity_bound (tokens [10, 20, 30, 40], row 2).
    ident, tokens = identity(), [10, 20, 30, 40]
    assert put(tmp_path, ident, tokens, 2, valid_row(2, 4)) == "written"
    path = kiln.entry_path(tmp_path, jtext(ident), tokens, 2)
    relative = path.relative_to(tmp_path)
    assert len(relative.parts) == 3 and relative.parts[0].startswith("v3-")
    expected = (
        '{"schema":"kiln.logit-cache.v3","teacher_identity":' + jtext(ident)
        + f',"teacher_revision_sha256":"{ident.digest()}"'
        + f',"prefix_sha256":"{kiln.hash_prefix([10, 20, 30])}"'
        + ',"token_count":3,"position":2,"top_k":4,"indices":[16,17,18,19]'
        + ',"logprobs":[-2.0,-3.0,-4.0,-5.0],"produced_at":"2026-05-15T00:00:00Z"}'
    ).encode()  # fmt: skip
    assert path.read_bytes() == expected
    hit = kiln.kiln_get(tmp_path, jtext(ident), tokens, 2)
    assert hit is not None and hit["indices"] == [16, 17, 18, 19] and hit["top_k"] == 4
    assert lc.parse_entry(expected).row == valid_row(2, 4)


@pytest.mark.parametrize(
    "value",
    [-2.0, -0.1, -1e-7, -1.5e-7, -1.234e-6, -0.001234, -2920881.75, -1e-45, -0.0,
     -9.5367431640625e-07, -3.4028235e38, -16777216.0, -123456789.0],
)  # fmt: skip
def test_float32_spelling_is_serde_jsons(value: float) -> None:
    # serde_json writes f32 with Ryu's format32 (ryu src/pretty/mod.rs): e.g. -2.0, -1e-7.
    f32 = lc.to_f32(value)
    assert lc.f32_text(f32) == kiln.ryu_f32(f32)
    assert np.float32(lc.f32_text(f32)) == np.float32(f32)


def test_float32_spelling_on_random_values() -> None:
    rng = np.random.default_rng(7)
    for bits in rng.integers(0, 2**31 - 2**23, size=3000):
        value = float(np.frombuffer(struct.pack("<I", int(bits)), dtype="<f4")[0])
        assert lc.f32_text(-value) == kiln.ryu_f32(-value)


def test_every_semantic_identity_change_is_a_cold_miss(tmp_path: Path) -> None:
    # Kiln: every_semantic_identity_field_mutation_is_a_cold_miss (a sample of the variants).
    first = identity()
    put(tmp_path, first, [1, 2, 3], 1, valid_row(1, 2))
    variants = [identity("served-2"), identity(base=D),
                TeacherIdentity("served", A, B, C, None, 65, 8, 4096, 64, "test/1", D),
                TeacherIdentity("served", A, B, C, None, 64, 8, 4096, 64, "test/2", D)]  # fmt: skip
    for changed in variants:
        assert changed.digest() != first.digest()
        assert kiln.kiln_get(tmp_path, jtext(changed), [1, 2, 3], 1) is None
    assert kiln.kiln_get(tmp_path, jtext(first), [1, 2, 3], 1) is not None
    # causal_prefix_reuses_rows_across_suffix_changes / changing_the_causal_prefix_is_a_miss
    assert kiln.kiln_get(tmp_path, jtext(first), [1, 2, 9, 9, 9], 1) is not None
    assert kiln.kiln_get(tmp_path, jtext(first), [1, 7, 3], 1) is None


def test_wider_rows_upgrade_and_narrower_rows_never_downgrade(tmp_path: Path) -> None:
    # Kiln: wider_rows_upgrade_and_narrower_rows_never_downgrade (2, then 4, then 3).
    ident, tokens = identity(), [1, 2, 3]
    outcomes = [put(tmp_path, ident, tokens, 1, valid_row(1, k)) for k in (2, 4, 3)]
    assert outcomes == ["written", "upgraded", "kept"]
    hit = kiln.kiln_get(tmp_path, jtext(ident), tokens, 1)
    assert hit is not None and hit["top_k"] == 4


def test_conflicting_rows_are_rejected_without_clobbering(tmp_path: Path) -> None:
    # Kiln: conflicting_rows_are_rejected_without_clobbering (logprobs[0] = -3.0 at K 4).
    ident, tokens = identity(), [1, 2, 3]
    put(tmp_path, ident, tokens, 1, valid_row(1, 2))
    path = kiln.entry_path(tmp_path, jtext(ident), tokens, 1)
    before = path.read_bytes()
    wide = valid_row(1, 4)
    conflicting = lc.CacheRow(wide.indices, (-3.0, *wide.logprobs[1:]), wide.produced_at)
    with pytest.raises(InputError) as caught:
        put(tmp_path, ident, tokens, 1, conflicting)
    assert caught.value.rule == "logit_cache.conflict"
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("variant", ["unknown", "nonfinite", "noncanonical", "truncated"])
def test_corrupt_entries_fail_closed_for_kiln_and_for_a_merge(tmp_path: Path, variant: str) -> None:
    # Kiln: corrupt_unknown_nonfinite_and_noncanonical_entries_fail_closed.
    ident, tokens = identity(), [1, 2, 3]
    put(tmp_path, ident, tokens, 1, valid_row(1, 2))
    path = kiln.entry_path(tmp_path, jtext(ident), tokens, 1)
    data = path.read_bytes()
    if variant == "unknown":
        data = data[:-1] + b',"extra":true}'
    elif variant == "nonfinite":
        data = data.replace(b"-2.0", b"1e400", 1)
    elif variant == "noncanonical":
        data += b"\n"
    else:
        data = data[: len(data) // 2]
    path.write_bytes(data)
    with pytest.raises(kiln.KilnRefused):
        kiln.kiln_get(tmp_path, jtext(ident), tokens, 1)
    with pytest.raises(InputError):
        lc.parse_entry(data)
    with pytest.raises(InputError):
        put(tmp_path, ident, tokens, 1, valid_row(1, 2))
    assert path.read_bytes() == data


def test_invalid_inputs_are_rejected_before_disk_access(tmp_path: Path) -> None:
    # Kiln: invalid_cache_inputs_are_rejected_before_disk_access.
    ident = identity()
    with pytest.raises(InputError):
        lc.make_entry(ident, [1, 2], 2, valid_row(2, 2))
    nan = lc.CacheRow((8, 9), (math.nan, -3.0), "2026-05-15T00:00:00Z")
    with pytest.raises(InputError):
        lc.make_entry(ident, [1, 2], 1, nan)
    with pytest.raises(InputError):
        lc.make_entry(ident, [1, 2], 1, lc.CacheRow((8, 9), (-2.0, -3.0), ""))
    for bad in [
        lc.CacheRow((8, 8), (-2.0, -3.0), "2026-05-15T00:00:00Z"),  # duplicate id
        lc.CacheRow((8, 9), (-3.0, -2.0), "2026-05-15T00:00:00Z"),  # increasing
        lc.CacheRow((8, 99), (-2.0, -3.0), "2026-05-15T00:00:00Z"),  # outside vocab
        lc.CacheRow((8, 9), (-0.01, -0.02), "2026-05-15T00:00:00Z"),
    ]:  # mass > 1
        with pytest.raises(InputError):
            lc.make_entry(ident, [1, 2], 1, bad)
    assert list(tmp_path.iterdir()) == []


def test_timestamps_take_chronos_to_rfc3339_form() -> None:
    from datetime import UTC, datetime

    assert lc.kiln_timestamp(datetime(2026, 12, 3, 10, 22, 14, tzinfo=UTC)) == (
        "2026-12-03T10:22:14+00:00"
    )
    assert lc.kiln_timestamp(datetime(2026, 12, 3, 10, 22, 14, 5000, tzinfo=UTC)).endswith(
        ":14.005+00:00"
    )
    assert lc.kiln_timestamp(datetime(2026, 12, 3, 10, 22, 14, 5, tzinfo=UTC)).endswith(
        ":14.000005+00:00"
    )


def _members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive.read_bytes()))) as tar:
        return tar.getmembers()


def test_archive_holds_only_validated_v3_entries_and_is_deterministic(tmp_path: Path) -> None:
    # Kiln: export_contains_only_validated_v3_entries_and_import_fails_closed,
    # v1_and_v2_files_are_permanent_cold_misses_and_ignored_by_stats,
    # symlink_cache_entries_are_not_read_or_exported.
    root, out = tmp_path / "root", tmp_path / "out"
    root.mkdir(), out.mkdir()
    ident = identity()
    put(root, ident, [1, 2, 3], 1, valid_row(1, 2))
    put(root, ident, [1, 2, 3], 0, valid_row(0, 2))
    for legacy in (root / "legacy" / "entry.json", root / "teacher/tokenizer/deadbeef/1.json",
                   root / f"v2-{A}/v2-{B}/deadbeef/1.json"):  # fmt: skip
        legacy.parent.mkdir(parents=True, exist_ok=True)
        legacy.write_bytes(b'{"top_k":2}')
    target = kiln.entry_path(root, jtext(ident), [1, 2, 3], 1)
    os.symlink(target, target.parent.parent / "elsewhere.json")  # a symlink is never exported
    first, second = out / "a.tar.gz", out / "b.tar.gz"
    assert write_archive(root, first).entries == 2
    write_archive(root, second)
    assert first.read_bytes() == second.read_bytes()
    assert gzip.decompress(first.read_bytes())  # a plain gzip stream: mtime 0, no name
    assert first.read_bytes()[4:8] == b"\0\0\0\0"
    members = _members(first)
    assert [m.name for m in members] == sorted(m.name for m in members)
    for member in members:
        assert member.name.startswith("logit-cache/v3-") and member.isreg()
        assert (member.uid, member.gid, member.mtime, member.mode) == (0, 0, 0, 0o644)
    with pytest.raises(InputError, match="outside the cache root"):
        write_archive(root, root / "export.tar.gz")
    assert not (root / "export.tar.gz").exists()


def test_a_misplaced_entry_fails_the_archive(tmp_path: Path) -> None:
    # Kiln: misplaced_entry_fails_stats_and_export_validation.
    ident = identity()
    (tmp_path / "root").mkdir()
    put(tmp_path / "root", ident, [1, 2, 3], 1, valid_row(1, 2))
    canonical = kiln.entry_path(tmp_path / "root", jtext(ident), [1, 2, 3], 1)
    canonical.rename(canonical.with_name("2.json"))
    with pytest.raises(InputError, match="misplaced"):
        write_archive(tmp_path / "root", tmp_path / "bad.tar.gz")
    assert not (tmp_path / "bad.tar.gz").exists()
    assert not list(tmp_path.glob(".bad.tar.gz*"))


def test_target_positions_map_to_the_previous_causal_row() -> None:
    # logit_source.rs: target_token_positions_to_logits_rows.
    assert kiln.target_rows(5, [2, 3, 4]) == [1, 2, 3]
    for bad in ([0], [5], [3, 3]):
        with pytest.raises(kiln.KilnRefused):
            kiln.target_rows(5, bad)
    assert json.loads(json.dumps(kiln.FIELDS)) == list(lc.ENTRY_KEYS)


def test_an_interrupted_write_leaves_nothing_kiln_reads(tmp_path: Path) -> None:
    # Kiln's scans take only `v3-*/<prefix>/<name>.json` regular files
    # (looks_like_v3_entry_path): our temporary names end in `.tmp`, never `.json`, so a
    # temporary file a killed export left behind is neither read nor exported, and the next
    # put of that row simply writes the entry.
    ident, tokens = identity(), [1, 2, 3]
    entry = lc.make_entry(ident, tokens, 1, valid_row(1, 2))
    directory = tmp_path / "root" / Path(entry.path).parent
    directory.mkdir(parents=True)
    leftover = directory / ".1.json.0123456789abcdef.tmp"
    leftover.write_bytes(entry.encode()[:40])  # a torn write, as a SIGKILL would leave it
    assert kiln.kiln_get(tmp_path / "root", jtext(ident), tokens, 1) is None
    assert write_archive(tmp_path / "root", tmp_path / "a.tar.gz").entries == 0
    assert put_entry(tmp_path / "root", entry) == "written"
    assert kiln.kiln_get(tmp_path / "root", jtext(ident), tokens, 1) is not None
    assert write_archive(tmp_path / "root", tmp_path / "b.tar.gz").entries == 1
