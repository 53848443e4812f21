"""kiln_registry.identity imports only the stdlib, pydantic, itself and kiln_registry.domain.

The identity layer is pure: no sockets, subprocesses, database, web framework
or heavy ML library.  This walks every module's imports with ``ast``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import kiln_registry.identity

IDENTITY_DIR = Path(kiln_registry.identity.__file__).parent
ALLOWED_THIRD_PARTY = {"pydantic"}
# kiln_registry.domain is the lowest layer (standard library only).
ALLOWED_PROJECT = ("kiln_registry.identity", "kiln_registry.domain.")
FORBIDDEN_STDLIB = {"socket", "subprocess", "sqlite3", "http", "urllib", "asyncio", "ssl"}


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.append("kiln_registry.identity." + (node.module or ""))
            elif node.module is not None:
                names.append(node.module)
    return names


def allowed(name: str) -> bool:
    top = name.split(".")[0]
    if name == "kiln_registry.identity" or name.startswith(ALLOWED_PROJECT):
        return True
    if top in ALLOWED_THIRD_PARTY:
        return True
    return top in sys.stdlib_module_names and top not in FORBIDDEN_STDLIB


MODULES = sorted(IDENTITY_DIR.glob("*.py"))


def test_modules_found() -> None:
    assert {"canonical.py", "document.py", "fingerprint.py"} <= {p.name for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_identity_imports(path: Path) -> None:
    bad = [name for name in imported_modules(path) if not allowed(name)]
    assert not bad, f"{path.name} imports {bad}"


def test_checker_catches_forbidden_imports() -> None:
    assert not allowed("socket")
    assert not allowed("kiln_registry.db.engine")
    assert not allowed("httpx")
    assert allowed("kiln_registry.domain.errors")
    assert allowed("hashlib")
