"""The launcher policy modules stay pure: standard library and the error tree only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import kiln_registry.launcher

LAUNCHER_DIR = Path(kiln_registry.launcher.__file__).parent
# Every policy module (policy.py and policy_*.py) is pure and may import the others.
POLICY_MODULES = tuple(sorted(path.name for path in LAUNCHER_DIR.glob("policy*.py")))
# The vLLM option tables moved below config into the pure vllm_options leaf (issue 29).
ALLOWED_PROJECT_IMPORTS = {
    "kiln_registry.domain.errors",
    "kiln_registry.vllm_options.options",
    "kiln_registry.vllm_options.tables",
} | {
    f"kiln_registry.launcher.{module.removesuffix('.py')}"
    for module in POLICY_MODULES
    if module != "policy.py"
}
# Standard-library modules that would give a pure policy I/O or process power.
FORBIDDEN_STDLIB = {
    "asyncio", "ctypes", "http", "io", "multiprocessing", "os", "pathlib", "shutil",
    "signal", "socket", "ssl", "subprocess", "tempfile", "threading", "urllib",
}  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative imports are not used"
            assert node.module is not None
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", POLICY_MODULES)
def test_policy_imports_only_stdlib_and_errors(module: str) -> None:
    for name in imported_modules(LAUNCHER_DIR / module):
        top = name.split(".", 1)[0]
        if top == "__future__":
            continue
        if top == "kiln_registry":
            assert name in ALLOWED_PROJECT_IMPORTS, f"{module} imports {name}"
            continue
        assert top in sys.stdlib_module_names, f"{module} imports non-stdlib {name}"
        assert top not in FORBIDDEN_STDLIB, f"{module} imports {name}"


@pytest.mark.parametrize("module", POLICY_MODULES)
def test_policy_module_has_no_top_level_side_effects(module: str) -> None:
    tree = ast.parse((LAUNCHER_DIR / module).read_text(encoding="utf-8"))
    for node in tree.body:
        # Only imports, definitions, constant assignments and the docstring.
        allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                   ast.AnnAssign)  # fmt: skip
        is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        assert isinstance(node, allowed) or is_docstring, f"{module}: {ast.dump(node)[:80]}"
