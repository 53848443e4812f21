"""Writing a fingerprint from canonical identity bytes (docs/identity.md, the fingerprint).

``fingerprint_of_canonical(J)`` is ``kiln-teacher-v1.<base64url(J), unpadded>.<sha256(J) hex>``
with the size bounds on ``J`` and on the text.  Reading one back (every rule
of the verifier) is ``identity.fingerprint``'s; ``TeacherIdentity.fingerprint``
calls this module, so it imports nothing of ``identity.document``.  Imports the
standard library, ``domain.errors`` and ``identity.values`` only.
"""

from __future__ import annotations

import base64
import hashlib

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.values import MAX_IDENTITY_BYTES

FINGERPRINT_PREFIX = "kiln-teacher-v1"
MAX_FINGERPRINT_BYTES = 6144


def b64encode(data: bytes) -> str:
    """Unpadded base64url of ``data``."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def fingerprint_of_canonical(document: bytes) -> str:
    """The fingerprint of the canonical identity bytes ``document``."""
    if len(document) > MAX_IDENTITY_BYTES:
        raise IdentityError(
            f"canonical identity is {len(document)} bytes, over {MAX_IDENTITY_BYTES}",
            rule="identity.size",
        )
    digest = hashlib.sha256(document).hexdigest()
    text = f"{FINGERPRINT_PREFIX}.{b64encode(document)}.{digest}"
    if len(text) > MAX_FINGERPRINT_BYTES:  # ASCII only: characters are bytes
        raise IdentityError(
            f"fingerprint is {len(text)} bytes, over {MAX_FINGERPRINT_BYTES}",
            rule="fingerprint.size",
        )
    return text
