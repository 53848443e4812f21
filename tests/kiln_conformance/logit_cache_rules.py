"""Kiln's logit cache v3 rules, re-implemented for tests from Kiln's source (not our module).

Sources (ericflo/kiln, stored commit 65c7cc8e of ``crates/kiln-train/src/logit_cache.rs``;
``crates/kiln-train/src/logit_source.rs`` at 050df31b's successor holding
``validate_topk_logprob_row`` and ``target_token_positions_to_logits_rows``;
``crates/kiln-train/src/teacher_identity.rs`` for ``content_revision``):

* ``hash_prefix``: SHA-256 over ``b"kiln.logit-cache.causal-prefix.v3\\0"``,
  ``(len as u64).to_be_bytes()`` and each ``u32::to_be_bytes``, lowercase hex;
* ``LogitCache::entry_path``: ``root/v3-{content_revision}/{hash_prefix(tokens[..=p])}/{p}.json``
  with ``content_revision`` = hex SHA-256 of the canonical identity JSON;
* ``StoredCacheEntryV3`` (``deny_unknown_fields``, serde field order), read by
  ``parse_canonical_entry`` (``serde_json::to_vec`` of the parsed value must equal
  the file) and ``validate_request``; rows by ``validate_topk_logprob_row``;
* ``LogitCache::get`` returns ``None`` for a missing file and an error for a
  malformed or misplaced one.

Floats: serde_json writes an ``f32`` with Ryu's ``format32`` (crate ``ryu``,
``src/pretty/mod.rs``); here the digits come from numpy's shortest float32
``repr`` and the layout from Ryu's rules, an independent route to the same text.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

DOMAIN = b"kiln.logit-cache.causal-prefix.v3\x00"
FIELDS = ["schema", "teacher_identity", "teacher_revision_sha256", "prefix_sha256",
          "token_count", "position", "top_k", "indices", "logprobs", "produced_at"]  # fmt: skip
F32_EPSILON = 1.1920929e-07


class KilnRefused(Exception):
    """What Kiln would report as an error (never a cache miss)."""


def hash_prefix(tokens: list[int]) -> str:
    data = DOMAIN + struct.pack(">Q", len(tokens)) + b"".join(struct.pack(">I", t) for t in tokens)
    return hashlib.sha256(data).hexdigest()


def content_revision(identity_json: str) -> str:
    return hashlib.sha256(identity_json.encode("utf-8")).hexdigest()


def entry_path(root: Path, identity_json: str, tokens: list[int], position: int) -> Path:
    assert position < len(tokens)
    rev = content_revision(identity_json)
    return root / f"v3-{rev}" / hash_prefix(tokens[: position + 1]) / f"{position}.json"


def ryu_f32(value: float) -> str:
    """serde_json's text for an f32 (digits from numpy's shortest repr, Ryu's layout)."""
    f = np.float32(value)
    if f == 0:
        return "-0.0" if math.copysign(1, float(f)) < 0 else "0.0"
    sci = np.format_float_scientific(abs(f), unique=True, trim="-")
    mant, exp = sci.split("e")
    digits = mant.replace(".", "").rstrip("0") or "0"
    kk = int(exp) + 1  # 10^(kk-1) <= v < 10^kk
    length = len(digits)
    k = kk - length
    sign = "-" if f < 0 else ""
    if k >= 0 and kk <= 13:
        return sign + digits + "0" * k + ".0"
    if 0 < kk <= 13:
        return sign + digits[:kk] + "." + digits[kk:]
    if -6 < kk <= 0:
        return sign + "0." + "0" * (-kk) + digits
    if length == 1:
        return f"{sign}{digits}e{kk - 1}"
    return f"{sign}{digits[0]}.{digits[1:]}e{kk - 1}"


def serde_bytes(entry: dict[str, Any], identity_json: str) -> bytes:
    """``serde_json::to_vec(StoredCacheEntryV3)`` of a parsed entry."""

    def ints(xs: list[int]) -> str:
        return "[" + ",".join(str(x) for x in xs) + "]"

    parts = [
        '{"schema":' + json.dumps(entry["schema"]),
        '"teacher_identity":' + identity_json,
        '"teacher_revision_sha256":' + json.dumps(entry["teacher_revision_sha256"]),
        '"prefix_sha256":' + json.dumps(entry["prefix_sha256"]),
        f'"token_count":{entry["token_count"]}',
        f'"position":{entry["position"]}',
        f'"top_k":{entry["top_k"]}',
        '"indices":' + ints(entry["indices"]),
        '"logprobs":[' + ",".join(ryu_f32(v) for v in entry["logprobs"]) + "]",
        '"produced_at":' + json.dumps(entry["produced_at"]) + "}",
    ]
    return ",".join(parts).encode("utf-8")


def check_row(vocab: int, max_top_k: int, top_k: int, indices: list[int], lps: list[float]) -> None:
    """``validate_topk_logprob_row`` with the identity's caps."""
    if top_k == 0 or top_k > max_top_k or top_k > vocab:
        raise KilnRefused(f"top_k {top_k}")
    if len(indices) != top_k or len(lps) != top_k:
        raise KilnRefused("row shape")
    if len(set(indices)) != top_k or any(not 0 <= i < vocab for i in indices):
        raise KilnRefused("ids")
    mass, previous = 0.0, None
    for lp in lps:
        if not math.isfinite(lp) or lp > 0.0:
            raise KilnRefused(f"logprob {lp}")
        if previous is not None and lp > previous:
            raise KilnRefused("order")
        previous = lp
        mass += math.exp(lp)
    if mass > 1.0 + 32.0 * F32_EPSILON:
        raise KilnRefused("mass")


def parse_canonical(data: bytes, identity_json: str) -> dict[str, Any]:
    """``parse_canonical_entry`` + ``validate_self`` (identity given as its exact JSON)."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise KilnRefused(f"json: {exc}") from None
    if not isinstance(value, dict) or sorted(value) != sorted(FIELDS):
        raise KilnRefused("fields")
    if value["schema"] != "kiln.logit-cache.v3":
        raise KilnRefused("schema")
    if json.dumps(value["teacher_identity"], separators=(",", ":"), ensure_ascii=False) != (
        identity_json
    ):
        raise KilnRefused("embedded identity")
    if value["teacher_revision_sha256"] != content_revision(identity_json):
        raise KilnRefused("revision")
    identity = value["teacher_identity"]
    lps = [float(np.float32(v)) for v in value["logprobs"]]
    if not all(math.isfinite(v) for v in lps):
        raise KilnRefused("nonfinite")
    if value["token_count"] != value["position"] + 1:
        raise KilnRefused("token_count")
    check_row(identity["vocab_size"], identity["max_top_k"], value["top_k"], value["indices"], lps)
    datetime.fromisoformat(value["produced_at"].replace("Z", "+00:00"))
    if serde_bytes(value, identity_json) != data:
        raise KilnRefused("not canonical compact JSON")
    return value


def kiln_get(
    root: Path, identity_json: str, tokens: list[int], position: int
) -> dict[str, Any] | None:
    """``LogitCache::get``: ``None`` on a miss, the entry on a hit, ``KilnRefused`` else."""
    path = entry_path(root, identity_json, tokens, position)
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise KilnRefused("not a regular file")
    entry = parse_canonical(path.read_bytes(), identity_json)
    if entry["prefix_sha256"] != hash_prefix(tokens[: position + 1]):
        raise KilnRefused("prefix")
    if entry["position"] != position:
        raise KilnRefused("position")
    return entry


def target_rows(token_len: int, targets: list[int]) -> list[int]:
    """``target_token_positions_to_logits_rows``: target ``q`` is scored by row ``q - 1``."""
    rows, previous = [], None
    for q in targets:
        if q == 0 or q >= token_len or (previous is not None and q <= previous):
            raise KilnRefused(f"target {q}")
        previous = q
        rows.append(q - 1)
    return rows
