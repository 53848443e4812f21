"""The off-policy distillation manifest: the exact first line of a teacher corpus.

``{"schema":"kiln.off-policy-distillation-manifest.v1","teacher_identity":J}``
with ``J`` the canonical identity bytes, written verbatim (never re-serialized).
The registry publishes it as ``off_policy_manifest``; the job queue writes it
as line 1 of every corpus.  Imports: the identity document only.
"""

from __future__ import annotations

from typing import Final

from kiln_registry.identity.document import TeacherIdentity

OFF_POLICY_SCHEMA: Final = "kiln.off-policy-distillation-manifest.v1"


def off_policy_manifest(identity: TeacherIdentity) -> str:
    """The compact manifest text for ``identity``."""
    canonical = identity.canonical_bytes().decode("utf-8")
    return '{"schema":"' + OFF_POLICY_SCHEMA + '","teacher_identity":' + canonical + "}"
