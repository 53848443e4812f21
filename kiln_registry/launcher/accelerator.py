"""The accelerator identity of the running runtime (docs/identity.md section 7).

Owns ``accelerator_identity``: the ``type``, ``driver`` and ``devices`` that
an inference config binds, measured from the real runtime in the current
process and environment (device-visibility variables apply), with the same
values Kiln's launcher (``scripts/vllm_teacher.py``, ``probe_accelerator``)
measures, so one host gives one ``accelerator`` in both:

* cuda: driver ``nvidia:<driver>;cuda-runtime:<torch.version.cuda>``, where
  ``<driver>`` is ``nvidia-smi``'s driver versions (distinct, sorted, comma
  joined), else ``/proc/driver/nvidia/version``, else ``kernel-<release>``;
  each visible device gives its name, ``sm_<major><minor>`` and total memory.
* rocm (``torch.version.hip`` set): driver
  ``amdgpu:<module version or kernel-release>;hip-runtime:<hip>``,
  architecture ``gcnArchName``.
* xpu: driver ``level-zero:unknown;kernel:<release>``; metal: driver
  ``macos:<version>``, one device with memory 0.
* cpu otherwise: driver ``<system>:<release>``, one device 0 named as Kiln
  names it (``/proc/cpuinfo``'s ``model name`` when that file is at most 512
  bytes, else ``platform.processor()`` or the machine), architecture the
  machine, memory 0.

Every value is checked as an identity input runtime value (1 to 512 UTF-8
bytes, no C0 or DEL) and refused, never cleaned.  Also runnable as
``python -m kiln_registry.launcher.accelerator``, which prints the identity
as one line of canonical JSON: the launcher measures it that way under the
exact child environment, so torch is never imported into the launcher (or a
registry server that drives it).

Imports: standard library, ``kiln_registry.domain.errors`` and
``kiln_registry.identity``; torch only lazily inside ``accelerator_identity``.
Nothing happens at import time.
"""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import sys
from typing import Any

from kiln_registry.domain.errors import IdentityError, LauncherError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.input_manifest import (
    MAX_DEVICES,
    Accelerator,
    AcceleratorDevice,
    check_runtime_text,
)

MAX_SMALL_BYTES = 512
CPUINFO = "/proc/cpuinfo"
AMDGPU_VERSION = "/sys/module/amdgpu/version"
NVIDIA_PROC_VERSION = "/proc/driver/nvidia/version"


def accelerator_identity(*, use_torch: bool = True) -> Accelerator:
    """Measure the accelerator; deterministic across calls in one environment."""
    torch = _torch() if use_torch else None
    if torch is not None:
        found = _torch_accelerator(torch)
        if found is not None:
            return found
    return cpu_accelerator()


def cpu_accelerator() -> Accelerator:
    """The host CPU as a single device (index 0), named as Kiln names it."""
    machine = platform.machine() or "unknown"
    name = platform.processor() or platform.machine() or "unknown CPU"
    for line in (_read_small(CPUINFO) or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Hardware") and value.strip():
            name = value.strip()
            break
    driver = f"{platform.system()}:{platform.release()}"
    return _accelerator("cpu", driver, [(name, machine, 0)])


def _accelerator(kind: str, driver: str, devices: list[tuple[str, str, int]]) -> Accelerator:
    """Validate measured values as identity input values (refused, never cleaned)."""
    _device_count(len(devices), kind)
    try:
        return Accelerator(
            kind,
            check_runtime_text(driver, "accelerator.driver"),
            tuple(
                AcceleratorDevice(
                    index,
                    check_runtime_text(name, f"accelerator.devices[{index}].name"),
                    check_runtime_text(arch, f"accelerator.devices[{index}].architecture"),
                    memory,
                )
                for index, (name, arch, memory) in enumerate(devices)
            ),
        )
    except IdentityError as exc:
        raise LauncherError(
            f"the measured accelerator is not a valid identity value: {exc.message}",
            rule="accelerator.value",
        ) from None


def _torch() -> Any:
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch
    except Exception as exc:  # a broken torch install raises anything at import
        raise LauncherError(
            f"torch is installed but cannot be imported: {type(exc).__name__}",
            rule="accelerator.torch_import",
        ) from None
    return torch


def _torch_accelerator(torch: Any) -> Accelerator | None:
    try:
        if torch.cuda.is_available():
            return _cuda_like(torch)
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            driver = f"level-zero:unknown;kernel:{platform.release()}"
            count = int(xpu.device_count())
            return _accelerator("xpu", driver, _devices(xpu, count, "xpu"))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return _metal()
    except LauncherError:
        raise
    except Exception as exc:  # driver errors surface as RuntimeError and friends
        raise LauncherError(
            f"torch could not describe the accelerator: {type(exc).__name__}: {str(exc)[:200]}",
            rule="accelerator.torch_query",
        ) from None
    return None


def _device_count(count: int, what: str) -> int:
    if not 1 <= count <= MAX_DEVICES:
        raise LauncherError(
            f"{what} reports {count} devices; 1 to {MAX_DEVICES} are supported",
            rule="accelerator.device_count",
        )
    return count


def _cuda_like(torch: Any) -> Accelerator:
    hip = getattr(torch.version, "hip", None)
    kind = "rocm" if hip else "cuda"
    count = _device_count(int(torch.cuda.device_count()), f"torch.cuda ({kind})")
    devices = _devices(torch.cuda, count, kind)
    if hip:
        module = _read_small(AMDGPU_VERSION) or f"kernel-{platform.release()}"
        return _accelerator(kind, f"amdgpu:{module};hip-runtime:{hip}", devices)
    runtime = getattr(torch.version, "cuda", None) or "unknown"
    return _accelerator(kind, f"nvidia:{_nvidia_driver()};cuda-runtime:{runtime}", devices)


def _devices(api: Any, count: int, kind: str) -> list[tuple[str, str, int]]:
    """Name, architecture and memory of each device, as Kiln's probe reads them."""
    found = []
    for index in range(count):
        props = api.get_device_properties(index)
        name = getattr(props, "name", None) or _or_none(api.get_device_name, index)
        if kind == "rocm":
            arch = getattr(props, "gcnArchName", None)
        else:
            major, minor = getattr(props, "major", None), getattr(props, "minor", None)
            both = isinstance(major, int) and isinstance(minor, int)
            arch = f"sm_{major}{minor}" if both else None
        if not arch:
            capability = _or_none(api.get_device_capability, index)
            arch = f"{kind}_{capability[0]}{capability[1]}" if capability else None
        arch = arch or platform.machine() or "unknown"
        memory = int(getattr(props, "total_memory", 0))
        found.append((str(name or f"{kind}-{index}"), str(arch), memory))
    return found


def _or_none(call: Any, index: int) -> Any:
    try:
        return call(index)
    except Exception:  # an optional fallback, as in Kiln's probe
        return None


def _nvidia_driver() -> str:
    text = _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if text is not None:
        return ",".join(sorted(set(text.splitlines())))
    return _read_small(NVIDIA_PROC_VERSION) or f"kernel-{platform.release()}"


def _metal() -> Accelerator:
    name = _command_output(["sysctl", "-n", "machdep.cpu.brand_string"])
    name = name or platform.processor() or "Apple GPU"
    driver = f"macos:{platform.mac_ver()[0] or platform.release()}"
    return _accelerator("metal", driver, [(name, platform.machine() or "unknown", 0)])


def _read_small(path: str) -> str | None:
    """A file's stripped text, or None when unreadable, empty or over 512 bytes (Kiln's rule)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_SMALL_BYTES + 1)
    except OSError:
        return None
    if not data or len(data) > MAX_SMALL_BYTES:
        return None
    return data.decode("utf-8", "replace").strip() or None


def _command_output(argv: list[str]) -> str | None:
    """A command's stripped stdout (3 s, at most 512 bytes, status 0), else None."""
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=3, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or len(done.stdout) > MAX_SMALL_BYTES:
        return None
    return done.stdout.decode("utf-8", "replace").strip() or None


def main() -> None:
    """Print the accelerator identity as one line of canonical JSON."""
    try:
        found = accelerator_identity()
    except LauncherError as exc:
        sys.stderr.write(f"accelerator: error: {exc.one_line()}\n")
        raise SystemExit(2) from None
    sys.stdout.buffer.write(canonical_json(found.to_dict()) + b"\n")
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
