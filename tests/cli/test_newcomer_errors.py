"""Issue 30 item 4: errors that say more (the CLI side).

Real subprocesses: ``kiln ... | head`` is a real pipe whose reader is gone
before the command writes; ``kiln-teacher --version`` is the console script.
The kiln.toml typo goes through ``load_config`` on a real file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from kiln_registry.config.loader import load_config
from kiln_registry.config.settings import KilnConfig
from kiln_registry.config.suggest import known_keys, suggestion
from kiln_registry.domain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _into_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) has already gone
    try:
        return subprocess.run(
            [sys.executable, "-m", "kiln_registry", *argv],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False, cwd=REPO,
        )  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv", [("--help",), ("completion", "bash"), ("jobs", "submit", "--help")]
)
def test_a_closed_pipe_ends_the_command_quietly(argv: tuple[str, ...]) -> None:
    done = _into_closed_pipe(*argv)
    # argparse swallows the write error of --help itself (status 0); a command's own
    # output ends with 141, as a tool killed by SIGPIPE does under `set -o pipefail`.
    expected = (0, 141) if "--help" in argv else (141,)
    assert done.stderr == "" and done.returncode in expected, done.stderr


def test_kiln_teacher_version() -> None:
    script = Path(sys.executable).parent / "kiln-teacher"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "kiln_registry.launcher"]
    done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=120)
    version = metadata.version("kiln-registry")
    assert (done.returncode, done.stdout) == (0, f"kiln-teacher {version}\n")


def test_an_unknown_key_suggests_the_nearest_known_one(tmp_path: Path) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text(
        '[server]\nprot = 8420\n[jobs]\nworkerz = 2\n[teachers.local.a]\nmodel_pth = "m"\n'
        "zzzzzz = 1\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(config)
    text = str(info.value)
    assert "unknown key 'prot' in [server] (neither Kiln nor kiln-registry has it);" \
        " did you mean `port`?" in text  # fmt: skip
    assert "did you mean `workers`?" in text and "did you mean `model_path`?" in text
    assert "'zzzzzz' in [teachers.local.a] (neither Kiln nor kiln-registry has it);" in text
    assert "port" in known_keys(KilnConfig, ("server",))
    assert suggestion(KilnConfig, ("serverr",)) == "server"
    assert suggestion(KilnConfig, ("server", "x" * 5000)) is None
