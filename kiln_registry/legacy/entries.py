"""One entry of Kiln's ``teachers.json``: Kiln's parse, then the status Kiln would give it.

The rules are Kiln's (``crates/kiln-server/src/api/teachers.rs``:
``TeacherSpec`` with ``deny_unknown_fields``, ``migrate_legacy_secret_fields``,
``teacher_entry`` and ``validate_teacher_spec_static``;
``crates/kiln-train/src/remote_teacher.rs``: ``RemoteProvider`` and
``validate_config_identity_contract``).

``legacy_entry(alias, fields)`` refuses, with a ``ValueError``, what Kiln's
parser refuses (an unknown field, a wrong type, a missing ``model_id``, an
invalid identity): such a file is broken and nothing of it is imported.
Everything Kiln's parser loads is imported:

* an entry that carried ``api_key_env`` (any value, even ``null``) is
  ``legacy_unverified`` without an identity, its variable name never read;
* a remote or local entry without ``identity`` is ``legacy_unverified``;
* an entry Kiln would refuse to use (for example ``max_top_k: 0`` on a local
  or fixture teacher, Kiln's old default; a remote entry without
  ``provider = "vllm"``) is ``unavailable`` with Kiln's reason;
* otherwise a remote or local entry keeps its identity as ``verified``, and
  a fixture is ``configured``.

Live conditions (the credential, the student match, an adapter directory)
are re-checked when the entry is read, not here.  Values that do not fit
the registry's own columns are not stored (and make the entry unavailable).

What a kind allows (an empty ``model_id``, ``adapter``, ``identity``, the
endpoint fields, ``max_top_k: 0``) and what a usable entry of it is stored as
are the kind's (``teachers.kinds``: ``LegacyRules``).

Imports: the standard library, ``kiln_registry.credentials.origin``,
``kiln_registry.db.legacy``, ``kiln_registry.domain`` (errors, limits, text,
vocabulary), ``kiln_registry.identity.document`` and the teacher kind table;
never the API layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from kiln_registry.credentials.origin import parse_teacher_url, trim_url
from kiln_registry.db.legacy import (
    LEGACY_NO_IDENTITY_MESSAGE,
    LEGACY_STATUS_MESSAGE,
    LegacyEntry,
)
from kiln_registry.domain.errors import RELEASE_NOTE, KilnError
from kiln_registry.domain.limits import MAX_NOTES_CHARS, MAX_TEXT_CHARS
from kiln_registry.domain.text import shown
from kiln_registry.domain.vocabulary import KILN_REMOTE_PROVIDERS, TeacherKind, TeacherStatus
from kiln_registry.identity.document import TeacherIdentity

if TYPE_CHECKING:
    from kiln_registry.teachers.kinds.base import LegacyRules

LEGACY_FIELD: Final = "api_key_env"
KINDS: Final = tuple(kind.value for kind in TeacherKind)
_TEXT_FIELDS: Final = ("provider", "url", "credential_id", "adapter", "tokenizer_hash", "notes")
_INT_FIELDS: Final = ("max_top_k", "vocab_size")
SPEC_FIELDS: Final = frozenset(
    {"alias", "kind", "model_id", "supports_full_vocab", "identity", *_TEXT_FIELDS, *_INT_FIELDS}
)
MAX_USIZE: Final = (1 << 64) - 1
_CREDENTIAL_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAX_SHOWN_FIELDS: Final = 5
_REMEDY: Final = f"; delete this alias and register it again {RELEASE_NOTE}"


def _text(fields: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = fields.get(name)
    if value is None and not required:
        return None
    limit = MAX_NOTES_CHARS if name == "notes" else MAX_TEXT_CHARS
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"field {name!r} must be a string of at most {limit} characters")
    allowed = "\t\n\r" if name == "notes" else ""
    if any((ord(ch) < 0x20 or ord(ch) == 0x7F) and ch not in allowed for ch in value):
        raise ValueError(f"field {name!r} contains a control character")
    return value


def _check_types(fields: Mapping[str, Any]) -> None:
    unknown = sorted(set(fields) - SPEC_FIELDS - {LEGACY_FIELD})
    if unknown:
        names = ", ".join(shown(name) for name in unknown[:_MAX_SHOWN_FIELDS])
        raise ValueError(f"unknown field(s) {names}")
    for name in _INT_FIELDS:
        value = fields.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USIZE
        ):
            raise ValueError(f"field {name!r} must be null or a non-negative integer")
    if not isinstance(fields.get("supports_full_vocab"), bool | None):
        raise ValueError("field 'supports_full_vocab' must be null or a boolean")
    provider = fields.get("provider")
    if provider is not None and provider not in KILN_REMOTE_PROVIDERS:
        raise ValueError(
            f"field 'provider' must be null or one of {', '.join(KILN_REMOTE_PROVIDERS)}"
        )


def _rules(kind: str) -> LegacyRules:
    """What the kind allows in a teachers.json entry (``teachers.kinds``, ``LegacyRules``)."""
    # The kind table loads the probing and launch code (numpy among it) and every
    # ``kiln`` command imports this module (cli.registry_cmds): imported on first use.
    from kiln_registry.teachers.kinds import kind_of

    return kind_of(kind).legacy


def _identity(fields: Mapping[str, Any]) -> TeacherIdentity | None:
    raw = fields.get("identity")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("field 'identity' must be null or an identity object")
    try:
        return TeacherIdentity.from_mapping(raw)
    except KilnError as exc:
        raise ValueError(f"field 'identity' is not a valid identity: {exc.message}") from None


def _static_problem(kind: str, fields: Mapping[str, Any], model_id: str) -> str | None:
    """Kiln's ``validate_teacher_spec_static``, in its order (the kind's rules: ``LegacyRules``)."""
    rules = _rules(kind)
    if not model_id.strip() and not rules.model_id_optional:
        return "teacher model_id must be non-empty"
    if fields.get("supports_full_vocab") is True:
        return "supports_full_vocab=true is not available"
    if fields.get("vocab_size") == 0:
        return "teacher vocab_size must be greater than zero when specified"
    if fields.get("max_top_k") == 0 and not rules.zero_top_k_allowed:
        return (
            "teacher max_top_k must be greater than zero when specified for a local or"
            " fixture teacher"
        )
    if fields.get("adapter") is not None and not rules.takes_adapter:
        return f"`adapter` is only valid on kind=local teachers (got kind={kind})"
    if fields.get("identity") is not None and not rules.takes_identity:
        return "`identity` is only valid on remote or local teachers"
    if not rules.takes_endpoint:
        if any(fields.get(name) is not None for name in ("provider", "url", "credential_id")):
            return "`provider`, `url`, and `credential_id` are only valid on kind=remote teachers"
        return None
    return _remote_problem(fields)


def _remote_problem(fields: Mapping[str, Any]) -> str | None:
    provider = fields.get("provider")
    if provider is None:
        return 'Remote teacher requires explicit provider="vllm"'
    if provider != "vllm":
        return f'remote provider {provider} is not wired; only provider="vllm" is supported'
    url = fields.get("url")
    if url is None:
        return "Remote teacher requires a `url`"
    try:
        parse_teacher_url(url)
    except KilnError as exc:
        return exc.message
    credential_id = fields.get("credential_id")
    if credential_id is not None and not _CREDENTIAL_ID_RE.fullmatch(credential_id):
        return "teacher credential_id must be 1..=64 ASCII letters, digits, '_' or '-'"
    return None


def _identity_problem(
    kind: str, fields: Mapping[str, Any], model_id: str, identity: TeacherIdentity
) -> str | None:
    """Kiln's checks of a pinned identity against the entry's other fields."""
    if model_id != identity.served_model_id:
        return f"model_id {shown(model_id)} does not match the identity's served model"
    if _rules(kind).adapter_binds_identity:
        adapter = None if identity.adapter is None else identity.adapter.name
        if fields.get("adapter") != adapter:
            return "the local teacher's adapter does not match its pinned identity"
        return None
    if identity.max_model_len < 3:
        return "the identity's max_model_len cannot fit the identity probe"
    claims = (
        ("max_top_k", fields.get("max_top_k") or None, identity.max_top_k),
        ("vocab_size", fields.get("vocab_size") or None, identity.vocab_size),
        ("tokenizer_hash", fields.get("tokenizer_hash") or None, identity.tokenizer_vocab_sha256),
    )
    for name, claimed, actual in claims:
        if claimed is not None and claimed != actual:
            return f"legacy {name} does not match the pinned identity"
    return None


def _usable_status(
    kind: str, fields: Mapping[str, Any], model_id: str, identity: TeacherIdentity | None
) -> tuple[str, str | None]:
    """Kiln's ``teacher_entry`` status for an entry that did not carry ``api_key_env``."""
    rules = _rules(kind)
    if rules.takes_identity and identity is None:
        return TeacherStatus.legacy_unverified.value, LEGACY_NO_IDENTITY_MESSAGE
    problem = _static_problem(kind, fields, model_id)
    if problem is None and identity is not None:
        problem = _identity_problem(kind, fields, model_id, identity)
    if problem is not None:
        return (
            TeacherStatus.unavailable.value,
            f"imported from a Kiln teachers.json: {problem}{_REMEDY}",
        )
    return rules.usable_status.value, None


def legacy_entry(alias: str, fields: Mapping[str, Any]) -> LegacyEntry:
    """Parse one entry as Kiln does and derive what the registry stores (module docstring)."""
    _check_types(fields)
    if fields.get("alias") != alias:
        raise ValueError("field 'alias' must repeat the entry's key")
    kind = fields.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"field 'kind' must be one of {', '.join(KINDS)}")
    model_id = _text(fields, "model_id", required=True) or ""
    texts = {name: _text(fields, name) for name in _TEXT_FIELDS}
    identity = _identity(fields)
    message: str | None
    if LEGACY_FIELD in fields:
        status, message = TeacherStatus.legacy_unverified.value, LEGACY_STATUS_MESSAGE
        identity = None
    else:
        status, message = _usable_status(kind, fields, model_id, identity)
    usable = status in (TeacherStatus.verified, TeacherStatus.configured)
    url, credential_id = texts["url"], texts["credential_id"]
    return LegacyEntry(
        alias=alias,
        kind=kind,
        provider="vllm" if texts["provider"] == "vllm" else None,
        model_id=model_id if model_id.strip() else None,
        url=trim_url(url) if url is not None and (usable or _parses(url)) else None,
        credential_id=credential_id if usable or _is_id(credential_id) else None,
        notes=texts["notes"],
        adapter=texts["adapter"] if _rules(kind).takes_adapter else None,
        identity_json=None if identity is None else identity.canonical_bytes().decode("utf-8"),
        identity_digest=None if identity is None else identity.digest(),
        status=status,
        status_message=message,
    )


def _parses(url: str | None) -> bool:
    if url is None:
        return False
    try:
        parse_teacher_url(url)
    except KilnError:
        return False
    return True


def _is_id(credential_id: str | None) -> bool:
    return credential_id is not None and _CREDENTIAL_ID_RE.fullmatch(credential_id) is not None
