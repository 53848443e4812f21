"""Issue 30 item 1: no ``kiln`` command ends in a traceback for a missing optional package.

Each command that can reach an optional package (the PostgreSQL driver, torch,
Transformers, safetensors, vLLM) runs as a real subprocess in an interpreter
where those packages are not importable (``tests/cli/no_extras.py``, the
commented stand-in for "not installed") and must print one ``kiln: error:``
line naming the extra to install.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiln_registry.testing.tiny_models import TinyModel
from tests.cli.no_extras import build_python_without_extras

PG_URL = "postgresql+psycopg://kiln@127.0.0.1:9/kiln"
POSTGRES_HINT = "pip install 'kiln-registry[postgres]'"
REFERENCE_HINT = "pip install 'kiln-registry[reference]'"


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_python_without_extras(tmp_path_factory.mktemp("no-extras"))


def _kiln(python: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    [done] = _kiln_all(python, [argv], cwd=cwd)
    return done


def _kiln_all(
    python: Path, argvs: list[tuple[str, ...]], *, cwd: Path
) -> list[subprocess.CompletedProcess[str]]:
    """Run the commands side by side (each is mostly interpreter start-up)."""
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, cwd=cwd)
        for command in ([str(python), "-m", "kiln_registry", *argv] for argv in argvs)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _one_error_line(done: subprocess.CompletedProcess[str], hint: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("kiln: error:") and hint in lines[-1], done.stderr


def _configs(tmp_path: Path, model: Path) -> tuple[Path, Path]:
    pg = tmp_path / "pg.toml"
    pg.write_text(
        f'[server]\ndatabase = "{PG_URL}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[student]\nmodel_path = "{model}"\n',
        encoding="utf-8",
    )
    sqlite = tmp_path / "sqlite.toml"
    sqlite.write_text(
        f'[server]\ndatabase = "{tmp_path / "registry.db"}"\n[student]\nmodel_path = "{model}"\n',
        encoding="utf-8",
    )
    return pg, sqlite


def test_the_blocker_really_hides_the_extras(python: Path) -> None:
    code = "import importlib.util as u\nprint(u.find_spec('sqlalchemy') is not None)\n"
    code += "import psycopg"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout == "True\n" and "ModuleNotFoundError" in done.stderr


def test_postgres_commands_name_the_postgres_extra(
    python: Path, tmp_path: Path, tiny_model: TinyModel
) -> None:
    pg, sqlite = _configs(tmp_path, tiny_model.path)
    up = _kiln(python, "db", "upgrade", "--config", str(sqlite), cwd=tmp_path)
    assert up.returncode == 0, up.stderr  # SQLite needs no extra
    argvs = [
        ("db", "upgrade", "--config", str(pg)),
        ("db", "copy", "--from", str(tmp_path / "registry.db"), "--to", PG_URL),
        ("serve", "--config", str(pg)),
        ("worker", "--config", str(pg)),
    ]
    for done in _kiln_all(python, argvs, cwd=tmp_path):
        _one_error_line(done, POSTGRES_HINT)


def test_model_commands_name_their_extra(
    python: Path, tmp_path: Path, tiny_model: TinyModel
) -> None:
    teacher = ("reference-teacher", "--model-path", str(tiny_model.path), "--served-model-id",
               "t", "--max-top-k", "4", "--max-model-len", "64")  # fmt: skip
    demo = ("demo", "--cache-dir", str(tmp_path / "cache"))
    identity = ("identity", str(tiny_model.path))
    done = _kiln_all(python, [teacher, demo, identity], cwd=tmp_path)
    _one_error_line(done[0], REFERENCE_HINT)
    _one_error_line(done[1], "kiln-registry[reference]")
    _one_error_line(done[2], "pip install 'kiln-registry[launcher]'")
