"""Accelerator identity measured from the real runtime (a CPU host here)."""

from __future__ import annotations

import platform
from pathlib import Path

from kiln_registry.identity.input_manifest import parse_accelerator
from kiln_registry.launcher.accelerator import accelerator_identity, cpu_accelerator
from kiln_registry.launcher.teacher_input import measure_accelerator


def test_cpu_identity_is_real_and_valid() -> None:
    """The values Kiln's probe_accelerator (scripts/vllm_teacher.py) gives a CPU host."""
    found = cpu_accelerator()
    assert found.type == "cpu"
    assert found.driver == f"{platform.system()}:{platform.release()}"
    assert len(found.devices) == 1
    device = found.devices[0]
    assert device.index == 0 and device.architecture == platform.machine()
    assert device.total_memory_bytes == 0
    cpuinfo = Path("/proc/cpuinfo").read_bytes()
    if len(cpuinfo) > 512:  # Kiln reads at most 512 bytes, else falls back
        assert device.name == (platform.processor() or platform.machine())
    assert parse_accelerator(found.to_dict(), "test") == found


def test_deterministic_across_calls() -> None:
    assert accelerator_identity() == accelerator_identity()
    assert accelerator_identity(use_torch=False) == cpu_accelerator()


def test_measured_by_the_module_under_the_child_environment() -> None:
    # recheck.measure_accelerator runs `python -m kiln_registry.launcher.accelerator`.
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    assert measure_accelerator(env) == accelerator_identity()
