"""Issue 27 item 14: a flag that names an environment variable never echoes a bad value.

``kiln db copy --to-password-env 's3cr3t'`` printed the value back.  Every
``kiln`` flag that names a variable now refuses text that is not a variable
name with a usage error (exit status 2) that does not quote it: the text may
be the secret itself, pasted by mistake.  The commands run in process
through ``kiln``'s own entry point; each is refused while its arguments are
parsed, before anything is opened or contacted.
"""

from __future__ import annotations

import pytest

from kiln_registry.cli.main import run

SECRET = "s3cr3t-Hunter2!"
# One command line per flag that names a variable; {} is where the value goes.
COMMANDS = [
    ["db", "copy", "--from", "a.db", "--to", "b.db", "--to-password-env", "{}"],
    ["db", "copy", "--from", "a.db", "--to", "b.db", "--from-password-env", "{}"],
    ["teachers", "list", "--token-env", "{}"],
    ["teachers", "parity", "--url", "http://127.0.0.1:1", "--api-key-env-a", "{}"],
    ["teachers", "parity", "--url", "http://127.0.0.1:1", "--api-key-env-b", "{}"],
    ["reference-teacher", "--model-path", "m", "--served-model-id", "t", "--max-top-k", "1",
     "--max-model-len", "8", "--api-key-env", "{}"],
]  # fmt: skip


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        run(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2, (argv, captured)
    return captured.out + captured.err


@pytest.mark.parametrize("template", COMMANDS, ids=lambda t: f"{t[0]}-{t[-2]}")
@pytest.mark.parametrize("value", [SECRET, f"={SECRET}", "A" * 129, "1ABC", "KILN TOKEN"])
def test_env_flag_refuses_a_non_name_without_echoing_it(
    template: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = template[-2]
    argv = [value if part == "{}" else part for part in template]
    output = _refused(argv, capsys)
    assert f"argument {flag}" in output and "NAME of an environment variable" in output
    assert value not in output and SECRET not in output


@pytest.mark.parametrize("template", COMMANDS[:1])
def test_env_flag_in_equals_form_is_refused_too(
    template: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*template[:-2], f"{template[-2]}={SECRET}"]
    output = _refused(argv, capsys)
    assert "NAME of an environment variable" in output and SECRET not in output


def test_a_valid_name_passes_the_flag_and_the_unset_variable_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KILN_TEST_UNSET_TOKEN", raising=False)
    code = run(["teachers", "list", "--token-env", "KILN_TEST_UNSET_TOKEN"])
    output = capsys.readouterr()
    assert code != 0 and "KILN_TEST_UNSET_TOKEN" in output.out + output.err
