"""Static LoRA adapter inspection (docs/identity.md section 4).

Owns ``inspect_adapter``: ``adapter_config.json`` must be a strict JSON
object; exactly one of ``adapter_model.safetensors`` / ``adapter_model.bin``
must exist as a non-empty regular file (both, neither, a symlink or an
empty file are refused).  Produces the weights digest, the raw config
digest and the vLLM rank cap.  The weights may be hashed by the caller
(``weights_record``) so a tree hashed once is never read twice.

Imports: standard library, ``kiln_registry.identity``, ``kiln_registry.model``
and ``kiln_registry.domain.errors``; never torch or transformers.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from kiln_registry.domain.errors import IdentityError
from kiln_registry.identity.digests import FileRecord, adapter_rank_cap, adapter_weights_sha256
from kiln_registry.identity.hashing import ReadRateLimiter, hash_file
from kiln_registry.identity.tree import SYMLINK_HINT, check_root_directory
from kiln_registry.model.files import read_json_object

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")
MAX_ADAPTER_CONFIG_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class AdapterInspection:
    filename: str
    weights_bytes: int
    weights_sha256: str
    config_sha256: str
    rank_cap: int


def _weights_file(directory: str) -> tuple[str, os.stat_result]:
    present: list[tuple[str, os.stat_result]] = []
    for name in WEIGHT_NAMES:
        path = os.path.join(directory, name)
        try:
            present.append((name, os.lstat(path)))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise IdentityError(
                f"cannot inspect {path}: {exc.strerror}", rule="adapter.weights"
            ) from None
    if not present:
        raise IdentityError(
            f"{directory} has neither adapter_model.safetensors nor adapter_model.bin",
            rule="adapter.weights_missing",
        )
    if len(present) > 1:
        raise IdentityError(
            f"{directory} has both adapter_model.safetensors and adapter_model.bin;"
            " the loader input is ambiguous",
            rule="adapter.weights_ambiguous",
        )
    name, info = present[0]
    path = os.path.join(directory, name)
    if stat.S_ISLNK(info.st_mode):
        raise IdentityError(
            f"{path} is a symbolic link", rule="adapter.weights_symlink", hint=SYMLINK_HINT
        )
    if not stat.S_ISREG(info.st_mode):
        raise IdentityError(f"{path} is not a regular file", rule="adapter.weights_not_regular")
    if info.st_size == 0:
        raise IdentityError(f"{path} is empty", rule="adapter.weights_empty")
    return name, info


def inspect_adapter(
    adapter_dir: str | os.PathLike[str],
    *,
    limiter: ReadRateLimiter,
    weights_record: FileRecord | None = None,
    config_record: FileRecord | None = None,
) -> AdapterInspection:
    """Digests and rank cap of a static adapter directory.

    ``weights_record`` / ``config_record``, when given, are hashes of the
    same files taken earlier (from a whole-tree hash); the config bytes read
    here must match ``config_record``.
    """
    directory = os.path.abspath(os.fspath(adapter_dir))
    check_root_directory(directory, "adapter directory")
    config_path = os.path.join(directory, ADAPTER_CONFIG)
    raw, config = read_json_object(
        config_path, rule="adapter.config", max_bytes=MAX_ADAPTER_CONFIG_BYTES, limiter=limiter
    )
    config_digest = hashlib.sha256(raw).digest()
    if config_record is not None and (config_record.digest, config_record.length) != (
        config_digest,
        len(raw),
    ):
        raise IdentityError(f"{config_path} changed after it was hashed", rule="adapter.changed")
    name, info = _weights_file(directory)
    if weights_record is None:
        weights_record = hash_file(
            os.path.join(directory, name), limiter=limiter, expected_length=info.st_size
        )
    elif weights_record.length != info.st_size:
        raise IdentityError(
            f"{directory}/{name} changed after it was hashed", rule="adapter.changed"
        )
    return AdapterInspection(
        filename=name,
        weights_bytes=weights_record.length,
        weights_sha256=adapter_weights_sha256(name, weights_record),
        config_sha256=config_digest.hex(),
        rank_cap=adapter_rank_cap(config),
    )
