"""The precomputed teacher input ``kiln.vllm-teacher-input.v2`` (docs/identity.md section 9).

Owns reading and validating the strict input file that lets
``--manifest-only`` and ``--dry-run`` compute an identity without importing
vLLM, Transformers or torch and without reading model weights; it never
serves a real launch.  Also owns the ``runtime_versions`` and
``accelerator`` value rules, which the inference config reuses; they are
Kiln's (``scripts/vllm_teacher.py``): each text value 1..=512 UTF-8 bytes
without a C0 control character or DEL, device memory any integer >= 0 (Kiln
reports 0 for CPU and Metal devices).

The file must be a regular file (not a symlink) of at most 64 KiB, checked
before it is read whole, holding strict JSON with exactly the spec's keys.
Refusals are ``IdentityError`` with ``rule="input.<name>"`` (or
``json.<name>``) naming the file.  Imports: standard library,
``kiln_registry.domain.errors`` and ``kiln_registry.identity`` only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity import strict_read
from kiln_registry.identity.canonical import strict_json_loads
from kiln_registry.identity.digests import ADAPTER_RANK_CAPS
from kiln_registry.identity.document import (
    MAX_VOCAB_SIZE,
    AdapterIdentity,
    check_hex,
    check_int,
    check_keys,
    check_text,
    show,
)
from kiln_registry.identity.strict_read import FileProblem, Problem

INPUT_SCHEMA = "kiln.vllm-teacher-input.v2"
MAX_INPUT_BYTES = 64 * 1024
INPUT_KEYS: tuple[str, ...] = (
    "schema",
    "base_model_sha256",
    "snapshot_content_sha256",
    "model_config_sha256",
    "tokenizer_vocab_sha256",
    "tokenizer_config_sha256",
    "adapter",
    "adapter_max_rank",
    "vocab_size",
    "implementation",
    "runtime_versions",
    "runtime_content_sha256",
    "accelerator",
)
RUNTIME_VERSION_KEYS: tuple[str, ...] = (
    "python",
    "python_implementation",
    "vllm",
    "torch",
    "transformers",
    "tokenizers",
)
ACCELERATOR_KEYS: tuple[str, ...] = ("type", "driver", "devices")
DEVICE_KEYS: tuple[str, ...] = ("index", "name", "architecture", "total_memory_bytes")
ACCELERATOR_TYPES: tuple[str, ...] = ("cpu", "cuda", "rocm", "metal", "xpu")
MAX_DEVICES = 256
MAX_MEMORY_BYTES = 2**64 - 1
# Kiln's runtime values (versions, driver, device name, architecture): non-empty,
# at most 512 UTF-8 bytes, no C0 control character or DEL.
MAX_RUNTIME_TEXT_BYTES = 512
_P = "input"


def check_runtime_text(value: object, field: str) -> str:
    """A runtime value as Kiln bounds it: 1..=512 UTF-8 bytes, no C0 or DEL."""
    if not isinstance(value, str):
        raise IdentityError(
            f"{field} must be a string, got {type(value).__name__}", rule="input.text_type"
        )
    if len(value) > MAX_RUNTIME_TEXT_BYTES:  # a character is at least one byte
        raise IdentityError(
            f"{field} is over {MAX_RUNTIME_TEXT_BYTES} UTF-8 bytes", rule="input.text_too_long"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise IdentityError(
            f"{field} is not valid UTF-8 (lone surrogate)", rule="input.text_utf8"
        ) from None
    if size == 0:
        raise IdentityError(f"{field} must not be empty", rule="input.text_empty")
    if size > MAX_RUNTIME_TEXT_BYTES:
        raise IdentityError(
            f"{field} is over {MAX_RUNTIME_TEXT_BYTES} UTF-8 bytes", rule="input.text_too_long"
        )
    bad = next((ch for ch in value if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise IdentityError(
            f"{field} contains the control character U+{ord(bad):04X}", rule="input.text_control"
        )
    return value


@dataclass(frozen=True, slots=True)
class AcceleratorDevice:
    index: int
    name: str
    architecture: str
    total_memory_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "name": self.name,
            "architecture": self.architecture,
            "total_memory_bytes": self.total_memory_bytes,
        }


@dataclass(frozen=True, slots=True)
class Accelerator:
    type: str
    driver: str
    devices: tuple[AcceleratorDevice, ...]

    def to_dict(self) -> dict[str, object]:
        """The spec's key order: type, driver, devices (each index, name, ...)."""
        return {
            "type": self.type,
            "driver": self.driver,
            "devices": [device.to_dict() for device in self.devices],
        }


@dataclass(frozen=True, slots=True)
class TeacherInput:
    base_model_sha256: str
    snapshot_content_sha256: str
    model_config_sha256: str
    tokenizer_vocab_sha256: str
    tokenizer_config_sha256: str
    adapter: AdapterIdentity | None
    adapter_max_rank: int | None
    vocab_size: int
    implementation: str
    runtime_versions: dict[str, str]
    runtime_content_sha256: str
    accelerator: Accelerator


def parse_runtime_versions(obj: object, field: str) -> dict[str, str]:
    """Exactly the six runtime version keys, returned in the spec's order."""
    values = check_keys(obj, RUNTIME_VERSION_KEYS, field, prefix=_P)
    return {key: check_runtime_text(values[key], f"{field}.{key}") for key in RUNTIME_VERSION_KEYS}


def _parse_device(obj: object, position: int, field: str) -> AcceleratorDevice:
    where = f"{field}.devices[{position}]"
    values = check_keys(obj, DEVICE_KEYS, where, prefix=_P)
    index = check_int(values["index"], f"{where}.index", 0, MAX_DEVICES - 1, prefix=_P)
    if index != position:
        raise IdentityError(
            f"{where}.index is {index}; devices are indexed from 0 in order",
            rule="input.device_index",
        )
    return AcceleratorDevice(
        index=index,
        name=check_runtime_text(values["name"], f"{where}.name"),
        architecture=check_runtime_text(values["architecture"], f"{where}.architecture"),
        total_memory_bytes=check_int(  # Kiln's CPU, Metal and unknown devices report 0
            values["total_memory_bytes"],
            f"{where}.total_memory_bytes",
            0,
            MAX_MEMORY_BYTES,
            prefix=_P,
        ),
    )


def parse_accelerator(obj: object, field: str) -> Accelerator:
    """Accelerator type, driver and 1 to 256 devices indexed from 0."""
    values = check_keys(obj, ACCELERATOR_KEYS, field, prefix=_P)
    kind = values["type"]
    if not isinstance(kind, str) or kind not in ACCELERATOR_TYPES:
        raise IdentityError(
            f"{field}.type must be one of {', '.join(ACCELERATOR_TYPES)}, got {show(kind)}",
            rule="input.accelerator_type",
        )
    driver = check_runtime_text(values["driver"], f"{field}.driver")
    devices = values["devices"]
    if not isinstance(devices, list) or not 1 <= len(devices) <= MAX_DEVICES:
        raise IdentityError(
            f"{field}.devices must be a list of 1 to {MAX_DEVICES} devices",
            rule="input.device_count",
        )
    parsed = tuple(_parse_device(device, i, field) for i, device in enumerate(devices))
    return Accelerator(type=kind, driver=driver, devices=parsed)


def _parse_adapter(
    values: Mapping[str, object], source: str
) -> tuple[AdapterIdentity | None, int | None]:
    raw, rank = values["adapter"], values["adapter_max_rank"]
    if raw is None:
        if rank is not None:
            raise IdentityError(
                f"{source}: adapter_max_rank must be null when adapter is null",
                rule="input.adapter_max_rank",
            )
        return None, None
    adapter = AdapterIdentity.from_mapping(raw, field=f"{source}: adapter", prefix=_P)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in ADAPTER_RANK_CAPS:
        raise IdentityError(
            f"{source}: adapter_max_rank must be one of {list(ADAPTER_RANK_CAPS)} with an"
            f" adapter, got {show(rank)}",
            rule="input.adapter_max_rank",
        )
    return adapter, rank


def _from_values(values: dict[str, object], source: str) -> TeacherInput:
    def hex_field(key: str) -> str:
        return check_hex(values[key], f"{source}: {key}", prefix=_P)

    if values["schema"] != INPUT_SCHEMA:
        raise IdentityError(
            f"{source}: schema must be {INPUT_SCHEMA!r}, got {show(values['schema'])}",
            rule="input.schema",
        )
    hashes = {key: hex_field(key) for key in INPUT_KEYS[1:6]}
    adapter, rank = _parse_adapter(values, source)
    vocab = check_int(values["vocab_size"], f"{source}: vocab_size", 1, MAX_VOCAB_SIZE, prefix=_P)
    implementation = check_text(values["implementation"], f"{source}: implementation", prefix=_P)
    versions = parse_runtime_versions(values["runtime_versions"], f"{source}: runtime_versions")
    if implementation != "vllm:" + versions["vllm"]:
        raise IdentityError(
            f"{source}: implementation {show(implementation)} must equal"
            f" 'vllm:' + runtime_versions.vllm ({show('vllm:' + versions['vllm'])})",
            rule="input.implementation",
        )
    return TeacherInput(
        **hashes,
        adapter=adapter,
        adapter_max_rank=rank,
        vocab_size=vocab,
        implementation=implementation,
        runtime_versions=versions,
        runtime_content_sha256=hex_field("runtime_content_sha256"),
        accelerator=parse_accelerator(values["accelerator"], f"{source}: accelerator"),
    )


def parse_teacher_input(data: bytes, *, source: str) -> TeacherInput:
    """Validate the bytes of an input file; ``source`` names it in messages."""
    obj = strict_json_loads(data, what=source, max_bytes=MAX_INPUT_BYTES)
    values = check_keys(obj, INPUT_KEYS, source, prefix=_P)
    return _from_values(values, source)


def read_regular_file(path: str | os.PathLike[str], *, what: str, max_bytes: int) -> bytes:
    """Bytes of a regular, non-symlink file, refused above ``max_bytes`` before reading."""
    name = f"{what} {os.fsdecode(path)}"

    def refuse(problem: FileProblem) -> IdentityError:
        if problem.kind in (Problem.SYMLINK, Problem.NOT_REGULAR):
            return IdentityError(
                f"{name} is not a regular file (symlinks are refused)", rule="input.not_regular"
            )
        if problem.kind is Problem.TOO_LARGE:
            return IdentityError(
                f"{name} is {problem.size} bytes, over {max_bytes}", rule="input.too_large"
            )
        if problem.kind is Problem.GREW:
            return IdentityError(f"{name} grew past {max_bytes} bytes", rule="input.too_large")
        verb = "open" if problem.kind is Problem.OPEN else "read"
        return IdentityError(f"cannot {verb} {name}: {problem.detail}", rule="input.unreadable")

    data, _ = strict_read.read_regular_file(path, limit=max_bytes, refuse=refuse)
    return data


def load_teacher_input(path: str | os.PathLike[str]) -> TeacherInput:
    """Read and validate a regular, non-symlink input file of at most 64 KiB."""
    data = read_regular_file(path, what="teacher input", max_bytes=MAX_INPUT_BYTES)
    return parse_teacher_input(data, source=os.fsdecode(path))
