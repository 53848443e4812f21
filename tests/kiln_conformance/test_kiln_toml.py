"""Kiln's own kiln.toml files load unchanged; keys neither side knows are refused.

Every TOML text below is a Kiln test value from ``ericflo/kiln``
``crates/kiln-server/src/config.rs`` (the newest stored version, the one with
``[teachers.credentials]``): ``test_parse_full_toml``,
``test_partial_toml_uses_defaults``, ``test_load_explicit_path``,
``teacher_credentials_parse_and_resolve_only_for_the_exact_origin``,
``unknown_toml_fields_are_rejected_at_every_config_level`` and
``semantically_invalid_toml_fields_name_the_field_and_value``.  Kiln's model
paths (``/models/qwen``) are replaced by a real tiny model directory, since
the registry loads the student.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln_registry.config.loader import load_config
from kiln_registry.domain.errors import ConfigError

# config.rs test_parse_full_toml, verbatim except [model] paths (a real directory here).
KILN_FULL_TOML = """
[server]
deterministic = true
host = "127.0.0.1"
port = 9000
request_timeout_secs = 60
http_send_buffer_bytes = 8192
stream_stall_grace_ms = 1500
max_batch_tokens = 1024
max_prefill_tokens_per_cycle = 192
max_prefill_layers_per_cycle = 6
max_decode_batch = 24
eval_mode = true
default_thinking_enabled = false
default_thinking_budget_tokens = 256
default_thinking_budget_ms = 1500
fold_reasoning_into_content = true
chat_performance_metadata = true
chat_config_hash_metadata = true
slow_request_warn_secs = 15
shutdown_timeout_secs = 10

[model]
path = "{model}"
model_id = "custom/model"
tokenizer_path = "{model}/tokenizer.json"
adapter_dir = "{model}/adapters"

[memory]
num_blocks = 128
gpu_memory_gb = 24.0
inference_memory_fraction = 0.5
training_memory_gb = 6.0
kv_cache_fp8 = true
cuda_graphs = false

[training]
grad_checkpoint_segments = 8
no_grad_checkpoint = false
checkpoint_interval = 50
webhook_url = "https://example.com/hook"
max_queued_jobs = 4
max_tracked_jobs = 16
tracked_job_ttl_secs = 120

[logging]
level = "debug"
format = "pretty"

[prefix_cache]
enabled = false
max_blocks = 32
max_entries = 8

[speculative]
enabled = true
num_speculative_tokens = 6
draft_layers = 10

[streaming_prefill]
enabled = true
tile_tokens = 4096
last_token_lm_head = false

[adapters]
max_disk_bytes = 5368709120
composed_cache_max_bytes = 1073741824
composed_cache_max_entries = 8
"""

# config.rs teacher_credentials_parse_and_resolve_only_for_the_exact_origin.
KILN_CREDENTIAL_TOML = """
[teachers.credentials.primary-vllm]
origin = "https://vllm.example.com:8443"
api_key_env = "KILN_TEST_SCOPED_TEACHER_SECRET"
"""


def make_model(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"vocab_size": 8}')
    (path / "tokenizer.json").write_text("{}")
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kiln.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_kilns_full_file_loads_and_its_keys_are_used(tmp_path: Path) -> None:
    model = make_model(tmp_path / "qwen")
    config = load_config(write(tmp_path, KILN_FULL_TOML.format(model=model)))
    assert (config.server.host, config.server.port) == ("127.0.0.1", 9000)
    assert config.server.request_timeout_secs == 60
    assert config.student.model_path == model
    assert config.student_adapter_dir() == model / "adapters"
    # Kiln's effective_served_model_id: the last '/' segment of model_id.
    assert config.student.served_model_id == "model"
    # [logging] level "debug" and format "pretty" map onto the registry's settings.
    assert (config.server.log_level, config.server.log_format) == ("debug", "text")


def test_kilns_partial_files_use_kilns_defaults(tmp_path: Path) -> None:
    # config.rs test_partial_toml_uses_defaults and test_load_explicit_path, plus
    # the [model] path the registry needs for its student.
    model = make_model(tmp_path / "m")
    for text in ("[server]\nport = 3000\n", '[server]\nport = 5555\n\n[logging]\nlevel = "warn"\n'):
        config = load_config(write(tmp_path, f'{text}\n[model]\npath = "{model}"\n'))
        assert config.server.host == "127.0.0.1"
        assert config.server.request_timeout_secs == 600
        assert config.student_adapter_dir() == model / "adapters"
        # No model_id: Kiln's default Qwen/Qwen3.5-4B gives the served id.
        assert config.student.served_model_id == "Qwen3.5-4B"
    assert config.server.port == 5555
    assert config.server.log_level == "warning"


def test_kiln_model_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_model(tmp_path / "work" / "models" / "qwen")
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "kiln.toml"
    path.write_text('[model]\npath = "models/qwen"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path / "work")
    config = load_config(path)
    assert config.student.model_path == tmp_path / "work" / "models" / "qwen"


def test_kilns_credential_table_loads(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    text = f'[model]\npath = "{model}"\n{KILN_CREDENTIAL_TOML}'
    config = load_config(write(tmp_path, text))
    credential = config.teachers.credentials["primary-vllm"]
    assert credential.origin == "https://vllm.example.com:8443"
    assert credential.api_key_env == "KILN_TEST_SCOPED_TEACHER_SECRET"


@pytest.mark.parametrize(
    "origin", ["http://127.0.0.1:8000", "http://localhost:8000", "http://127.0.0.2"]
)
def test_loopback_http_origins_are_accepted_as_kiln_does(tmp_path: Path, origin: str) -> None:
    # config.rs TeacherCredentialConfig: "HTTPS is required unless the host is loopback";
    # remote_teacher.rs normalize_vllm_completions_url: localhost or a loopback IP address.
    model = make_model(tmp_path / "m")
    text = f'[model]\npath = "{model}"\n[teachers.credentials.local]\norigin = "{origin}"\n'
    config = load_config(write(tmp_path, text + 'api_key_env = "LOCAL_KEY"\n'))
    assert config.teachers.credentials["local"].origin == origin


@pytest.mark.parametrize(
    "origin",
    [
        "http://vllm.example.com",  # plain http off loopback (remote_teacher.rs)
        "https://vllm.example.com/",  # config.rs test: "must be the exact canonical origin"
        "http://[::1]:8000",  # Kiln tests the bracketed host text: not loopback
    ],
)
def test_origins_kiln_refuses_are_refused(tmp_path: Path, origin: str) -> None:
    model = make_model(tmp_path / "m")
    text = f'[model]\npath = "{model}"\n[teachers.credentials.c]\norigin = "{origin}"\n'
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text + 'api_key_env = "KEY"\n'))
    assert "teachers.credentials.c.origin" in caught.value.message


@pytest.mark.parametrize(
    ("key", "table"),
    # config.rs unknown_toml_fields_are_rejected_at_every_config_level.
    [
        ("root_typo", None),
        ("port_typo", "server"),
        ("path_typo", "model"),
        ("bytes_typo", "request_log"),
        ("jobs_typo", "eval"),
    ],
)
def test_keys_neither_side_knows_are_refused_by_name(
    tmp_path: Path, key: str, table: str | None
) -> None:
    model = make_model(tmp_path / "m")
    head = f"{key} = 17\n" if table is None else ""
    body = "" if table is None else f"[{table}]\n{key} = 17\n"
    text = f'{head}[student]\nmodel_path = "{model}"\n{body}'
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert f"unknown key '{key}'" in caught.value.message
    assert "neither Kiln nor kiln-registry" in caught.value.message


@pytest.mark.parametrize(
    ("field", "text"),
    # config.rs semantically_invalid_toml_fields_name_the_field_and_value.
    [
        ("server.port", "[server]\nport = 0"),
        ("model.model_id", "[model]\nmodel_id = ''"),
        ("memory.num_blocks", "[memory]\nnum_blocks = 0"),
        ("training.max_queued_jobs", "[training]\nmax_queued_jobs = 0"),
        ("logging.format", "[logging]\nformat = 'bogus'"),
        ("logging.level", "[logging]\nlevel = 'banana'"),
        ("training.webhook_url", "[training]\nwebhook_url = 'smtp://bad'"),
        ("prefix_cache.max_blocks", "[prefix_cache]\nmax_blocks = 0"),
        ("speculative.num_speculative_tokens", "[speculative]\nnum_speculative_tokens = 0"),
        ("streaming_prefill.tile_tokens", "[streaming_prefill]\ntile_tokens = 63"),
        ("eval.max_queued_jobs", "[eval]\nmax_queued_jobs = 0"),
        ("eval.webhook_url", "[eval]\nwebhook_url = 'not a URL'"),
        ("agent.max_concurrent_runs", "[agent]\nmax_concurrent_runs = 0"),
        ("server.request_timeout_secs", "[server]\nrequest_timeout_secs = 0"),
        # config.rs validate(): max_tracked_jobs must be at least max_queued_jobs.
        ("training", "[training]\nmax_queued_jobs = 8\nmax_tracked_jobs = 4"),
        ("eval", "[eval]\nmax_queued_jobs = 2000"),
    ],
)
def test_values_kiln_refuses_are_refused(tmp_path: Path, field: str, text: str) -> None:
    model = make_model(tmp_path / "m")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, f'[student]\nmodel_path = "{model}"\n{text}\n'))
    assert field in caught.value.message


def test_student_and_kiln_model_must_agree(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "a"), make_model(tmp_path / "b")
    same = f'[student]\nmodel_path = "{a}"\n[model]\npath = "{a}"\n'
    assert load_config(write(tmp_path, same)).student.model_path == a
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, f'[student]\nmodel_path = "{a}"\n[model]\npath = "{b}"\n'))
    assert "name different models" in caught.value.message


def test_a_file_without_any_student_names_both_ways(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, "[server]\nport = 3000\n"))
    assert "set [student] model_path or Kiln's [model] path" in caught.value.message


def test_the_shared_example_needs_no_registry_only_key(tmp_path: Path) -> None:
    """The registry's own defaults apply to a file holding only Kiln's keys."""
    model = make_model(tmp_path / "m")
    config = load_config(write(tmp_path, f'[model]\npath = "{model}"\n'))
    assert config.server.legacy_registry is None
    assert config.jobs.workers == 1
    assert os.fspath(config.server.database).endswith("registry.db")
