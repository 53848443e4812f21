"""``kiln serve`` start-up: overrides re-validated, secrets checked first, the example runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from kiln_registry.cli.main import run as kiln
from kiln_registry.config.loader import load_config
from kiln_registry.domain.errors import ConfigError
from kiln_registry.serve.startup import prepare
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import CLEAN_EXIT, REPO, ServerProcess, toml_str

EXAMPLE_SECRET = "example-secret-value-Kq2"


def _config(tmp_path: Path, tiny_model: TinyModel, extra: str = "") -> Path:
    text = (
        f"[server]\ndatabase = {toml_str(tmp_path / 'registry.db')}\n{extra}\n"
        f"[student]\nmodel_path = {toml_str(tiny_model.path)}\n"
        "[teachers.local.big]\nmodel_path = 'm'\nsnapshot_root = 's'\ncache_root = 'c'\n"
        "max_top_k = 8\nmax_model_len = 64\nport = 8000\n"
    )
    path = tmp_path / "kiln.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_overrides_are_applied_and_the_rest_is_kept(tmp_path: Path, tiny_model: TinyModel) -> None:
    path = _config(tmp_path, tiny_model)
    config = prepare(path, host="::1", port=9123)
    assert (config.server.host, config.server.port) == ("::1", 9123)
    assert config.model_dump(exclude={"server"}) == load_config(path).model_dump(exclude={"server"})
    assert prepare(path, host=None, port=None) == load_config(path)


@pytest.mark.parametrize(
    ("host", "port", "needle"),
    [
        (None, 8000, "teachers.local.big.port repeats the port of server.port"),
        ("Not A Host", None, "server.host"),
        (None, 0, "server.port"),
        (None, 70000, "server.port"),
    ],
)
def test_overrides_are_validated_with_the_whole_file(
    tmp_path: Path, tiny_model: TinyModel, host: str | None, port: int | None, needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        prepare(_config(tmp_path, tiny_model), host=host, port=port)
    assert caught.value.rule == "config.override"
    assert needle in caught.value.message and "--host/--port" in caught.value.message


def test_log_level_is_a_config_key(tmp_path: Path, tiny_model: TinyModel) -> None:
    assert load_config(_config(tmp_path, tiny_model)).server.log_level == "info"
    debug = _config(tmp_path, tiny_model, 'log_level = "debug"')
    assert load_config(debug).server.log_level == "debug"
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, tiny_model, 'log_level = "verbose"'))
    assert "server.log_level" in caught.value.message


@pytest.mark.secret_env("KILN_SERVER_TEST_KEY")
def test_serve_refuses_to_start_without_its_secret_variables(
    tmp_path: Path, tiny_model: TinyModel, capsys: pytest.CaptureFixture[str]
) -> None:
    credential = (
        "[teachers.credentials.remote]\norigin = 'https://teacher.example.com'\n"
        "api_key_env = 'KILN_SERVER_TEST_KEY'\n"
    )
    path = _config(tmp_path, tiny_model)
    path.write_text(path.read_text(encoding="utf-8") + credential, encoding="utf-8")
    assert kiln(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "KILN_SERVER_TEST_KEY" in err and "is not set" in err
    assert not (tmp_path / "registry.db").exists()  # refused before the database is opened


@pytest.mark.slow
def test_serve_runs_the_example_config(tmp_path: Path, tiny_model: TinyModel) -> None:
    shutil.copy(REPO / "kiln.toml.example", tmp_path / "kiln.toml")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "student").symlink_to(tiny_model.path, target_is_directory=True)
    env = {"KILN_VLLM_API_KEY": EXAMPLE_SECRET, "XDG_DATA_HOME": str(tmp_path / "data")}
    with ServerProcess(tmp_path / "kiln.toml", tmp_path / "serve.log", env=env) as server:
        server.wait_ready()
        health = httpx.get(server.url + "/health", trust_env=False, timeout=10)
        assert server.stop() in CLEAN_EXIT
    assert health.json() == {"status": "ok"}
    assert (tmp_path / "data" / "kiln-registry" / "registry.db").is_file()
    assert EXAMPLE_SECRET not in server.output()
