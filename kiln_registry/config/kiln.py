"""Kiln's own kiln.toml sections and keys, as ``kiln_registry.config.settings`` reads them.

A Kiln server's file (``crates/kiln-server/src/config.rs``, ``KilnConfig``;
``crates/kiln-server/src/request_log.rs``, ``RequestLogConfig``) is accepted
unchanged by ``kiln serve --config``.  This module owns the key lists and
value types of Kiln's sections, so that a key neither Kiln nor this project
knows is still refused by name.  Kiln's parser denies unknown fields at every
level, so registry-only keys cannot hide in a table Kiln ignores; they are
documented in docs/configuration.md as keys a Kiln server would refuse.

Keys that mean something here are used (``[server] host``, ``port`` and
``request_timeout_secs``, ``[model] path`` and ``adapter_dir``, ``[logging]``
and ``[teachers.credentials]``); the rest are checked for type, the checks
Kiln's ``validate()`` makes, and otherwise ignored.  Kiln reads its
``[model]`` paths as given, relative to the working directory; so does this
module.

Imports: standard library and pydantic only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    model_validator,
)

KILN_FROZEN = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
KILN_DEFAULT_MODEL_ID = "Qwen/Qwen3.5-4B"
KILN_LOG_LEVELS = ("trace", "debug", "info", "warn", "error")
KILN_LOG_FORMATS = ("auto", "json", "pretty", "text", "human")

Count = Annotated[StrictInt, Field(ge=0, le=(1 << 64) - 1)]
Positive = Annotated[StrictInt, Field(ge=1, le=(1 << 64) - 1)]
Number = StrictFloat | StrictInt


def _non_blank(value: str) -> str:
    if not value.strip() or "\x00" in value:
        raise ValueError("must be non-empty when set (Kiln refuses an empty value)")
    return value


def _decode_batch(value: int | str) -> int | str:
    if isinstance(value, str):
        if value.strip().lower() not in ("auto", "backend", "backend_policy"):
            raise ValueError("must be 'auto' or an integer from 1 to 65536")
    elif not 1 <= value <= 65536:
        raise ValueError("must be 'auto' or an integer from 1 to 65536")
    return value


def _log_level(value: str) -> str:
    if value.lower() not in KILN_LOG_LEVELS and "=" not in value:
        raise ValueError(f"must be one of {', '.join(KILN_LOG_LEVELS)} or a filter directive")
    return value


def _webhook(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) > 4096:
        raise ValueError("must be an http:// or https:// URL")
    return value


Text = Annotated[str, AfterValidator(_non_blank)]


class KilnServerKeys(BaseModel):
    """Kiln's ``[server]`` keys beyond ``host`` and ``port`` (which the registry uses)."""

    model_config = KILN_FROZEN

    request_timeout_secs: Positive = 600
    serving_profile: Literal["stable", "experimental", "maintenance"] | None = None
    deterministic: StrictBool | None = None
    http_send_buffer_bytes: Annotated[StrictInt, Field(ge=1024, le=16 * 1024 * 1024)] | None = None
    stream_stall_grace_ms: Annotated[StrictInt, Field(ge=10, le=2000)] | None = None
    max_batch_tokens: Annotated[StrictInt, Field(ge=2, le=65536)] | None = None
    max_prefill_tokens_per_cycle: Annotated[StrictInt, Field(ge=1, le=65536)] | None = None
    max_prefill_layers_per_cycle: Annotated[StrictInt, Field(ge=1, le=1024)] | None = None
    max_decode_batch: Annotated[StrictInt | str, AfterValidator(_decode_batch)] | None = None
    eval_mode: StrictBool | None = None
    default_thinking_enabled: StrictBool | None = None
    default_thinking_budget_tokens: Count | None = None
    default_thinking_budget_ms: Count | None = None
    fold_reasoning_into_content: StrictBool | None = None
    chat_performance_metadata: StrictBool | None = None
    chat_config_hash_metadata: StrictBool | None = None
    slow_request_warn_secs: Count | None = None
    shutdown_timeout_secs: Positive | None = None


class KilnModelConfig(BaseModel):
    """Kiln's ``[model]``: ``path`` is the student when ``[student]`` is absent."""

    model_config = KILN_FROZEN

    path: Text | None = None
    model_id: Text | None = None
    tokenizer_path: Text | None = None
    adapter_dir: Text | None = None
    snapshot_dir: Text | None = None
    served_model_id: Text | None = None

    def kiln_model_dir(self) -> Path | None:
        """``path`` as Kiln reads it (relative to the working directory), if set."""
        return None if self.path is None else Path(self.path).absolute()


class KilnMemoryConfig(BaseModel):
    model_config = KILN_FROZEN

    num_blocks: Positive | None = None
    gpu_memory_gb: Annotated[Number, Field(gt=0)] | None = None
    inference_memory_fraction: Annotated[Number, Field(ge=0, le=1)] | None = None
    training_memory_gb: Annotated[Number, Field(gt=0)] | None = None
    kv_cache_fp8: StrictBool | None = None
    cuda_graphs: StrictBool | None = None


def _tracked_covers_queued(queued: int | None, tracked: int | None, default_queued: int) -> None:
    """Kiln: ``max_tracked_jobs`` must be at least ``max_queued_jobs`` (defaults 32 and 1024)."""
    if (tracked if tracked is not None else 1024) < (queued or default_queued):
        raise ValueError("max_tracked_jobs must be at least max_queued_jobs")


class KilnTrainingConfig(BaseModel):
    model_config = KILN_FROZEN

    grad_checkpoint_segments: Positive | None = None
    no_grad_checkpoint: StrictBool | None = None
    checkpoint_interval: Positive | None = None
    webhook_url: Annotated[str, AfterValidator(_webhook)] | None = None
    max_queued_jobs: Positive | None = None
    max_tracked_jobs: Positive | None = None
    tracked_job_ttl_secs: Positive | None = None

    @model_validator(mode="after")
    def _tracked(self) -> KilnTrainingConfig:
        _tracked_covers_queued(self.max_queued_jobs, self.max_tracked_jobs, 32)
        return self


class KilnLoggingConfig(BaseModel):
    """Kiln's ``[logging]``; mapped onto the registry's log level and format."""

    model_config = KILN_FROZEN

    level: Annotated[str, AfterValidator(_log_level)] | None = None
    format: Literal["auto", "json", "pretty", "text", "human"] | None = None


class KilnPrefixCacheConfig(BaseModel):
    model_config = KILN_FROZEN

    enabled: StrictBool | None = None
    max_blocks: Positive | None = None
    max_entries: Positive | None = None


class KilnSpeculativeConfig(BaseModel):
    model_config = KILN_FROZEN

    enabled: StrictBool | None = None
    method: Literal["off", "skip_layer", "mtp"] | None = None
    num_speculative_tokens: Positive | None = None
    draft_layers: Positive | None = None


def _tile(value: int) -> int:
    if value % 64:
        raise ValueError("must be a positive multiple of 64")
    return value


class KilnStreamingPrefillConfig(BaseModel):
    model_config = KILN_FROZEN

    enabled: StrictBool | None = None
    tile_tokens: Annotated[Positive, AfterValidator(_tile)] | None = None
    last_token_lm_head: StrictBool | None = None


class KilnAdaptersConfig(BaseModel):
    model_config = KILN_FROZEN

    max_disk_bytes: Count | None = None
    composed_cache_max_bytes: Count | None = None
    composed_cache_max_entries: Count | None = None


class KilnEvalConfig(BaseModel):
    model_config = KILN_FROZEN

    eval_dir: Text | None = None
    max_queued_jobs: Positive | None = None
    max_tracked_jobs: Positive | None = None
    webhook_url: Annotated[str, AfterValidator(_webhook)] | None = None

    @model_validator(mode="after")
    def _tracked(self) -> KilnEvalConfig:
        _tracked_covers_queued(self.max_queued_jobs, self.max_tracked_jobs, 32)
        return self


class KilnRequestLogConfig(BaseModel):
    model_config = KILN_FROZEN

    enabled: StrictBool | None = None
    dir: Text | None = None
    max_file_bytes: Count | None = None
    max_total_bytes: Count | None = None
    compress: StrictBool | None = None
    max_capture_bytes: Count | None = None


class KilnAgentConfig(BaseModel):
    model_config = KILN_FROZEN

    self_improve_interval_hours: Count | None = None
    # Kiln keeps this table as free JSON (the request POST /v1/agent/self_improve takes).
    self_improve: dict[str, Any] | None = None
    max_concurrent_runs: Positive | None = None
    run_timeout_secs: Annotated[StrictInt, Field(ge=10)] | None = None


class KilnSections(BaseModel):
    """Kiln's top-level tables that the registry checks but does not otherwise use."""

    model_config = KILN_FROZEN

    model: KilnModelConfig = Field(default_factory=KilnModelConfig)
    memory: KilnMemoryConfig = Field(default_factory=KilnMemoryConfig)
    training: KilnTrainingConfig = Field(default_factory=KilnTrainingConfig)
    logging: KilnLoggingConfig = Field(default_factory=KilnLoggingConfig)
    prefix_cache: KilnPrefixCacheConfig = Field(default_factory=KilnPrefixCacheConfig)
    speculative: KilnSpeculativeConfig = Field(default_factory=KilnSpeculativeConfig)
    streaming_prefill: KilnStreamingPrefillConfig = Field(
        default_factory=KilnStreamingPrefillConfig
    )
    adapters: KilnAdaptersConfig = Field(default_factory=KilnAdaptersConfig)
    eval: KilnEvalConfig | None = None
    request_log: KilnRequestLogConfig = Field(default_factory=KilnRequestLogConfig)
    agent: KilnAgentConfig | None = None


def _registry_level(level: object) -> str | None:
    """Kiln's level onto the registry's: trace/debug -> debug, warn/error -> warning."""
    if not isinstance(level, str):
        return None
    mapped = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning"}
    return mapped.get(level.lower(), "warning" if level.lower() == "error" else None)


def _registry_format(fmt: object) -> str | None:
    if fmt not in KILN_LOG_FORMATS:
        return None
    return "json" if fmt == "json" else "text"


def _kiln_path(value: object) -> str | None:
    """A Kiln ``[model]`` path made absolute as Kiln reads it (working directory)."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return None  # left for the field validators to refuse
    return str(Path(value).absolute())


def _served_model_id(model: dict[str, Any]) -> str | None:
    """Kiln's ``effective_served_model_id``: the override, else ``model_id``'s last segment."""
    served = model.get("served_model_id")
    if served is not None:
        return served if isinstance(served, str) else None
    model_id = model.get("model_id", KILN_DEFAULT_MODEL_ID)
    return model_id.rsplit("/", 1)[-1] if isinstance(model_id, str) else None


def _student_from_model(data: dict[str, Any], model: dict[str, Any]) -> dict[str, Any] | None:
    student = data.get("student")
    if student is not None and not isinstance(student, dict):
        return None
    out = dict(student) if student is not None else {}
    if student is None:
        path = _kiln_path(model.get("path"))
        if path is None:
            return None
        out["model_path"] = path
        served = _served_model_id(model)
        if served is not None:
            out["served_model_id"] = served
    adapters = _kiln_path(model.get("adapter_dir"))
    if adapters is not None and "adapter_dir" not in out:
        out["adapter_dir"] = adapters
    return out


def kiln_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Fill the registry's keys a Kiln file leaves out from Kiln's sections.

    ``[student]`` from ``[model]`` (``path``, ``adapter_dir``, the served model
    id) and ``[server] log_level``/``log_format`` from ``[logging]``; keys the
    file sets itself always win.  Bad values are left for validation to name.
    """
    out = dict(data)
    model = data.get("model")
    if isinstance(model, dict):
        student = _student_from_model(data, model)
        if student is not None:
            out["student"] = student
    logging, server = data.get("logging"), data.get("server", {})
    if isinstance(logging, dict) and isinstance(server, dict):
        extra = {
            key: value
            for key, value in (
                ("log_level", _registry_level(logging.get("level"))),
                ("log_format", _registry_format(logging.get("format"))),
            )
            if value is not None and key not in server
        }
        if extra:
            out["server"] = {**server, **extra}
    return out
