"""The TeacherIdentityV1 document (docs/identity.md section 1).

Owns the 14-key identity, its value rules, its canonical bytes ``J``, its
digest and revision, its strict reader (``from_canonical_json``), the one
sameness check (``same_identity``), and the launcher's stricter rules (the
candidate budget at most ``max_model_len * row_width``, served-model-id
pattern, adapter name, ``vllm:<version>`` with a release >= 0.20.1 read as
Kiln's launcher reads it: ``0.20.1rc0``, ``0.20.1a0``, ``0.20.1.dev5+g...``
and ``0.20.1-custom`` all count as 0.20.1).  A
``TeacherIdentity`` is validated when it is constructed, so every instance
in the program is a valid identity.  The shared value checks (bounded text,
hex, integer ranges) are ``identity.values`` (re-exported here).

Refusals are ``IdentityError`` with ``rule="identity.<name>"`` (or
``bounds.<name>`` for section 6).  Imports: standard library,
``kiln_registry.domain`` (errors, limits) and ``kiln_registry.identity`` only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.domain.limits import MAX_VOCAB_SIZE as MAX_VOCAB_SIZE
from kiln_registry.identity.bounds import check_launcher_budget, validate_max_candidates
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.fingerprint_text import fingerprint_of_canonical
from kiln_registry.identity.strict_read import DuplicateKeyError, loads_strict
from kiln_registry.identity.values import MAX_IDENTITY_BYTES as MAX_IDENTITY_BYTES
from kiln_registry.identity.values import MAX_TEXT_BYTES as MAX_TEXT_BYTES
from kiln_registry.identity.values import WHITE_SPACE as WHITE_SPACE
from kiln_registry.identity.values import check_hex as check_hex
from kiln_registry.identity.values import check_int as check_int
from kiln_registry.identity.values import check_keys as check_keys
from kiln_registry.identity.values import check_text as check_text
from kiln_registry.identity.values import is_hex64 as is_hex64
from kiln_registry.identity.values import show as show

SCHEMA = "kiln.teacher-identity.v1"
PROTOCOL = "vllm.prompt-logprobs.numeric-token-ids.causal.v1"
LOGPROBS_MODE = "raw_logprobs"
IDENTITY_KEYS: tuple[str, ...] = (
    "schema",
    "protocol",
    "served_model_id",
    "base_model_sha256",
    "tokenizer_vocab_sha256",
    "tokenizer_config_sha256",
    "adapter",
    "vocab_size",
    "max_top_k",
    "max_model_len",
    "max_prompt_logprob_candidates",
    "logprobs_mode",
    "implementation",
    "inference_config_sha256",
)
ADAPTER_KEYS: tuple[str, ...] = ("name", "weights_sha256", "config_sha256")

MAX_TOP_K = 65_536
MAX_MODEL_LEN = 16_777_216
MIN_VLLM_VERSION = "0.20.1rc0"

_SERVED_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
# Kiln's launcher (scripts/vllm_teacher.py) reads MAJOR.MINOR[.PATCH] and
# ignores any suffix of [A-Za-z0-9.+-]: 0.20.1.dev5+g0123abc, 0.20.1a0 and
# 0.20.1-custom all count as 0.20.1.
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?[A-Za-z0-9.+-]*")
MIN_VLLM_RELEASE = (0, 20, 1)
MAX_VERSION_CHARS = 512


def vllm_version_supported(version: str) -> bool:
    """Kiln's rule: ``MAJOR.MINOR[.PATCH]`` plus an optional suffix, release >= 0.20.1."""
    if len(version) > MAX_VERSION_CHARS:
        return False
    match = _VERSION.fullmatch(version)
    if match is None:
        return False
    release = tuple(int(part or "0") for part in match.groups())
    return release >= MIN_VLLM_RELEASE


@dataclass(frozen=True, slots=True)
class AdapterIdentity:
    """The static adapter bound into an identity (name, weights and config digests)."""

    name: str
    weights_sha256: str
    config_sha256: str

    def __post_init__(self) -> None:
        check_text(self.name, "adapter.name")
        check_hex(self.weights_sha256, "adapter.weights_sha256")
        check_hex(self.config_sha256, "adapter.config_sha256")

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "weights_sha256": self.weights_sha256,
            "config_sha256": self.config_sha256,
        }

    @classmethod
    def from_mapping(
        cls, obj: object, *, field: str = "adapter", prefix: str = "identity"
    ) -> AdapterIdentity:
        values = check_keys(obj, ADAPTER_KEYS, field, prefix=prefix)
        return cls(
            name=check_text(values["name"], f"{field}.name", prefix=prefix),
            weights_sha256=check_hex(
                values["weights_sha256"], f"{field}.weights_sha256", prefix=prefix
            ),
            config_sha256=check_hex(
                values["config_sha256"], f"{field}.config_sha256", prefix=prefix
            ),
        )


@dataclass(frozen=True, slots=True)
class TeacherIdentity:
    """TeacherIdentityV1; ``schema``, ``protocol`` and ``logprobs_mode`` are constants."""

    served_model_id: str
    base_model_sha256: str
    tokenizer_vocab_sha256: str
    tokenizer_config_sha256: str
    adapter: AdapterIdentity | None
    vocab_size: int
    max_top_k: int
    max_model_len: int
    max_prompt_logprob_candidates: int
    implementation: str
    inference_config_sha256: str

    def __post_init__(self) -> None:
        _validate_values(self)

    def to_dict(self) -> dict[str, object]:
        """The document with its 14 keys in normative order."""
        return {
            "schema": SCHEMA,
            "protocol": PROTOCOL,
            "served_model_id": self.served_model_id,
            "base_model_sha256": self.base_model_sha256,
            "tokenizer_vocab_sha256": self.tokenizer_vocab_sha256,
            "tokenizer_config_sha256": self.tokenizer_config_sha256,
            "adapter": None if self.adapter is None else self.adapter.to_dict(),
            "vocab_size": self.vocab_size,
            "max_top_k": self.max_top_k,
            "max_model_len": self.max_model_len,
            "max_prompt_logprob_candidates": self.max_prompt_logprob_candidates,
            "logprobs_mode": LOGPROBS_MODE,
            "implementation": self.implementation,
            "inference_config_sha256": self.inference_config_sha256,
        }

    def canonical_bytes(self) -> bytes:
        """``J``: compact, raw-UTF-8 JSON in normative key order."""
        return _canonical_bytes(self)

    def digest(self) -> str:
        """The identity digest ``hex(sha256(J))``."""
        return _digest(self)

    def revision(self) -> str:
        """The API's ``identity_revision``: ``"sha256:" + digest``."""
        return "sha256:" + self.digest()

    def fingerprint(self) -> str:
        """``kiln-teacher-v1.<base64url(J)>.<hex(sha256(J))>``."""
        return _fingerprint(self)

    @classmethod
    def from_mapping(cls, obj: object, *, launcher_strict: bool = False) -> TeacherIdentity:
        """Build from a decoded JSON object: exactly the 14 keys, every value valid.

        Keys may come in any order here; ``verify_fingerprint`` also checks order.
        Values are checked in normative key order, so the first bad one is named.
        """
        values = check_keys(obj, IDENTITY_KEYS, "identity", prefix="identity")
        _check_constant(values["schema"], "schema", SCHEMA)
        _check_constant(values["protocol"], "protocol", PROTOCOL)
        served = check_text(values["served_model_id"], "served_model_id")
        base = check_hex(values["base_model_sha256"], "base_model_sha256")
        vocab_hash = check_hex(values["tokenizer_vocab_sha256"], "tokenizer_vocab_sha256")
        config_hash = check_hex(values["tokenizer_config_sha256"], "tokenizer_config_sha256")
        raw_adapter = values["adapter"]
        adapter = None if raw_adapter is None else AdapterIdentity.from_mapping(raw_adapter)
        vocab, top_k, model_len = _check_sizes(
            values["vocab_size"], values["max_top_k"], values["max_model_len"]
        )
        candidates = validate_max_candidates(
            values["max_prompt_logprob_candidates"],  # type: ignore[arg-type]
            max_top_k=top_k,
            vocab_size=vocab,
            max_model_len=model_len,
        )
        _check_constant(values["logprobs_mode"], "logprobs_mode", LOGPROBS_MODE)
        identity = cls(
            served_model_id=served,
            base_model_sha256=base,
            tokenizer_vocab_sha256=vocab_hash,
            tokenizer_config_sha256=config_hash,
            adapter=adapter,
            vocab_size=vocab,
            max_top_k=top_k,
            max_model_len=model_len,
            max_prompt_logprob_candidates=candidates,
            implementation=check_text(values["implementation"], "implementation"),
            inference_config_sha256=check_hex(
                values["inference_config_sha256"], "inference_config_sha256"
            ),
        )
        if launcher_strict:
            _validate_launcher_strict(identity)
        return identity

    @classmethod
    def from_canonical_json(cls, text: str | bytes) -> TeacherIdentity:
        """Read a stored identity (a row's ``identity_json``) back: the one reader.

        Strict JSON (``strict_read.loads_strict``: no duplicate keys, no NaN),
        at most ``MAX_IDENTITY_BYTES``, then every rule of ``from_mapping``.
        """
        data = text.encode("utf-8") if isinstance(text, str) else text
        if len(data) > MAX_IDENTITY_BYTES:
            raise IdentityError(
                f"stored identity is {len(data)} bytes, over {MAX_IDENTITY_BYTES}",
                rule="identity.size",
            )
        try:
            obj = loads_strict(data)
        except (DuplicateKeyError, UnicodeDecodeError, RecursionError, ValueError) as exc:
            raise IdentityError(
                f"stored identity is not strict JSON: {show(str(exc))}", rule="identity.json"
            ) from None
        return cls.from_mapping(obj)


def same_identity(a: TeacherIdentity, b: TeacherIdentity) -> bool:
    """The one sameness check: equal canonical bytes ``J`` (hence equal fingerprints)."""
    return a is b or a.canonical_bytes() == b.canonical_bytes()


def _check_sizes(
    vocab_size: object, max_top_k: object, max_model_len: object
) -> tuple[int, int, int]:
    """vocab_size, max_top_k (<= vocab_size) and max_model_len, in normative order."""
    vocab = check_int(vocab_size, "vocab_size", 1, MAX_VOCAB_SIZE)
    top_k = check_int(max_top_k, "max_top_k", 1, MAX_TOP_K)
    if top_k > vocab:
        raise IdentityError(
            f"max_top_k {top_k} exceeds vocab_size {vocab}", rule="identity.top_k_above_vocab"
        )
    model_len = check_int(max_model_len, "max_model_len", 1, MAX_MODEL_LEN)
    return vocab, top_k, model_len


def _check_constant(value: object, field: str, expected: str) -> None:
    if value != expected or not isinstance(value, str):
        raise IdentityError(
            f"{field} must be {expected!r}, got {show(value)}", rule=f"identity.{field}"
        )


def _validate_values(identity: TeacherIdentity) -> None:
    check_text(identity.served_model_id, "served_model_id")
    check_hex(identity.base_model_sha256, "base_model_sha256")
    check_hex(identity.tokenizer_vocab_sha256, "tokenizer_vocab_sha256")
    check_hex(identity.tokenizer_config_sha256, "tokenizer_config_sha256")
    if identity.adapter is not None and not isinstance(identity.adapter, AdapterIdentity):
        raise IdentityError("adapter must be null or an object", rule="identity.adapter_shape")
    vocab, top_k, model_len = _check_sizes(
        identity.vocab_size, identity.max_top_k, identity.max_model_len
    )
    validate_max_candidates(
        identity.max_prompt_logprob_candidates,
        max_top_k=top_k,
        vocab_size=vocab,
        max_model_len=model_len,
    )
    check_text(identity.implementation, "implementation")
    check_hex(identity.inference_config_sha256, "inference_config_sha256")
    size = len(identity.canonical_bytes())
    if size > MAX_IDENTITY_BYTES:
        raise IdentityError(
            f"canonical identity is {size} bytes, over {MAX_IDENTITY_BYTES}", rule="identity.size"
        )


def _validate_launcher_strict(identity: TeacherIdentity) -> None:
    check_launcher_budget(
        identity.max_prompt_logprob_candidates,
        max_top_k=identity.max_top_k,
        vocab_size=identity.vocab_size,
        max_model_len=identity.max_model_len,
    )
    if _SERVED_MODEL_ID.fullmatch(identity.served_model_id) is None:
        raise IdentityError(
            f"served_model_id {show(identity.served_model_id)} does not match"
            " ^[A-Za-z0-9][A-Za-z0-9._/-]*$",
            rule="identity.served_model_id_pattern",
        )
    if identity.adapter is not None and identity.adapter.name != identity.served_model_id:
        raise IdentityError(
            f"adapter.name {show(identity.adapter.name)} must equal served_model_id"
            f" {show(identity.served_model_id)}",
            rule="identity.adapter_name",
        )
    impl = identity.implementation
    if not impl.startswith("vllm:") or not vllm_version_supported(impl[len("vllm:") :]):
        raise IdentityError(
            f"implementation {show(impl)} must be 'vllm:<version>' with a release"
            " >= 0.20.1 (MAJOR.MINOR[.PATCH] and an optional [A-Za-z0-9.+-] suffix,"
            f" as Kiln reads it; {MIN_VLLM_VERSION} counts)",
            rule="identity.implementation",
        )


def validate_identity(identity: TeacherIdentity, *, launcher_strict: bool = False) -> None:
    """Check every value rule of section 1 (and the launcher's, when strict)."""
    _validate_values(identity)
    if launcher_strict:
        _validate_launcher_strict(identity)


# Identities are immutable and hashable, and every scoring response re-checks
# its fingerprint against the pinned one: memoize the three encodings.
@functools.lru_cache(maxsize=256)
def _canonical_bytes(identity: TeacherIdentity) -> bytes:
    return canonical_json(identity.to_dict())


@functools.lru_cache(maxsize=256)
def _digest(identity: TeacherIdentity) -> str:
    return hashlib.sha256(_canonical_bytes(identity)).hexdigest()


@functools.lru_cache(maxsize=256)
def _fingerprint(identity: TeacherIdentity) -> str:
    return fingerprint_of_canonical(_canonical_bytes(identity))
