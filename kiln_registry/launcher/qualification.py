"""``kiln-teacher qualify``: the portable launcher checks that need no GPU.

Owns the qualification run and its receipt (``kiln.launcher-qualification.v1``):

1. the identity computed twice from the source tree and this runtime is
   byte-identical;
2. one mutated input at a time (a byte of the first shard, ``config.json``,
   ``tokenizer.json``, an extra file, the adapter weights and config; an
   inference option; a device-visibility variable) changes the identity or
   fails closed;
3. owned and unreviewed vLLM options and refused environment variables fail
   closed.

Mutations run on a private temporary copy (hard links where possible; a
mutated file is always a real copy), never on the operator's tree.

Decision: without vLLM installed, qualification still runs: the runtime
content covers the packages that are installed, the receipt lists the
missing ones under ``missing_packages``, the vLLM version is the stand-in
``MIN_VLLM_VERSION`` and ``launchable`` is false.  The receipt is written
atomically (temp file, fsync, rename, fsync of the directory).

Imports: standard library, ``kiln_registry.domain.errors``, ``kiln_registry.identity``
and sibling launcher modules; never torch or vLLM.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.util import find_spec

from kiln_registry.domain.errors import KilnError, LauncherError, PolicyError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.compose import ComposedIdentity, compose_identity
from kiln_registry.identity.document import MIN_VLLM_VERSION
from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.policy import (
    LauncherRequest,
    check_launch_environment,
    classify_vllm_options,
)
from kiln_registry.launcher.runtime import RUNTIME_PACKAGES, runtime_content
from kiln_registry.launcher.teacher_input import (
    RuntimePart,
    measure_accelerator,
    measure_model,
    teacher_input,
)

RECEIPT_SCHEMA = "kiln.launcher-qualification.v1"
REFUSED_OPTIONS: tuple[tuple[str, ...], ...] = (
    ("--load-format=pt",),
    ("--served-model-name=other",),
    ("--served_model_name=other",),
    ("--served-model=other",),
    ("--max-logp=9",),
    ("--trust-remote-code",),
    ("--tokenizer=/tmp/t",),
    ("--enable-lora",),
    ("--hf-overrides.architectures=X",),
    ("--config", "/tmp/c.yaml"),
    ("-O3",),
    ("--not-a-reviewed-option=1",),
)
REFUSED_VARIABLES: tuple[tuple[str, str], ...] = (
    ("PYTHONPATH", "/tmp"),
    ("LD_PRELOAD", "/tmp/x.so"),
    ("VLLM_PLUGINS", "x"),
    ("HF_HOME", "/tmp"),
    ("VLLM_CACHE_ROOT", "/tmp"),
    ("TRITON_CACHE_DIR", "/tmp"),
)
DEVICE_VARIABLE = "CUDA_VISIBLE_DEVICES"


@dataclass
class Qualification:
    """Collected check results; ``passed`` only when every check passed."""

    checks: list[dict[str, object]] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str) -> None:
        self.checks.append({"name": name, "passed": passed, "detail": detail})

    @property
    def passed(self) -> bool:
        return all(check["passed"] for check in self.checks)


def measure_installed_runtime(
    limiter: ReadRateLimiter, env: Mapping[str, str], packages: Sequence[str]
) -> tuple[RuntimePart, list[str]]:
    """Runtime content of the installed ``packages``; missing ones are listed."""
    present = [p for p in packages if find_spec(p) is not None]
    missing = [p for p in RUNTIME_PACKAGES if p not in present]
    content = runtime_content(limiter=limiter, packages=present)
    versions = {"python": content.versions["python"]}
    versions["python_implementation"] = content.versions["python_implementation"]
    for package in RUNTIME_PACKAGES:
        versions[package] = content.versions.get(package, _stand_in(package))
    return RuntimePart(versions, content.sha256, measure_accelerator(env)), missing


def _stand_in(package: str) -> str:
    return MIN_VLLM_VERSION if package == "vllm" else "0+not-installed"


@dataclass(frozen=True)
class _Identities:
    """Computes the identity of a (possibly mutated) source tree and options."""

    request: LauncherRequest
    runtime: RuntimePart
    env: Mapping[str, str]
    limiter: ReadRateLimiter

    def compute(
        self,
        model: str,
        adapter: str | None,
        options: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> ComposedIdentity:
        part = measure_model(model, adapter, limiter=self.limiter)
        inputs = teacher_input(part, self.runtime, served_model_id=self.request.served_model_id)
        return compose_identity(
            inputs,
            served_model_id=self.request.served_model_id,
            max_top_k=self.request.max_top_k,
            max_model_len=self.request.max_model_len,
            max_prompt_logprob_candidates=self.request.max_prompt_logprob_candidates,
            vllm_args=(*self.request.vllm_options.inference, *options),
            environment={**self.env, **(extra_env or {})},
            launcher_strict=True,
        )


def qualify(
    request: LauncherRequest,
    env: Mapping[str, str],
    *,
    packages: Sequence[str] = RUNTIME_PACKAGES,
) -> dict[str, object]:
    """Run every portable check; return the receipt document."""
    model, adapter = request.model_path, request.adapter_path
    if model is None:
        raise LauncherError("qualify needs --model-path", rule="qualify.model_path")
    child_env = dict(check_launch_environment(env).child_environment)
    limiter = ReadRateLimiter(request.max_provenance_read_mib_per_second)
    measure_model(model, adapter, limiter=limiter)  # a bad tree fails before runtime hashing
    runtime, missing = measure_installed_runtime(limiter, child_env, packages)
    again, _ = measure_installed_runtime(limiter, child_env, packages)
    identities = _Identities(request, runtime, child_env, limiter)
    result = Qualification()
    first = identities.compute(model, adapter)
    second = identities.compute(model, adapter)
    stable = first.identity.digest() == second.identity.digest() and runtime == again
    result.add("identity_stable", stable, "two computations from the source tree")
    _mutations(result, identities, model, adapter, first.identity.digest())
    _refusals(result, env)
    return {
        "schema": RECEIPT_SCHEMA,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "passed": result.passed,
        "launchable": not missing,
        "missing_packages": missing,
        "runtime_versions": runtime.versions,
        "runtime_content_sha256": runtime.content_sha256,
        "accelerator": runtime.accelerator.to_dict(),
        "identity_sha256": first.identity.digest(),
        "fingerprint": first.identity.fingerprint(),
        "checks": result.checks,
    }


def _mutations(
    result: Qualification, identities: _Identities, model: str, adapter: str | None, base: str
) -> None:
    work = tempfile.mkdtemp(prefix="kiln-qualify-")
    try:
        for name, tree, relpath, how in _file_mutations(model, adapter):
            copy_model = _link_tree(model, os.path.join(work, name, "model"))
            copy_adapter = None
            if adapter is not None:
                copy_adapter = _link_tree(adapter, os.path.join(work, name, "adapter"))
            root = copy_model if tree == "model" else (copy_adapter or copy_model)
            _mutate(os.path.join(root, relpath), how)
            computed = _attempt(lambda: identities.compute(copy_model, copy_adapter))  # noqa: B023
            _expect_change(result, f"mutate:{tree}/{relpath}:{how}", base, computed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    inference = identities.request.vllm_options.inference
    seed = "--seed=2" if "--seed=1" in inference else "--seed=1"
    computed = _attempt(lambda: identities.compute(model, adapter, (seed,)))
    _expect_change(result, f"option:{seed}", base, computed)
    device = {DEVICE_VARIABLE: "7"}
    computed = _attempt(lambda: identities.compute(model, adapter, (), device))
    _expect_change(result, f"environment:{DEVICE_VARIABLE}", base, computed)


def _attempt(compute: Callable[[], ComposedIdentity]) -> ComposedIdentity | KilnError:
    try:
        return compute()
    except KilnError as exc:
        return exc


def _expect_change(
    result: Qualification, name: str, base: str, computed: ComposedIdentity | KilnError
) -> None:
    if isinstance(computed, KilnError):
        result.add(name, True, f"failed closed ({computed.rule or computed.code})")
        return
    changed = computed.identity.digest() != base
    result.add(name, changed, "identity changed" if changed else "identity did NOT change")


def _file_mutations(model: str, adapter: str | None) -> list[tuple[str, str, str, str]]:
    shard = _first_shard(model)
    found = [
        ("shard", "model", shard, "flip"),
        ("config", "model", "config.json", "append-space"),
        ("tokenizer", "model", "tokenizer.json", "append-space"),
        ("extra", "model", "kiln-qualify-extra.txt", "create"),
    ]
    if adapter is not None:
        weights = next(
            n for n in ("adapter_model.safetensors", "adapter_model.bin")
            if os.path.exists(os.path.join(adapter, n))
        )  # fmt: skip
        found += [
            ("adapter-weights", "adapter", weights, "flip"),
            ("adapter-config", "adapter", "adapter_config.json", "append-space"),
        ]
    return found


def _first_shard(model: str) -> str:
    names = sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))
    if not names:
        raise LauncherError(f"{model} has no top-level .safetensors shard", rule="qualify.shard")
    return names[0]


def _link_tree(source: str, destination: str) -> str:
    """A private copy of ``source``: hard links where possible, copies otherwise."""

    def link_or_copy(src: str, dst: str) -> object:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(source, destination, symlinks=True, copy_function=link_or_copy)
    return destination


def _mutate(path: str, how: str) -> None:
    if how == "create":
        with open(path, "xb") as out:
            out.write(b"kiln qualification extra file\n")
        return
    with open(path, "rb") as source:
        data = bytearray(source.read())
    os.unlink(path)  # break the hard link: the source must never change
    if how == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data += b" "
    with open(path, "xb") as out:
        out.write(bytes(data))


def _refusals(result: Qualification, env: Mapping[str, str]) -> None:
    for tokens in REFUSED_OPTIONS:
        try:
            classify_vllm_options(tokens)
        except PolicyError as exc:
            result.add(f"refuse-option:{tokens[0]}", True, str(exc.rule))
        else:
            result.add(f"refuse-option:{tokens[0]}", False, "accepted")
    for name, value in REFUSED_VARIABLES:
        try:
            check_launch_environment({**env, name: value})
        except PolicyError as exc:
            result.add(f"refuse-variable:{name}", True, str(exc.rule))
        else:
            result.add(f"refuse-variable:{name}", False, "accepted")


def write_receipt(path: str, receipt: Mapping[str, object]) -> None:
    """Write the receipt atomically: temp file, fsync, rename, fsync(dir)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".receipt-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(canonical_json(dict(receipt)) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except OSError as exc:
        os.unlink(temp) if os.path.exists(temp) else None
        raise LauncherError(
            f"cannot write the receipt {path}: {exc.strerror}", rule="qualify.receipt"
        ) from None
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
