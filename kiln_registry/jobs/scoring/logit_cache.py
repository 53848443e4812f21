"""Kiln's identity-bound logit cache ``kiln.logit-cache.v3``: the pure format.

Facts from Kiln (``crates/kiln-train/src/logit_cache.rs``, ``logit_source.rs``,
``remote_teacher.rs``, ``teacher_identity.rs``); the code is ours:

* an entry for logits row ``p`` of ``tokens`` (the row that conditions on
  ``tokens[..=p]`` and predicts ``tokens[p + 1]``) lives at
  ``v3-<revision>/<prefix>/<p>.json`` under the cache root, ``revision`` the
  identity digest (hex SHA-256 of the canonical identity bytes) and ``prefix``
  the hex SHA-256 of ``b"kiln.logit-cache.causal-prefix.v3\\0"``, the prefix
  length as a big-endian u64 and each token as a big-endian u32;
* the file is compact JSON, keys in this order: ``schema``,
  ``teacher_identity`` (the canonical identity object), ``teacher_revision_sha256``,
  ``prefix_sha256``, ``token_count`` (``p + 1``), ``position``, ``top_k``,
  ``indices``, ``logprobs`` (float32 in serde_json's spelling: Ryu's shortest
  digits, ``-2.0``, ``-0.001234``, ``-1e-7``, ``-1.5e-7``) and ``produced_at``
  (RFC 3339; Kiln writes chrono's ``to_rfc3339``: ``2026-12-03T10:22:14+00:00``);
  a reader refuses any other byte (re-encoding must give the same bytes);
* a row is valid when ``1 <= top_k <= min(max_top_k, vocab_size)``, it has
  ``top_k`` distinct in-vocabulary ids, finite, non-positive, non-increasing
  logprobs, and a probability mass of at most ``1 + 32 * f32::EPSILON``;
* merging a candidate into an existing entry: both must agree bit for bit over
  their shared ``min(top_k)`` support, else the merge fails closed; the equal or
  wider existing entry wins, a wider candidate replaces a narrower one.

Refusals are ``InputError`` with ``rule="logit_cache.<name>"``.  Imports:
standard library, numpy, ``kiln_registry.domain.errors`` and ``identity``.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Final

import numpy as np

from kiln_registry.domain.errors import InputError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.identity.strict_read import DuplicateKeyError, loads_strict

SCHEMA: Final = "kiln.logit-cache.v3"
PATH_PREFIX: Final = "v3-"
PREFIX_DOMAIN: Final = b"kiln.logit-cache.causal-prefix.v3\x00"
MAX_ENTRY_BYTES: Final = 8 * 1024 * 1024
MASS_TOLERANCE: Final = 32.0 * 2.0**-23
ENTRY_KEYS: Final = (
    "schema", "teacher_identity", "teacher_revision_sha256", "prefix_sha256", "token_count",
    "position", "top_k", "indices", "logprobs", "produced_at",
)  # fmt: skip
_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def _error(message: str, rule: str) -> InputError:
    return InputError(message, rule=f"logit_cache.{rule}")


def prefix_sha256(tokens: Sequence[int]) -> str:
    """The causal-prefix digest of ``tokens`` (all of them: pass ``tokens[: p + 1]``)."""
    digest = hashlib.sha256(PREFIX_DOMAIN)
    digest.update(len(tokens).to_bytes(8, "big"))
    digest.update(np.asarray(tokens, dtype=">u4").tobytes())
    return digest.hexdigest()


def to_f32(value: float) -> float:
    """``value as f32`` (round to nearest even); ``OverflowError`` past the f32 range."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def f32_bits(value: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def _interval(x: float) -> tuple[Fraction, Fraction, bool]:
    """The decimals that read back as the f32 ``x > 0``: (low, high, bounds included)."""
    bits = f32_bits(x)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent == 0:
        m, e = mantissa, -149
    else:
        m, e = mantissa | 0x800000, exponent - 150
    ulp = Fraction(2) ** e
    low_gap = ulp / 2 if (mantissa == 0 and exponent > 1) else ulp
    exact = Fraction(x)
    return exact - low_gap / 2, exact + ulp / 2, m % 2 == 0


def _shortest_exact(x: float) -> tuple[int, int]:
    """Ryu's digits of the f32 ``x > 0``: the shortest ``(digits, exponent)`` that reads
    back as ``x``, the closest to ``x`` among those (ties to even)."""
    low, high, inclusive = _interval(x)
    exact = Fraction(x)
    top = math.floor(math.log10(x)) + 1  # 10^(top-1) <= x < 10^top, made exact below
    while Fraction(10) ** top <= exact:
        top += 1
    while Fraction(10) ** (top - 1) > exact:
        top -= 1
    for length in range(1, 10):
        scale = Fraction(10) ** (top - length)
        base = round(exact / scale)  # round half to even
        best: tuple[Fraction, int] | None = None
        for digits in (base - 1, base, base + 1):
            value = digits * scale
            inside = low <= value <= high if inclusive else low < value < high
            if digits > 0 and inside:
                distance = abs(value - exact)
                tie_to_even = best is not None and distance == best[0] and digits % 2 == 0
                if best is None or distance < best[0] or tie_to_even:
                    best = (distance, digits)
        if best is not None:
            digits = best[1]
            exp10 = top - length
            while digits % 10 == 0:
                digits, exp10 = digits // 10, exp10 + 1
            return digits, exp10
    raise AssertionError("nine digits always identify a float32")


def _shortest(x: float) -> tuple[int, int]:
    """Numpy's Dragon4 (unique, shortest) digits, checked; else the exact search."""
    text = np.format_float_scientific(np.float32(x), unique=True, trim="-", exp_digits=1)
    mantissa, _, exp_text = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits, exp10 = int(whole + frac), int(exp_text) - len(frac)
    while digits and digits % 10 == 0:
        digits, exp10 = digits // 10, exp10 + 1
    if to_f32(float(f"{digits}e{exp10}")) == x and len(str(digits)) <= 9:
        return digits, exp10
    return _shortest_exact(x)


def f32_text(value: float) -> str:
    """serde_json's spelling of the float32 ``value`` (Ryu's ``format32``)."""
    if not math.isfinite(value):
        raise _error(f"logprob {value!r} is not finite", "logprob")
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    digits, k = _shortest(abs(value))
    text = str(digits)
    length = len(text)
    kk = length + k
    if k >= 0 and kk <= 13:
        return f"{sign}{text}{'0' * k}.0"
    if 0 < kk <= 13:
        return f"{sign}{text[:kk]}.{text[kk:]}"
    if -6 < kk <= 0:
        return f"{sign}0.{'0' * -kk}{text}"
    if length == 1:
        return f"{sign}{text}e{kk - 1}"
    return f"{sign}{text[0]}.{text[1:]}e{kk - 1}"


def kiln_timestamp(moment: datetime) -> str:
    """chrono's ``DateTime<Utc>::to_rfc3339``: ``+00:00``, 0, 3, 6 or 9 fraction digits."""
    utc = moment.astimezone(UTC)
    base = utc.strftime("%Y-%m-%dT%H:%M:%S")
    micros = utc.microsecond
    if micros == 0:
        fraction = ""
    elif micros % 1000 == 0:
        fraction = f".{micros // 1000:03d}"
    else:
        fraction = f".{micros:06d}"
    return f"{base}{fraction}+00:00"


def check_timestamp(value: str) -> None:
    """chrono's ``parse_from_rfc3339`` accepts ``value`` (calendar and clock checked)."""
    match = _RFC3339.fullmatch(value) if value else None
    if match is None:
        raise _error(f"produced_at {value!r} is not RFC 3339", "produced_at")
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    try:
        datetime(year, month, day, hour, minute, min(second, 59))
    except ValueError:
        raise _error(f"produced_at {value!r} is not a valid date and time", "produced_at") from None
    if second > 60:
        raise _error(f"produced_at {value!r} is not a valid time", "produced_at")


@dataclass(frozen=True, slots=True)
class CacheRow:
    """One sparse row: ``top_k`` ids and their float32 logprobs, rank order."""

    indices: tuple[int, ...]
    logprobs: tuple[float, ...]
    produced_at: str

    @property
    def top_k(self) -> int:
        return len(self.indices)


def check_row(identity: TeacherIdentity, top_k: int, row: CacheRow, position: int) -> None:
    """Kiln's ``validate_topk_logprob_row`` with the identity's caps, and the timestamp."""
    where = f"row {position}"
    cap = min(identity.max_top_k, identity.vocab_size)
    if not 1 <= top_k <= cap:
        raise _error(f"{where}: top_k {top_k} is outside 1..={cap}", "top_k")
    if len(row.indices) != top_k or len(row.logprobs) != top_k:
        raise _error(
            f"{where}: declares top_k {top_k} but has {len(row.indices)} indices and"
            f" {len(row.logprobs)} logprobs",
            "row_shape",
        )
    if len(set(row.indices)) != top_k:
        raise _error(f"{where}: repeats a token id", "duplicate_id")
    if any(not 0 <= i < identity.vocab_size for i in row.indices):
        raise _error(f"{where}: a token id is outside vocab_size {identity.vocab_size}", "id")
    mass, previous = 0.0, math.inf
    for lp in row.logprobs:
        if not math.isfinite(lp) or lp > 0.0:
            raise _error(f"{where}: invalid logprob {lp!r}", "logprob")
        if lp > previous:
            raise _error(f"{where}: logprobs increase ({lp!r} follows {previous!r})", "order")
        previous = lp
        mass += math.exp(lp)
    if mass > 1.0 + MASS_TOLERANCE:
        raise _error(f"{where}: sparse probability mass {mass:.9f} exceeds 1", "mass")
    check_timestamp(row.produced_at)


def entry_path(identity: TeacherIdentity, tokens: Sequence[int], position: int) -> str:
    """``v3-<revision>/<prefix>/<position>.json`` (POSIX, relative to the cache root)."""
    if not 0 <= position < len(tokens):
        raise _error(f"position {position} is outside the {len(tokens)} tokens", "position")
    prefix = prefix_sha256(tokens[: position + 1])
    return f"{PATH_PREFIX}{identity.digest()}/{prefix}/{position}.json"


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """A complete, validated v3 entry."""

    identity: TeacherIdentity
    prefix: str
    position: int
    row: CacheRow

    @property
    def path(self) -> str:
        return f"{PATH_PREFIX}{self.identity.digest()}/{self.prefix}/{self.position}.json"

    def encode(self) -> bytes:
        """The canonical bytes Kiln writes (no trailing newline)."""
        row = self.row
        parts = [
            f'{{"schema":"{SCHEMA}","teacher_identity":',
            self.identity.canonical_bytes().decode("utf-8"),
            f',"teacher_revision_sha256":"{self.identity.digest()}"',
            f',"prefix_sha256":"{self.prefix}","token_count":{self.position + 1}',
            f',"position":{self.position},"top_k":{row.top_k}',
            f',"indices":[{",".join(str(i) for i in row.indices)}]',
            f',"logprobs":[{",".join(f32_text(lp) for lp in row.logprobs)}]',
            f',"produced_at":"{row.produced_at}"}}',
        ]
        return "".join(parts).encode("utf-8")


def make_entry(
    identity: TeacherIdentity, tokens: Sequence[int], position: int, row: CacheRow
) -> StoredEntry:
    """Validate ``row`` as logits row ``position`` of ``tokens``; the entry to store."""
    if not 0 <= position < len(tokens):
        raise _error(f"position {position} is outside the {len(tokens)} tokens", "position")
    check_row(identity, row.top_k, row, position)
    entry = StoredEntry(identity, prefix_sha256(tokens[: position + 1]), position, row)
    if len(entry.encode()) > MAX_ENTRY_BYTES:
        raise _error(f"the entry is over {MAX_ENTRY_BYTES} bytes", "size")
    return entry


def _uint(values: dict[str, object], key: str) -> int:
    value = values[key]
    if type(value) is not int or value < 0:
        raise _error(f"{key} must be an unsigned integer", "entry_field")
    return value


def _row_from(values: dict[str, object]) -> tuple[int, CacheRow]:
    indices, logprobs, produced = values["indices"], values["logprobs"], values["produced_at"]
    if not isinstance(indices, list) or not all(type(i) is int for i in indices):
        raise _error("indices must be an array of unsigned integers", "entry_field")
    if not isinstance(logprobs, list) or not all(type(v) in (int, float) for v in logprobs):
        raise _error("logprobs must be an array of numbers", "entry_field")
    if not isinstance(produced, str):
        raise _error("produced_at must be a string", "entry_field")
    try:
        floats = tuple(to_f32(float(v)) for v in logprobs)  # serde: f64, then `as f32`
    except OverflowError:
        raise _error("a logprob is outside the float32 range", "logprob") from None
    return _uint(values, "top_k"), CacheRow(tuple(indices), floats, produced)


def parse_entry(data: bytes) -> StoredEntry:
    """Read one entry file's bytes as Kiln does: strict, valid and canonical, else refused."""
    if len(data) > MAX_ENTRY_BYTES:
        raise _error(f"the entry is {len(data)} bytes, over {MAX_ENTRY_BYTES}", "size")
    try:
        values = loads_strict(data)
    except (DuplicateKeyError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise _error(f"the entry is not strict JSON ({exc})", "entry_json") from None
    if not isinstance(values, dict) or list(values) != list(ENTRY_KEYS):
        raise _error(f"the entry must have exactly the keys {', '.join(ENTRY_KEYS)}", "entry_keys")
    if values["schema"] != SCHEMA:
        raise _error(f"unsupported cache schema {values['schema']!r}", "schema")
    try:
        identity = TeacherIdentity.from_mapping(values["teacher_identity"])
    except InputError as exc:
        raise _error(f"teacher_identity: {exc}", "identity") from None
    if values["teacher_revision_sha256"] != identity.digest():
        raise _error("teacher_revision_sha256 does not match the embedded identity", "revision")
    prefix = values["prefix_sha256"]
    if not isinstance(prefix, str) or _HEX64.fullmatch(prefix) is None:
        raise _error("prefix_sha256 must be 64 lowercase hexadecimal characters", "prefix")
    position = _uint(values, "position")
    if _uint(values, "token_count") != position + 1:
        raise _error("token_count does not match the causal position", "token_count")
    top_k, row = _row_from(values)
    check_row(identity, top_k, row, position)
    entry = StoredEntry(identity, prefix, position, row)
    if entry.encode() != data:
        raise _error("the entry is not canonical compact JSON", "noncanonical")
    return entry


def merge(existing: StoredEntry, candidate: StoredEntry) -> StoredEntry:
    """Kiln's merge: the shared support must agree bit for bit; the wider entry wins."""
    same_key = (
        existing.identity.canonical_bytes() == candidate.identity.canonical_bytes()
        and existing.prefix == candidate.prefix
        and existing.position == candidate.position
    )
    if not same_key:
        raise _error("cannot merge entries with different cache identities", "merge_key")
    shared = min(existing.row.top_k, candidate.row.top_k)
    old, new = existing.row, candidate.row
    same_ids = old.indices[:shared] == new.indices[:shared]
    same_bits = all(
        f32_bits(a) == f32_bits(b)
        for a, b in zip(old.logprobs[:shared], new.logprobs[:shared], strict=True)
    )
    if not (same_ids and same_bits):
        raise _error(
            f"conflicting logits for the same teacher identity and causal prefix at position"
            f" {existing.position} ({existing.path})",
            "conflict",
        )
    return existing if old.top_k >= new.top_k else candidate
