"""kiln.toml loading: the example, unknown keys, ids, paths, start-up checks."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pydantic
import pytest

from kiln_registry.config.kiln import KilnServerKeys
from kiln_registry.config.loader import MAX_CONFIG_BYTES, check_startup_environment, load_config
from kiln_registry.config.settings import (
    CredentialConfig,
    JobsConfig,
    KilnConfig,
    LocalTeacherConfig,
    ServerConfig,
    StudentConfig,
    TeachersConfig,
    default_database_path,
)
from kiln_registry.domain.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "kiln.toml.example"
STUDENT = '[student]\nmodel_path = "student"\n'
CREDENTIAL = (
    '[teachers.credentials.primary-vllm]\norigin = "https://teacher.example.com:8443"\n'
    'api_key_env = "KILN_TEST_CONFIG_KEY"\n'
)
LOCAL = """[teachers.local.big]
model_path = "teacher"
snapshot_root = "snaps"
cache_root = "caches"
max_top_k = 8
max_model_len = 64
port = 8000
"""


def make_model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"vocab_size": 8}')
    (path / "tokenizer.json").write_text("{}")
    return path


def write(tmp_path: Path, text: str, name: str = "kiln.toml") -> Path:
    make_model(tmp_path / "student")
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    return caught.value


def test_the_example_loads(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "kiln.toml")
    make_model(tmp_path / "models" / "student")
    config = load_config(tmp_path / "kiln.toml")
    assert config.student.model_path == tmp_path / "models" / "student"
    assert config.server.host == "127.0.0.1"
    assert config.server.port == 8420
    assert config.server.database == default_database_path()
    credential = config.teachers.credentials["primary-vllm"]
    assert credential.origin == "https://teacher.example.com:8443"
    assert credential.api_key_env == "KILN_VLLM_API_KEY"
    profile = config.teachers.local["teacher-large"]
    assert profile.snapshot_root == tmp_path / "var" / "teacher-snapshots"
    assert profile.vllm_args == ("--seed=0", "--gpu-memory-utilization=0.9")
    assert config.jobs.devices == ("cpu",)
    assert config.secret_env_names() == frozenset({"KILN_VLLM_API_KEY"})


@pytest.mark.parametrize(
    "model",
    [ServerConfig, StudentConfig, CredentialConfig, LocalTeacherConfig, TeachersConfig, JobsConfig],
)
def test_the_example_documents_every_key(model: type[pydantic.BaseModel]) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    # Kiln's own [server] keys are listed in docs/configuration.md; the example
    # shows the one the registry uses.
    kiln_only = set(KilnServerKeys.model_fields) - {"request_timeout_secs"}
    for key in set(model.model_fields) - kiln_only:
        if model is TeachersConfig:
            assert f"[teachers.{key}." in text
        else:
            assert re.search(rf"^(# )?{key} = ", text, re.MULTILINE), key


def test_documentation_names_every_key() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for model in (ServerConfig, StudentConfig, CredentialConfig, LocalTeacherConfig, JobsConfig):
        for key in model.model_fields:
            assert f"`{key}`" in text, key


def test_a_minimal_file_gets_every_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, STUDENT))
    assert config.server == ServerConfig()
    assert config.server.database.name == "registry.db"
    assert config.server.probe_timeout_s == 10.0
    assert config.server.log_format == "text"
    assert config.teachers.credentials == {}
    assert config.jobs == JobsConfig()
    assert (config.jobs.workers, config.jobs.concurrency, config.jobs.cache) == (1, 4, True)
    with pytest.raises(pydantic.ValidationError):
        config.server.port = 1


@pytest.mark.parametrize(
    ("text", "path", "section"),
    [
        ("colour = 1\n" + STUDENT, "colour", "the top level"),
        (STUDENT + "[server]\nprot = 1\n", "server.prot", "[server]"),
        ('[student]\nmodel_path = "student"\nvocab = 3\n', "student.vocab", "[student]"),
        (STUDENT + "[teachers]\nremote = 1\n", "teachers.remote", "[teachers]"),
        (
            STUDENT + CREDENTIAL + "api_key = 'sk-x'\n",
            "teachers.credentials.primary-vllm.api_key",
            "[teachers.credentials.primary-vllm]",
        ),
        (STUDENT + LOCAL + "host = 'x'\n", "teachers.local.big.host", "[teachers.local.big]"),
        (STUDENT + "[jobs]\ngpus = 2\n", "jobs.gpus", "[jobs]"),
    ],
)
def test_unknown_keys_are_refused_naming_key_and_section(
    tmp_path: Path, text: str, path: str, section: str
) -> None:
    error = refusal(tmp_path, text)
    key = path.rsplit(".", 1)[-1]
    assert f"{path}: unknown key {key!r} in {section}" in error.message
    assert str(tmp_path / "kiln.toml") in error.message
    assert error.rule == "config.invalid"
    assert "sk-x" not in error.message


@pytest.mark.parametrize("bad_id", ["bad id", "x" * 65, "", "é", "a.b"])
def test_bad_credential_and_profile_ids_are_refused(tmp_path: Path, bad_id: str) -> None:
    quoted = '"' + bad_id + '"'
    text = STUDENT + CREDENTIAL.replace("primary-vllm", quoted)
    error = refusal(tmp_path, text)
    assert "1..64 characters of A-Z a-z 0-9 _ -" in error.message
    assert "teachers.credentials." in error.message
    error = refusal(tmp_path, STUDENT + LOCAL.replace("big", quoted))
    assert "teachers.local." in error.message


@pytest.mark.parametrize("name", ["sk-live-0123456789", "1KEY", "KEY NAME", "K" * 129, ""])
def test_bad_api_key_env_names_are_refused_without_echo(tmp_path: Path, name: str) -> None:
    text = STUDENT + CREDENTIAL.replace("KILN_TEST_CONFIG_KEY", name)
    error = refusal(tmp_path, text)
    assert "teachers.credentials.primary-vllm.api_key_env: must be the NAME" in error.message
    if name:
        assert name not in error.message


@pytest.mark.parametrize(
    ("origin", "rule"),
    [
        ("https://teacher.example.com:443", "origin.default_port"),
        ("https://teacher.example.com/", "origin.path"),
        ("http://teacher.example.com", "origin.not_https"),
        ("https://Teacher.example.com", "origin.uppercase"),
    ],
)
def test_non_canonical_origins_are_refused_naming_the_key(
    tmp_path: Path, origin: str, rule: str
) -> None:
    text = STUDENT + CREDENTIAL.replace("https://teacher.example.com:8443", origin)
    error = refusal(tmp_path, text)
    assert f"teachers.credentials.primary-vllm.origin: {rule}: " in error.message


def test_every_problem_is_reported_in_one_message(tmp_path: Path) -> None:
    text = "[server]\nport = 0\nlog_format = 'xml'\n[jobs]\nworkers = 17\ndevices = ['gpu0']\n"
    error = refusal(tmp_path, text)
    for fragment in (
        "server.port:",
        "server.log_format:",
        "jobs.workers:",
        "jobs.devices[0]: a device is 'cpu' or 'cuda:<index>'",
        "student: no student model",
    ):
        assert fragment in error.message


@pytest.mark.parametrize(
    "body",
    [
        "[server]\nport = '8420'\n",
        "[server]\nport = 8420.0\n",
        "[server]\nport = true\n",
        "[server]\nprobe_timeout_s = '10'\n",
        "[server]\nprobe_timeout_s = true\n",
        "[server]\nprobe_timeout_s = 0\n",
        "[server]\nhost = 'Bad_Host'\n",
        "[server]\nhost = '[::1]'\n",
        "[jobs]\ncache = 'yes'\n",
        "[jobs]\nconcurrency = 65\n",
        "[jobs]\ndevices = []\n",
        "[jobs]\ndevices = ['cpu', 'cpu']\n",
        "[jobs]\ndevices = ['cuda:01']\n",
    ],
)
def test_wrong_types_and_ranges_are_refused(tmp_path: Path, body: str) -> None:
    refusal(tmp_path, STUDENT + body)


def test_relative_paths_resolve_against_the_file_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    text = STUDENT + '[server]\ndatabase = "state/registry.db"\nteacher_ca_file = "ca.pem"\n'
    text += f'legacy_registry = "{tmp_path / "legacy.json"}"\n'
    text += '[jobs]\ncorpus_root = "../corpora"\n'
    path = write(conf_dir, text)
    monkeypatch.chdir(tmp_path)
    config = load_config(Path("etc") / "kiln.toml")
    assert config.student.model_path == conf_dir / "student"
    assert config.server.database == conf_dir / "state" / "registry.db"
    assert config.server.teacher_ca_file == conf_dir / "ca.pem"
    assert config.server.legacy_registry == tmp_path / "legacy.json"
    assert config.jobs.corpus_root == conf_dir / ".." / "corpora"
    assert load_config(path) == config


@pytest.mark.parametrize("value", ["~/models/student", ""])
def test_home_relative_and_empty_paths_are_refused(tmp_path: Path, value: str) -> None:
    error = refusal(tmp_path, f'[student]\nmodel_path = "{value}"\n')
    assert "student.model_path:" in error.message


def test_relative_paths_need_a_file_when_validating_directly() -> None:
    with pytest.raises(pydantic.ValidationError):
        KilnConfig.model_validate({"student": {"model_path": "relative"}})


@pytest.mark.parametrize("missing", ["dir", "config.json", "tokenizer.json"])
def test_the_student_must_be_a_model_directory(tmp_path: Path, missing: str) -> None:
    path = write(tmp_path, STUDENT)
    if missing == "dir":
        shutil.rmtree(tmp_path / "student")
    else:
        (tmp_path / "student" / missing).unlink()
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.rule == "config.student"
    assert "student.model_path" in caught.value.message


def test_file_kind_size_encoding_and_syntax_are_checked(tmp_path: Path) -> None:
    cases: list[tuple[Path, str]] = [(tmp_path / "missing.toml", "config.open")]
    (tmp_path / "dir.toml").mkdir()
    cases.append((tmp_path / "dir.toml", "config.not_regular"))
    os.mkfifo(tmp_path / "fifo.toml")
    cases.append((tmp_path / "fifo.toml", "config.not_regular"))
    big = tmp_path / "big.toml"
    big.write_text(STUDENT + "#" * MAX_CONFIG_BYTES)
    cases.append((big, "config.size"))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(STUDENT.encode() + b"# caf\xe9\n")
    cases.append((latin, "config.encoding"))
    cases.append((write(tmp_path, "[student\n", "broken.toml"), "config.toml"))
    for path, rule in cases:
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert caught.value.rule == rule, path
        assert str(path) in caught.value.message


def test_a_symlink_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    target = write(tmp_path, STUDENT)
    (tmp_path / "link.toml").symlink_to(target)
    assert load_config(tmp_path / "link.toml").student.model_path == tmp_path / "student"


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        ('["--model=/models/other"]', "policy.owned"),
        ('["--served-model=x"]', None),
        ('["--api-key=sk-in-the-file"]', "config.secret_in_file"),
        ('["--port=9000"]', "config.launcher_transport"),
        ('["--host=0.0.0.0"]', "config.launcher_transport"),
    ],
)
def test_vllm_args_are_checked_by_the_launcher_policy(
    tmp_path: Path, args: str, rule: str | None
) -> None:
    error = refusal(tmp_path, STUDENT + LOCAL + f"vllm_args = {args}\n")
    assert "teachers.local.big.vllm_args: " in error.message
    assert "sk-in-the-file" not in error.one_line()
    if rule is not None:
        assert error.rule == rule
    else:
        assert (error.rule or "").startswith("policy.")


def test_accepted_vllm_args_and_local_defaults(tmp_path: Path) -> None:
    text = STUDENT + LOCAL + 'vllm_args = ["--seed=0", "--enforce-eager"]\n'
    profile = load_config(write(tmp_path, text)).teachers.local["big"]
    assert profile.vllm_args == ("--seed=0", "--enforce-eager")
    assert profile.ready_deadline_s == 300.0
    assert profile.adapter_path is None
    assert profile.model_path == tmp_path / "teacher"


@pytest.mark.parametrize(
    "extra",
    [
        "max_provenance_read_mib_per_second = 16385\n",
        "max_provenance_read_mib_per_second = 0\n",
        "max_prompt_logprob_candidates = 1000001\n",
        "max_prompt_logprob_candidates = 577\n",  # > 64 * (8 + 1)
        "max_top_k = 65537\n",
        "served_model_id = '-bad'\n",
    ],
)
def test_local_profile_bounds(tmp_path: Path, extra: str) -> None:
    text = STUDENT + LOCAL.replace("max_top_k = 8\n", "") + extra
    if "max_top_k" not in extra:
        text += "max_top_k = 8\n"
    assert "teachers.local.big" in refusal(tmp_path, text).message


def test_local_ports_must_not_collide(tmp_path: Path) -> None:
    text = STUDENT + LOCAL.replace("port = 8000", "port = 8420")
    assert "repeats the port of server.port" in refusal(tmp_path, text).message
    second = LOCAL.replace("big", "small")
    error = refusal(tmp_path, STUDENT + LOCAL + second)
    assert "teachers.local.small.port repeats the port of teachers.local.big.port" in (
        error.message
    )


SECRET = "sk-startup-secret-77"


@pytest.mark.parametrize(
    ("environ", "rule"),
    [
        ({}, "secret.missing"),
        ({"KILN_TEST_CONFIG_KEY": ""}, "secret.blank"),
        ({"KILN_TEST_CONFIG_KEY": " \t "}, "secret.blank"),
        ({"KILN_TEST_CONFIG_KEY": SECRET + "\udcff"}, "secret.not_unicode"),
        ({"KILN_TEST_CONFIG_KEY": SECRET + "\n"}, "secret.header_unsafe"),
    ],
)
def test_startup_environment_names_the_variable_never_the_value(
    tmp_path: Path, environ: dict[str, str], rule: str
) -> None:
    config = load_config(write(tmp_path, STUDENT + CREDENTIAL))
    with pytest.raises(ConfigError) as caught:
        check_startup_environment(config, environ)
    assert caught.value.rule == rule
    assert "teachers.credentials.primary-vllm: environment variable KILN_TEST_CONFIG_KEY" in (
        caught.value.message
    )
    assert SECRET not in caught.value.one_line()
    check_startup_environment(config, {"KILN_TEST_CONFIG_KEY": SECRET})


def test_startup_environment_reports_every_bad_credential(tmp_path: Path) -> None:
    second = CREDENTIAL.replace("primary-vllm", "backup").replace(
        "KILN_TEST_CONFIG_KEY", "KILN_TEST_CONFIG_OTHER"
    )
    config = load_config(write(tmp_path, STUDENT + CREDENTIAL + second))
    with pytest.raises(ConfigError) as caught:
        check_startup_environment(config, {"KILN_TEST_CONFIG_OTHER": " "})
    assert "KILN_TEST_CONFIG_KEY" in caught.value.message
    assert "KILN_TEST_CONFIG_OTHER" in caught.value.message
    assert caught.value.rule == "secret.startup"
