"""The shared value checks of identity documents: bounded text, hex digests, integers, keys.

Owns ``check_text`` (non-empty, at most 256 UTF-8 bytes, no edge white space,
no control character), ``check_hex`` (64 lowercase hex characters),
``check_int`` (a JSON integer in a range), ``check_keys`` (exactly the
expected keys) and ``show`` (a bounded repr for messages).  The identity
document, the input manifest and the inference config use them; refusals are
``IdentityError`` with ``rule="<prefix>.<name>"``.

Imports: standard library and ``kiln_registry.domain`` (errors, text) only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kiln_registry.domain.errors import IdentityError
from kiln_registry.domain.text import clipped_repr

# The canonical identity document's size bound (identity.md: the fingerprint section).
MAX_IDENTITY_BYTES = 4096

MAX_TEXT_BYTES = 256

# Unicode White_Space (what Rust's str::trim strips), and general category Cc.
WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def show(value: object, limit: int = 60) -> str:
    """A bounded repr for messages: untrusted values never flood a log line."""
    return clipped_repr(value, limit)


def is_hex64(value: object) -> bool:
    """True for exactly 64 lowercase hexadecimal characters."""
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


def check_hex(value: object, field: str, *, prefix: str = "identity") -> str:
    if not isinstance(value, str) or not is_hex64(value):
        raise IdentityError(
            f"{field} must be 64 lowercase hex characters, got {show(value)}",
            rule=f"{prefix}.hex",
        )
    return value


def check_int(value: object, field: str, low: int, high: int, *, prefix: str = "identity") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise IdentityError(
            f"{field} must be a JSON integer, got {type(value).__name__}",
            rule=f"{prefix}.integer_type",
        )
    if not low <= value <= high:
        raise IdentityError(
            f"{field} must be in {low}..={high}, got {value}", rule=f"{prefix}.integer_range"
        )
    return value


def check_text(value: object, field: str, *, prefix: str = "identity") -> str:
    """Bounded text: non-empty, <= 256 UTF-8 bytes, no edge white space, no Cc."""
    if not isinstance(value, str):
        raise IdentityError(
            f"{field} must be a string, got {type(value).__name__}", rule=f"{prefix}.text_type"
        )
    if len(value) > MAX_TEXT_BYTES:
        size = len(value)  # a character is at least one byte: no need to encode it all
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise IdentityError(
                f"{field} is not valid UTF-8 (lone surrogate)", rule=f"{prefix}.text_utf8"
            ) from None
    if size == 0:
        raise IdentityError(f"{field} must not be empty", rule=f"{prefix}.text_empty")
    if size > MAX_TEXT_BYTES:
        raise IdentityError(
            f"{field} is over {MAX_TEXT_BYTES} UTF-8 bytes", rule=f"{prefix}.text_too_long"
        )
    if value[0] in WHITE_SPACE or value[-1] in WHITE_SPACE:
        raise IdentityError(
            f"{field} has leading or trailing white space: {show(value)}",
            rule=f"{prefix}.text_whitespace",
        )
    for ch in value:
        if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            raise IdentityError(
                f"{field} contains the control character U+{ord(ch):04X}",
                rule=f"{prefix}.text_control",
            )
    return value


def check_keys(
    obj: object, expected: tuple[str, ...], field: str, *, prefix: str
) -> dict[str, object]:
    """``obj`` must be a mapping with exactly ``expected`` keys (any order)."""
    if not isinstance(obj, Mapping):
        raise IdentityError(
            f"{field} must be a JSON object, got {type(obj).__name__}",
            rule=f"{prefix}.not_object",
        )
    keys = list(obj.keys())
    missing = [k for k in expected if k not in obj]
    unknown = [k for k in keys if k not in expected]
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(show(k, 40) for k in missing[:5]))
        if unknown:
            parts.append("unknown " + ", ".join(show(k, 40) for k in unknown[:5]))
        raise IdentityError(f"{field} keys: " + "; ".join(parts), rule=f"{prefix}.keys")
    return {str(k): obj[k] for k in keys}
