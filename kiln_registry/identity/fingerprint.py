"""The ``kiln-teacher-v1`` fingerprint: encoder and fail-closed verifier.

Owns docs/identity.md section 1's fingerprint text,
``kiln-teacher-v1.<base64url(J), no padding>.<hex(sha256(J))>``, and the
verifier that accepts it only when every rule holds.  The verifier names the
first rule that failed, in the spec's order, as ``FingerprintError`` with
``rule="fingerprint.<name>"`` (the names are ``FINGERPRINT_RULES``).  Every
stock ``vllm-*`` fingerprint fails (``fingerprint.parts`` or
``fingerprint.prefix``).

Imports: standard library, ``kiln_registry.domain.errors`` and
``kiln_registry.identity`` only.
"""

from __future__ import annotations

import base64
import hashlib
import re

from kiln_registry.domain.errors import FingerprintError, IdentityError
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.identity.document import IDENTITY_KEYS, TeacherIdentity, is_hex64, show
from kiln_registry.identity.document import MAX_IDENTITY_BYTES as MAX_IDENTITY_BYTES
from kiln_registry.identity.fingerprint_text import FINGERPRINT_PREFIX as FINGERPRINT_PREFIX
from kiln_registry.identity.fingerprint_text import MAX_FINGERPRINT_BYTES as MAX_FINGERPRINT_BYTES
from kiln_registry.identity.fingerprint_text import b64encode as _b64encode
from kiln_registry.identity.fingerprint_text import fingerprint_of_canonical

# In the order the verifier checks them.
FINGERPRINT_RULES: tuple[str, ...] = (
    "fingerprint.type",
    "fingerprint.size",
    "fingerprint.parts",
    "fingerprint.prefix",
    "fingerprint.base64_empty",
    "fingerprint.base64_alphabet",
    "fingerprint.base64_padding",
    "fingerprint.base64_length",
    "fingerprint.decoded_size",
    "fingerprint.base64_reencode",
    "fingerprint.digest_hex",
    "fingerprint.digest_mismatch",
    "fingerprint.utf8",
    "fingerprint.json",
    "fingerprint.duplicate_key",
    "fingerprint.non_finite",
    "fingerprint.not_object",
    "fingerprint.keys",
    "fingerprint.key_order",
    "fingerprint.value",
    "fingerprint.canonical",
)

_BASE64URL_OR_PAD = re.compile(r"[A-Za-z0-9_=-]*")
# Decoded bytes per count of trailing characters (a remainder of 1 is impossible).
_TAIL_BYTES = {0: 0, 2: 1, 3: 2}
_JSON_RULES = {
    "json.utf8": "fingerprint.utf8",
    "json.duplicate_key": "fingerprint.duplicate_key",
    "json.non_finite": "fingerprint.non_finite",
}


def encode_fingerprint(identity: TeacherIdentity) -> str:
    """The fingerprint of a (construction-validated) identity."""
    return fingerprint_of_canonical(identity.canonical_bytes())


def _fail(rule: str, message: str) -> FingerprintError:
    return FingerprintError(message, rule=f"fingerprint.{rule}")


def _split(text: object) -> tuple[str, str]:
    """Size, parts and prefix; returns the base64 part and the digest part."""
    if not isinstance(text, str):
        raise _fail("type", f"a fingerprint is text, got {type(text).__name__}")
    if len(text) > MAX_FINGERPRINT_BYTES:
        size = len(text)  # a character is at least one byte
    else:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FINGERPRINT_BYTES:
        raise _fail("size", f"fingerprint is {size} bytes, over {MAX_FINGERPRINT_BYTES}")
    stock = " (a stock vLLM fingerprint proves nothing)" if text.startswith("vllm-") else ""
    parts = text.split(".")
    if len(parts) != 3:
        raise _fail("parts", f"fingerprint has {len(parts)} '.'-separated parts, not 3{stock}")
    if parts[0] != FINGERPRINT_PREFIX:
        raise _fail(
            "prefix", f"fingerprint prefix {show(parts[0])} is not {FINGERPRINT_PREFIX!r}{stock}"
        )
    return parts[1], parts[2]


def _decode_document(encoded: str) -> bytes:
    """Base64url without padding, bounded before decoding, canonical re-encoding."""
    if not encoded:
        raise _fail("base64_empty", "the identity part is empty")
    if _BASE64URL_OR_PAD.fullmatch(encoded) is None:
        raise _fail("base64_alphabet", "the identity part has a character outside [A-Za-z0-9_-]")
    if "=" in encoded:
        raise _fail("base64_padding", "the identity part carries '=' padding")
    tail = len(encoded) % 4
    if tail not in _TAIL_BYTES:
        raise _fail("base64_length", f"the identity part has an impossible length {len(encoded)}")
    size = len(encoded) // 4 * 3 + _TAIL_BYTES[tail]
    if size > MAX_IDENTITY_BYTES:
        raise _fail("decoded_size", f"the identity decodes to {size} bytes, over 4096")
    document = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    if _b64encode(document) != encoded:
        raise _fail("base64_reencode", "the identity part has stray trailing bits")
    return document


def _check_digest(digest: str, document: bytes) -> None:
    if not is_hex64(digest):
        raise _fail("digest_hex", "the digest part is not 64 lowercase hex characters")
    if hashlib.sha256(document).hexdigest() != digest:
        raise _fail("digest_mismatch", "the digest part is not sha256 of the identity")


def _parse_object(document: bytes) -> dict[str, object]:
    try:
        value = strict_json_loads(
            document, what="fingerprint identity", max_bytes=MAX_IDENTITY_BYTES
        )
    except IdentityError as exc:
        rule = _JSON_RULES.get(exc.rule or "", "fingerprint.json")
        raise FingerprintError(exc.message, rule=rule) from None
    if not isinstance(value, dict):
        raise _fail("not_object", f"the identity is a JSON {type(value).__name__}, not an object")
    return value


def _check_keys(obj: dict[str, object]) -> None:
    keys = tuple(obj)
    if set(keys) != set(IDENTITY_KEYS):
        missing = [k for k in IDENTITY_KEYS if k not in obj]
        unknown = [k for k in keys if k not in IDENTITY_KEYS]
        raise _fail(
            "keys",
            f"identity keys differ: missing {show(missing[:5])}, unknown {show(unknown[:5])}",
        )
    if keys != IDENTITY_KEYS:
        first = next(i for i, (a, b) in enumerate(zip(keys, IDENTITY_KEYS, strict=True)) if a != b)
        raise _fail(
            "key_order",
            f"identity key {first + 1} is {keys[first]!r}, expected {IDENTITY_KEYS[first]!r}",
        )


def verify_fingerprint(text: str) -> TeacherIdentity:
    """Return the identity a fingerprint carries, or name the first rule it breaks."""
    encoded, digest = _split(text)
    document = _decode_document(encoded)
    _check_digest(digest, document)
    obj = _parse_object(document)
    _check_keys(obj)
    try:
        identity = TeacherIdentity.from_mapping(obj)
    except IdentityError as exc:
        raise _fail("value", f"an identity value is invalid: {exc}") from None
    if identity.canonical_bytes() != document:
        raise _fail(
            "canonical",
            "the identity is not in canonical form (white space, escapes or number form)",
        )
    return identity
