"""Every listed ``kiln`` command module must import: a failure is an error, not a gap (issue 29).

Real modules and real import failures: a name that no module has, and a real
module file (in ``tmp_path``, put on ``sys.path``) whose own import fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kiln_registry.cli import main


def _listed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(main, "COMMAND_MODULES", (*main.COMMAND_MODULES, name))


def test_a_missing_command_module_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _listed(monkeypatch, "kiln_registry.cli.absent_cmds")
    assert main.run(["--help"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: cli.command_module: the command module")
    assert "kiln_registry.cli.absent_cmds cannot be imported" in err
    assert "ModuleNotFoundError" in err and err.count("\n") == 1


def test_a_command_module_whose_import_fails_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "kiln_broken_cmds.py").write_text("import kiln_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kiln_broken_cmds", raising=False)
    _listed(monkeypatch, "kiln_broken_cmds")
    with pytest.raises(main.KilnError) as refused:
        main.build_parser()
    assert refused.value.rule == "cli.command_module"
    assert "kiln_no_such_dependency" in refused.value.message


def test_every_listed_command_module_registers_a_command() -> None:
    parser = main.build_parser()
    actions = [a for a in parser._actions if a.dest == "command"]
    commands = set(actions[0].choices or ())
    assert {"serve", "teachers", "jobs", "tokens", "completion"} <= commands
