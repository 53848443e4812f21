"""The wheel carries everything a non-editable install needs at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import kiln_registry
from kiln_registry.db.engine import migrations_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel, built from a copy of the project (setuptools writes ``build/`` beside it)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in ("kiln_registry", "migrations"):
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (found,) = out.glob("kiln_registry-*.whl")
    return zipfile.ZipFile(found)


def test_the_migrations_are_the_top_level_folder() -> None:
    """An editable install resolves ``kiln_registry.migrations`` to ``migrations/``."""
    assert migrations_dir() == REPO / "migrations"
    assert (REPO / "migrations" / "env.py").is_file()
    assert not (Path(kiln_registry.__file__).parent / "migrations").exists()


def test_the_wheel_ships_every_migration_script(wheel: zipfile.ZipFile) -> None:
    wanted = {
        "kiln_registry/migrations/" + path.relative_to(migrations_dir()).as_posix()
        for path in migrations_dir().rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {"kiln_registry/migrations/env.py", "kiln_registry/migrations/script.py.mako"} <= wanted
    assert len([name for name in wanted if "/versions/" in name]) >= 3
    assert wanted <= set(wheel.namelist())


def test_every_package_folder_is_listed_for_the_build() -> None:
    """``pyproject.toml`` lists packages by hand (the migrations mapping needs it)."""
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    package = Path(kiln_registry.__file__).resolve().parent
    found = {
        init.parent.relative_to(package.parent).as_posix().replace("/", ".")
        for init in package.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found | {"kiln_registry.migrations", "kiln_registry.migrations.versions"} == listed


def test_the_wheel_ships_every_module(wheel: zipfile.ZipFile) -> None:
    package = Path(kiln_registry.__file__).resolve().parent
    modules = {
        path.relative_to(package.parent).as_posix()
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert modules <= set(wheel.namelist())


def test_the_wheel_ships_the_type_marker(wheel: zipfile.ZipFile) -> None:
    assert "kiln_registry/py.typed" in wheel.namelist()


def test_the_wheel_ships_the_browser_pages(wheel: zipfile.ZipFile) -> None:
    from kiln_registry.api.ui.assets import ASSETS, STATIC

    own = {name for name, (where, _) in ASSETS.items() if where == "own"}
    assert own == {path.name for path in STATIC.iterdir() if path.is_file()}
    assert {f"kiln_registry/api/ui/static/{name}" for name in own} <= set(wheel.namelist())
