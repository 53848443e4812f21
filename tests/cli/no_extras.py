"""An interpreter without the optional extras, for the "package not installed" paths.

The test environment has every extra installed (psycopg, torch, transformers,
safetensors, vLLM's CPU build).  Uninstalling them is not possible here, so
this builds a small virtual environment that sees the test environment's
packages (``site.addsitedir`` over its site directories, which also runs the
editable install's finder) behind a meta-path blocker: importing one of
``BLOCKED`` raises ``ModuleNotFoundError`` exactly as it does when the
package is not installed.  This blocker is the stand-in for "not installed".
"""

from __future__ import annotations

import site
from pathlib import Path

from tests.no_vllm import bare_venv

BLOCKED = ("psycopg", "psycopg_binary", "torch", "transformers", "safetensors", "vllm")

_BLOCKER = """
import importlib.abc, site, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
for directory in {sites!r}:
    site.addsitedir(directory)
"""


def build_python_without_extras(dest: Path) -> Path:
    """Create the environment under ``dest``; return its python executable."""
    python, purelib = bare_venv(dest)
    sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    code = _BLOCKER.format(blocked=frozenset(BLOCKED), sites=sites)
    (Path(purelib) / "kiln_tests_no_extras.py").write_text(code, encoding="utf-8")
    (Path(purelib) / "kiln_tests_no_extras.pth").write_text(
        "import kiln_tests_no_extras\n", encoding="utf-8"
    )
    return python
