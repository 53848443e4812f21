"""The measured launch contract and the fresh child that re-measures it.

Owns the ``TeacherInput`` a launch measures (runtime versions and content,
accelerator, model and adapter digests), its canonical document (the
``kiln.vllm-teacher-input.v2`` shape, so it can be saved and read back by
``--identity-input``), and the pre-spawn recheck:

* ``measure_runtime``: runtime versions and content hashed in this process
  (files only; nothing is imported), and the accelerator measured by
  ``python -m kiln_registry.launcher.accelerator`` under the exact child
  environment, so torch is never imported into the launcher or a server
  that drives it, and device-visibility variables apply as vLLM sees them.
* ``measure_source``: the same contract for a source tree (dry-run,
  ``--manifest-only`` and qualification), through ``inspect_model``.
* ``run_recheck``: immediately before spawn, a fresh child started exactly
  like vLLM (same interpreter, no shell, no ``-I`` because vLLM runs without
  it, ``cwd="/"``, the exact child environment with
  ``PYTHONDONTWRITEBYTECODE=1``) runs this module's ``main``: it re-hashes
  the installed runtime, measures the accelerator and re-hashes the staged
  snapshot with its own limiter of the same numeric ceiling, then prints its
  document.  The parent requires byte equality with its own.

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.identity``,
``kiln_registry.model`` and the launcher's ``runtime`` / ``accelerator``
modules; never torch at module level.  Nothing happens at import time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kiln_registry.domain.errors import KilnError, LauncherError
from kiln_registry.identity.canonical import canonical_json, strict_json_loads
from kiln_registry.identity.digests import FileRecord, base_model_sha256
from kiln_registry.identity.document import AdapterIdentity
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.identity.input_manifest import (
    INPUT_SCHEMA,
    MAX_INPUT_BYTES,
    Accelerator,
    TeacherInput,
    parse_accelerator,
)
from kiln_registry.identity.snapshot_manifest import ManifestFile
from kiln_registry.identity.tree import TreeInventory, inventory_tree
from kiln_registry.launcher.accelerator import accelerator_identity
from kiln_registry.launcher.children import HelperChild, Interrupted
from kiln_registry.launcher.runtime import runtime_content
from kiln_registry.launcher.staging import StagedSnapshot
from kiln_registry.model.adapter import ADAPTER_CONFIG, WEIGHT_NAMES, inspect_adapter
from kiln_registry.model.files import read_json_object, read_small_file
from kiln_registry.model.inspect import inspect_model
from kiln_registry.model.shards import model_width, select_shards
from kiln_registry.model.tokenizer import (
    MAX_TOKENIZER_JSON_BYTES,
    TOKENIZER_JSON,
    TokenizerDigests,
    tokenizer_digests,
)

RECHECK_MODULE = "kiln_registry.launcher.teacher_input"
ACCELERATOR_MODULE = "kiln_registry.launcher.accelerator"
ACCELERATOR_TIMEOUT_SECONDS = 300.0
TokenizerReader = Callable[[str, int], TokenizerDigests]


@dataclass(frozen=True, slots=True)
class RuntimePart:
    """The runtime half of the contract: versions, content digest, accelerator."""

    versions: dict[str, str]
    content_sha256: str
    accelerator: Accelerator


@dataclass(frozen=True, slots=True)
class ModelPart:
    """The model half: digests of the (staged or source) model and adapter."""

    base_model_sha256: str
    snapshot_content_sha256: str
    model_config_sha256: str
    tokenizer_vocab_sha256: str
    tokenizer_config_sha256: str
    vocab_size: int
    adapter_weights_sha256: str | None = None
    adapter_config_sha256: str | None = None
    adapter_rank_cap: int | None = None


def teacher_input(model: ModelPart, runtime: RuntimePart, *, served_model_id: str) -> TeacherInput:
    """Join both halves; a launch's adapter is always named by the served model id."""
    adapter = None
    if model.adapter_weights_sha256 is not None and model.adapter_config_sha256 is not None:
        adapter = AdapterIdentity(
            name=served_model_id,
            weights_sha256=model.adapter_weights_sha256,
            config_sha256=model.adapter_config_sha256,
        )
    return TeacherInput(
        base_model_sha256=model.base_model_sha256,
        snapshot_content_sha256=model.snapshot_content_sha256,
        model_config_sha256=model.model_config_sha256,
        tokenizer_vocab_sha256=model.tokenizer_vocab_sha256,
        tokenizer_config_sha256=model.tokenizer_config_sha256,
        adapter=adapter,
        adapter_max_rank=model.adapter_rank_cap if adapter is not None else None,
        vocab_size=model.vocab_size,
        implementation="vllm:" + runtime.versions["vllm"],
        runtime_versions=dict(runtime.versions),
        runtime_content_sha256=runtime.content_sha256,
        accelerator=runtime.accelerator,
    )


def teacher_input_document(inputs: TeacherInput) -> dict[str, object]:
    """The ``kiln.vllm-teacher-input.v2`` document of ``inputs`` (spec key order)."""
    return {
        "schema": INPUT_SCHEMA,
        "base_model_sha256": inputs.base_model_sha256,
        "snapshot_content_sha256": inputs.snapshot_content_sha256,
        "model_config_sha256": inputs.model_config_sha256,
        "tokenizer_vocab_sha256": inputs.tokenizer_vocab_sha256,
        "tokenizer_config_sha256": inputs.tokenizer_config_sha256,
        "adapter": inputs.adapter.to_dict() if inputs.adapter is not None else None,
        "adapter_max_rank": inputs.adapter_max_rank,
        "vocab_size": inputs.vocab_size,
        "implementation": inputs.implementation,
        "runtime_versions": dict(inputs.runtime_versions),
        "runtime_content_sha256": inputs.runtime_content_sha256,
        "accelerator": inputs.accelerator.to_dict(),
    }


def start_accelerator_probe(env: Mapping[str, str], *, python: str = sys.executable) -> HelperChild:
    """Start ``python -m kiln_registry.launcher.accelerator`` under ``env`` (torch stays out)."""
    return HelperChild([python, "-m", ACCELERATOR_MODULE], env, what="accelerator probe")


def finish_accelerator_probe(child: HelperChild) -> Accelerator:
    try:
        data = child.finish(child.started + ACCELERATOR_TIMEOUT_SECONDS)
    finally:
        child.close()
    value = strict_json_loads(data, what="accelerator probe output", max_bytes=MAX_INPUT_BYTES)
    return parse_accelerator(value, "accelerator probe output")


def measure_accelerator(env: Mapping[str, str], *, python: str = sys.executable) -> Accelerator:
    """The accelerator as a child under ``env`` sees it (torch stays out of this process)."""
    return finish_accelerator_probe(start_accelerator_probe(env, python=python))


def measure_runtime(
    limiter: ReadRateLimiter, env: Mapping[str, str], *, python: str = sys.executable
) -> RuntimePart:
    """Runtime versions and content here, the accelerator in a child (both at once)."""
    child = start_accelerator_probe(env, python=python)
    try:
        content = runtime_content(limiter=limiter, python_executable=python)
    except BaseException:
        child.close()
        raise
    return RuntimePart(content.versions, content.sha256, finish_accelerator_probe(child))


def measure_model(
    model_dir: str, adapter_dir: str | None, *, limiter: ReadRateLimiter
) -> ModelPart:
    """Every model digest of a tree, with one full hash pass (``inspect_model``)."""
    found = inspect_model(model_dir, adapter_dir, limiter=limiter, use_transformers=True)
    adapter = found.adapter
    return ModelPart(
        base_model_sha256=found.base_model_sha256,
        snapshot_content_sha256=found.snapshot_content_sha256,
        model_config_sha256=found.model_config_sha256,
        tokenizer_vocab_sha256=found.tokenizer_vocab_sha256,
        tokenizer_config_sha256=found.tokenizer_config_sha256,
        vocab_size=found.vocab_size,
        adapter_weights_sha256=adapter.weights_sha256 if adapter else None,
        adapter_config_sha256=adapter.config_sha256 if adapter else None,
        adapter_rank_cap=adapter.rank_cap if adapter else None,
    )


def staged_model_part(
    snapshot: StagedSnapshot,
    *,
    limiter: ReadRateLimiter,
    tokenizer: TokenizerReader | None = None,
) -> ModelPart:
    """Model digests of a sealed snapshot from its manifest records (no weight re-hash).

    The staged trees are inventoried (no reads) and must list exactly the
    manifest's files with the manifest's lengths; ``config.json``,
    ``tokenizer.json`` and ``adapter_config.json`` are re-read and must match
    their manifest digests.  ``tokenizer(model_dir, width)`` gives the
    tokenizer digests (the launch asks its identity probe child); by default
    they are computed here, through Transformers.
    """
    if hashlib.sha256(snapshot.manifest).hexdigest() != snapshot.snapshot_content_sha256:
        raise LauncherError(
            f"{snapshot.path}: the manifest does not match its digest", rule="snapshot.manifest"
        )
    records = {f.path: f for f in snapshot.files}
    model = _staged_tree(str(snapshot.model_path), "model", records)
    shards = select_shards(model, limiter=limiter)
    config_path = os.path.join(model.root, "config.json")
    raw, config = read_json_object(config_path, rule="model.config", limiter=limiter)
    _check_bytes(raw, "model/config.json", records)
    width = model_width(config, source=config_path)
    tokenizer_path = os.path.join(model.root, TOKENIZER_JSON)
    tokenizer_raw = read_small_file(
        tokenizer_path, max_bytes=MAX_TOKENIZER_JSON_BYTES, rule="tokenizer.json", limiter=limiter
    )
    _check_bytes(tokenizer_raw, f"model/{TOKENIZER_JSON}", records)
    if tokenizer is None:
        found_tokenizer = tokenizer_digests(
            model.root, width, use_transformers=True, limiter=limiter
        )
    else:
        found_tokenizer = tokenizer(model.root, width)
    part = ModelPart(
        base_model_sha256=base_model_sha256(_record(records, f"model/{s.relpath}") for s in shards),
        snapshot_content_sha256=snapshot.snapshot_content_sha256,
        model_config_sha256=hashlib.sha256(raw).hexdigest(),
        tokenizer_vocab_sha256=found_tokenizer.vocab_sha256,
        tokenizer_config_sha256=found_tokenizer.config_sha256,
        vocab_size=width,
    )
    if snapshot.adapter_path is None:
        return part
    adapter = _staged_tree(str(snapshot.adapter_path), "adapter", records)
    found = inspect_adapter(
        adapter.root,
        limiter=limiter,
        weights_record=next(
            (_record(records, f"adapter/{n}") for n in WEIGHT_NAMES if f"adapter/{n}" in records),
            None,
        ),
        config_record=_record(records, f"adapter/{ADAPTER_CONFIG}"),
    )
    return dataclasses.replace(
        part,
        adapter_weights_sha256=found.weights_sha256,
        adapter_config_sha256=found.config_sha256,
        adapter_rank_cap=found.rank_cap,
    )


def _record(records: Mapping[str, ManifestFile], path: str) -> FileRecord:
    entry = records.get(path)
    if entry is None:
        raise LauncherError(f"the snapshot manifest has no {path}", rule="snapshot.manifest")
    return FileRecord(bytes.fromhex(entry.sha256), entry.bytes)


def _check_bytes(data: bytes, path: str, records: Mapping[str, ManifestFile]) -> None:
    record = _record(records, path)
    if (hashlib.sha256(data).digest(), len(data)) != (record.digest, record.length):
        raise LauncherError(
            f"staged {path} does not match the snapshot manifest", rule="snapshot.changed"
        )


def _staged_tree(root: str, prefix: str, records: Mapping[str, ManifestFile]) -> TreeInventory:
    """Inventory a staged tree; its files and lengths must be the manifest's."""
    tree = inventory_tree(root)
    found = {f"{prefix}/{f.relpath}": f.size for f in tree.files}
    listed = {p: r.bytes for p, r in records.items() if p.startswith(prefix + "/")}
    if found != listed:
        raise LauncherError(
            f"the staged {prefix} tree {root} does not list exactly the manifest's files",
            rule="snapshot.changed",
        )
    return tree


def measure_source(
    model_dir: str,
    adapter_dir: str | None,
    *,
    served_model_id: str,
    limiter: ReadRateLimiter,
    env: Mapping[str, str],
) -> TeacherInput:
    """The full contract of a source tree and this runtime (no snapshot)."""
    runtime = measure_runtime(limiter, env)
    model = measure_model(model_dir, adapter_dir, limiter=limiter)
    return teacher_input(model, runtime, served_model_id=served_model_id)


def recheck_argv(
    model_dir: str,
    adapter_dir: str | None,
    *,
    served_model_id: str,
    rate_mib_per_second: int | None,
    python: str = sys.executable,
) -> list[str]:
    argv = [python, "-m", RECHECK_MODULE, f"--model={model_dir}"]
    if adapter_dir is not None:
        argv.append(f"--adapter={adapter_dir}")
    argv.append(f"--served-model-id={served_model_id}")
    if rate_mib_per_second is not None:
        argv.append(f"--max-read-mib-per-second={rate_mib_per_second}")
    return argv


def run_recheck(argv: Sequence[str], env: Mapping[str, str], *, expected: TeacherInput) -> None:
    """Run the recheck child and require its document to equal ``expected`` byte for byte."""
    child = HelperChild(argv, env, what="pre-spawn recheck")
    try:
        finish_recheck(child, expected=expected)
    finally:
        child.close()


def start_recheck(argv: Sequence[str], env: Mapping[str, str]) -> HelperChild:
    """Start the recheck child now (it re-measures while the launcher measures)."""
    return HelperChild(argv, env, what="pre-spawn recheck")


def finish_recheck(
    child: HelperChild, *, expected: TeacherInput, interrupted: Interrupted | None = None
) -> None:
    """Wait for the recheck child; its document must equal ``expected`` byte for byte.

    ``interrupted`` as in ``HelperChild.finish`` (``ChildWaitInterrupted``).
    """
    data = child.finish(interrupted=interrupted)
    want = canonical_json(teacher_input_document(expected)) + b"\n"
    if data != want:
        raise LauncherError(
            "the pre-spawn recheck measured a different runtime, accelerator or snapshot than "
            "the launcher (the installed runtime or staged tree changed, or the environment "
            "resolves imports differently)",
            rule="launcher.recheck_mismatch",
        )


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=RECHECK_MODULE, allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapter")
    parser.add_argument("--served-model-id", required=True)
    parser.add_argument("--max-read-mib-per-second", type=int)
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """The child: re-measure everything and print the document (one line)."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        limiter = ReadRateLimiter(args.max_read_mib_per_second)
        # The runtime digest (file reads and hashing) overlaps the torch and
        # Transformers imports of the accelerator and tokenizer measurements.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-runtime") as pool:
            content_job = pool.submit(runtime_content, limiter=limiter)
            accelerator = accelerator_identity()
            model = measure_model(args.model, args.adapter, limiter=limiter)
            content = content_job.result()
        runtime = RuntimePart(content.versions, content.sha256, accelerator)
        inputs = teacher_input(model, runtime, served_model_id=args.served_model_id)
    except KilnError as exc:
        sys.stderr.write(f"kiln-teacher recheck: error: {exc.one_line()}\n")
        return 2
    sys.stdout.buffer.write(canonical_json(teacher_input_document(inputs)) + b"\n")
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
