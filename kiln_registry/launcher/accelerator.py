"""The accelerator identity of the running runtime (identity-spec.md section 7).

Owns ``accelerator_identity``: the ``type``, ``driver`` and ``devices`` that
an inference config binds, measured from the real runtime in the current
process and environment (device-visibility variables apply):

* cuda / rocm: when torch is importable and ``torch.cuda.is_available()``;
  ROCm when ``torch.version.hip`` is set.  ``driver`` is
  ``cuda-runtime:<torch.version.cuda>`` or ``hip:<torch.version.hip>``; each
  visible device gives its name, ``sm_<major><minor>`` (CUDA) or
  ``gcnArchName`` (ROCm) and total memory.
* xpu: ``torch.xpu.is_available()``; metal: ``torch.backends.mps``.
* cpu otherwise: driver ``cpu:<machine>``, one device 0 named by
  ``/proc/cpuinfo``'s ``model name`` with ``MemTotal`` bytes.

Also runnable as ``python -m kiln_registry.launcher.accelerator``, which
prints the identity as one line of canonical JSON: the launcher measures it
that way under the exact child environment, so torch is never imported into
the launcher (or a registry server that drives it).

Imports: standard library, ``kiln_registry.errors`` and
``kiln_registry.identity``; torch only lazily inside ``accelerator_identity``.
Nothing happens at import time.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from typing import Any

from kiln_registry.errors import LauncherError
from kiln_registry.identity.canonical import canonical_json
from kiln_registry.identity.input_manifest import (
    MAX_DEVICES,
    Accelerator,
    AcceleratorDevice,
)

MAX_PROC_FILE_BYTES = 1024 * 1024
MAX_TEXT_CHARS = 256
CPUINFO = "/proc/cpuinfo"
MEMINFO = "/proc/meminfo"


def accelerator_identity(*, use_torch: bool = True) -> Accelerator:
    """Measure the accelerator; deterministic across calls in one environment."""
    torch = _torch() if use_torch else None
    if torch is not None:
        found = _torch_accelerator(torch)
        if found is not None:
            return found
    return cpu_accelerator()


def cpu_accelerator() -> Accelerator:
    """The host CPU as a single device (index 0)."""
    machine = _text(platform.machine() or "unknown")
    device = AcceleratorDevice(
        index=0,
        name=_cpu_model_name() or machine,
        architecture=machine,
        total_memory_bytes=_total_memory_bytes(),
    )
    return Accelerator(type="cpu", driver=f"cpu:{machine}", devices=(device,))


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
            return _xpu(torch)
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
    count = _device_count(int(torch.cuda.device_count()), "torch.cuda")
    devices = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        if hip:
            arch = str(getattr(props, "gcnArchName", "") or "unknown")
        else:
            arch = f"sm_{props.major}{props.minor}"
        devices.append(
            AcceleratorDevice(index, _text(props.name), _text(arch), int(props.total_memory))
        )
    if hip:
        return Accelerator("rocm", _text(f"hip:{hip}"), tuple(devices))
    return Accelerator("cuda", _text(f"cuda-runtime:{torch.version.cuda}"), tuple(devices))


def _xpu(torch: Any) -> Accelerator:
    count = _device_count(int(torch.xpu.device_count()), "torch.xpu")
    devices = []
    for index in range(count):
        props = torch.xpu.get_device_properties(index)
        arch = str(getattr(props, "platform_name", "") or "xpu")
        devices.append(
            AcceleratorDevice(index, _text(props.name), _text(arch), int(props.total_memory))
        )
    driver = getattr(torch.version, "xpu", None) or torch.__version__
    return Accelerator("xpu", _text(f"xpu:{driver}"), tuple(devices))


def _metal() -> Accelerator:
    machine = _text(platform.machine() or "arm64")
    device = AcceleratorDevice(0, "Apple MPS", machine, _total_memory_bytes())
    return Accelerator("metal", f"metal:{machine}", (device,))


def _text(value: str) -> str:
    """Printable, bounded text for a device field (never empty)."""
    cleaned = "".join(ch for ch in str(value) if ch.isprintable()).strip()
    return cleaned[:MAX_TEXT_CHARS] or "unknown"


def _read_proc(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_PROC_FILE_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def _cpu_model_name() -> str | None:
    text = _read_proc(CPUINFO)
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return _text(value)
    return None


def _total_memory_bytes() -> int:
    for line in (_read_proc(MEMINFO) or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * (1024 if parts[-1] == "kB" else 1)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 0
    if total <= 0:
        raise LauncherError(
            "cannot determine the host memory size", rule="accelerator.memory_unknown"
        )
    return total


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
