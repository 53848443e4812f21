"""The reviewed vLLM option tables and their value rules (pure data).

Owns the names behind ``kiln.vllm-option-policy.v2``: what the launcher owns,
what names a path-like input, which transport and inference options are
accepted, and how each accepted value is validated.  Option names are the
real ``vllm serve`` names (vLLM's engine and OpenAI-frontend arguments).  A
value rule returns ``None`` when the value is acceptable, or a short
description of what is wrong that never repeats the value.

Imports: standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from decimal import Decimal

ValueRule = Callable[[str], str | None]

MAX_VLLM_TOKENS = 256
MAX_OPTION_NAME_CHARS = 128
MAX_VALUE_BYTES = 256
# Transport values may be file paths or keys, which are longer than scalars.
MAX_TRANSPORT_VALUE_BYTES = 4096
MAX_JSON_LIST_ITEMS = 64

_INT_RE = re.compile(r"0|[1-9][0-9]{0,18}")
_DECIMAL_RE = re.compile(r"(0|[1-9][0-9]{0,11})(\.[0-9]{0,11}[1-9])?")


def canonical_int(low: int, high: int) -> ValueRule:
    """Digits only, no sign or leading zero, within ``low..=high``."""

    def rule(text: str) -> str | None:
        if not _INT_RE.fullmatch(text):
            return "expected a canonical decimal integer (no sign, no leading zeros)"
        if not low <= int(text) <= high:
            return f"expected an integer in {low}..={high}"
        return None

    return rule


def canonical_decimal(low: Decimal, high: Decimal, *, low_inclusive: bool) -> ValueRule:
    """A plain decimal without sign, exponent or trailing fractional zeros."""

    def rule(text: str) -> str | None:
        if not _DECIMAL_RE.fullmatch(text):
            return "expected a canonical decimal such as 0.9 (no sign, exponent or trailing 0)"
        number = Decimal(text)
        above = number >= low if low_inclusive else number > low
        if not (above and number <= high):
            opener = "[" if low_inclusive else "("
            return f"expected a number in {opener}{low}, {high}]"
        return None

    return rule


def one_of(*choices: str) -> ValueRule:
    allowed = frozenset(choices)

    def rule(text: str) -> str | None:
        if text not in allowed:
            return "expected one of " + ", ".join(sorted(allowed))
        return None

    return rule


def matching(pattern: str, what: str) -> ValueRule:
    compiled = re.compile(pattern)

    def rule(text: str) -> str | None:
        return None if compiled.fullmatch(text) else f"expected {what}"

    return rule


def any_text(text: str) -> str | None:
    return None


def json_string_list(text: str) -> str | None:
    """vLLM parses the CORS lists with ``json.loads``: a JSON array of strings."""
    try:
        value = json.loads(text)
    except ValueError:
        return "expected a JSON array of strings"
    if not isinstance(value, list) or len(value) > MAX_JSON_LIST_ITEMS:
        return f"expected a JSON array of at most {MAX_JSON_LIST_ITEMS} strings"
    if not all(isinstance(item, str) for item in value):
        return "expected a JSON array of strings"
    return None


def canonical_flat_json_object(text: str) -> str | None:
    """A flat JSON object of scalars, written compactly with sorted keys.

    Requiring the canonical spelling keeps one setting to one identity.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError:
        return "expected a JSON object"
    if not isinstance(value, dict) or not value:
        return "expected a non-empty JSON object"
    if any(isinstance(item, dict | list) for item in value.values()):
        return "nested JSON values are not reviewed"
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if canonical != text:
        return "expected compact JSON with sorted keys and no duplicate keys"
    return None


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


_ABSOLUTE_PATH = matching(r"/[^\s]*", "an absolute path without white space")

# Transport options: they decide how clients reach the server, never the logits,
# so they are excluded from the identity.  The ssl-* options carry file paths,
# which the path rule would otherwise refuse: they are accepted because TLS
# material authenticates the listener and cannot change a single logit.  uds
# (the listening socket) and root-path (a URL prefix) are addresses, not inputs.
TRANSPORT_VALUE_OPTIONS: Mapping[str, ValueRule] = {
    "host": matching(r"[A-Za-z0-9._:-]{1,253}", "a host name or IP address"),
    "port": canonical_int(1, 65535),
    "uds": _ABSOLUTE_PATH,
    "api-key": any_text,
    "root-path": matching(r"/[^\s]*", "a path starting with '/'"),
    "uvicorn-log-level": one_of("critical", "error", "warning", "info", "debug", "trace"),
    "allowed-origins": json_string_list,
    "allowed-methods": json_string_list,
    "allowed-headers": json_string_list,
    "h11-max-incomplete-event-size": canonical_int(1, 1 << 30),
    "h11-max-header-count": canonical_int(1, 65536),
    "ssl-keyfile": _ABSOLUTE_PATH,
    "ssl-certfile": _ABSOLUTE_PATH,
    "ssl-ca-certs": _ABSOLUTE_PATH,
    "ssl-cert-reqs": one_of("0", "1", "2"),
    "ssl-ciphers": matching(r"[A-Za-z0-9:+!@_.-]{1,255}", "an OpenSSL cipher list"),
}
TRANSPORT_SWITCHES: frozenset[str] = frozenset(
    {
        "disable-uvicorn-access-log",
        "enable-request-id-headers",
        "disable-fastapi-docs",
        "allow-credentials",
        "enable-offline-docs",
    }
)

_SIZE = canonical_int(1, 16_777_216)
_PARALLEL = canonical_int(1, 1024)
_GIB = canonical_decimal(Decimal(0), Decimal(1_048_576), low_inclusive=True)

# Inference options: reviewed scalars whose exact token enters the identity.
# --attention-backend is closed because vLLM may import its value as a class.
INFERENCE_VALUE_OPTIONS: Mapping[str, ValueRule] = {
    "attention-backend": one_of("TRITON_ATTN"),
    "block-size": canonical_int(1, 4096),
    "cpu-offload-gb": _GIB,
    "data-parallel-size": _PARALLEL,
    "pipeline-parallel-size": _PARALLEL,
    "tensor-parallel-size": _PARALLEL,
    "device": one_of("auto", "cuda", "cpu", "xpu", "tpu"),
    "dtype": one_of("auto", "half", "float16", "bfloat16", "float", "float32"),
    "gpu-memory-utilization": canonical_decimal(Decimal(0), Decimal(1), low_inclusive=False),
    "kv-cache-dtype": one_of("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"),
    "max-num-batched-tokens": _SIZE,
    "max-num-seqs": _SIZE,
    "quantization": one_of(
        "awq",
        "awq_marlin",
        "bitsandbytes",
        "compressed-tensors",
        "experts_int8",
        "fbgemm_fp8",
        "fp8",
        "gptq",
        "gptq_marlin",
        "modelopt",
        "mxfp4",
    ),
    "rope-scaling": canonical_flat_json_object,
    "rope-theta": canonical_decimal(Decimal(0), Decimal(10) ** 12, low_inclusive=False),
    "scheduling-policy": one_of("fcfs", "priority"),
    "seed": canonical_int(0, 2**32 - 1),
    "swap-space": _GIB,
}
# Switch pairs vLLM registers as --name / --no-name count as one option.
NEGATABLE_SWITCHES: frozenset[str] = frozenset(
    {
        "enable-prefix-caching",
        "no-enable-prefix-caching",
        "enable-chunked-prefill",
        "no-enable-chunked-prefill",
    }
)
# --disable-log-stats cannot change a logit, but Kiln's launcher hashes it (it is
# not in Kiln's transport set), so it is bound here too: the same launch, the same C.
INFERENCE_SWITCHES: frozenset[str] = NEGATABLE_SWITCHES | {
    "enforce-eager",
    "language-model-only",
    "disable-log-stats",
}

# Options the launcher sets itself, or that would swap the model, tokenizer,
# weights, logprob surface, fingerprint, server code or adapter surface.
OWNED_OPTIONS: frozenset[str] = frozenset(
    {
        "model",
        "model-tag",
        "served-model-name",
        "max-model-len",
        "max-logprobs",
        "logprobs-mode",
        "fingerprint-mode",
        "fingerprint-value",
        "middleware",
        "tokenizer",
        "tokenizer-mode",
        "tokenizer-revision",
        "revision",
        "code-revision",
        "generation-config",
        "override-generation-config",
        "load-format",
        "safetensors-load-strategy",
        "ignore-patterns",
        "config-format",
        "trust-remote-code",
        "skip-tokenizer-init",
        "hf-token",
        "runner",
        "convert",
        "task",
        "grpc",
        "tokens-only",
        "help",
        "version",
        "enable-lora",
        "max-loras",
        "max-cpu-loras",
        "max-lora-rank",
        "lora-modules",
        "lora-dtype",
        "fully-sharded-loras",
        "enable-prompt-adapter",
        "max-prompt-adapters",
    }
)
_OWNED_SWITCHES = (
    "trust-remote-code",
    "skip-tokenizer-init",
    "enable-lora",
    "fully-sharded-loras",
    "enable-prompt-adapter",
    "grpc",
    "tokens-only",
)
_OWNED_FRAGMENTS = ("lora", "adapter", "revision", "logprob")
_OWNED_PREFIXES = ("tokenizer", "fingerprint", "served-model")

PATH_VALUED_OPTIONS: frozenset[str] = frozenset(
    {
        "config",
        "download-dir",
        "chat-template",
        "hf-config-path",
        "hf-overrides",
        "compilation-config",
        "kv-transfer-config",
        "kv-events-config",
        "ec-transfer-config",
        "speculative-config",
        "structured-outputs-config",
        "attention-config",
        "profiler-config",
        "eplb-config",
        "pooler-config",
        "additional-config",
        "model-loader-extra-config",
        "allowed-local-media-path",
        "log-config-file",
        "tool-parser-plugin",
        "reasoning-parser-plugin",
        "io-processor-plugin",
        "worker-cls",
        "worker-extension-cls",
        "scheduler-cls",
        "distributed-executor-backend",
        "logits-processors",
        "logits-processor-pattern",
        "pt-load-map-location",
        "quantization-param-path",
        "mm-processor-kwargs",
        "media-io-kwargs",
        "default-chat-template-kwargs",
    }
)
_PATH_PARTS = frozenset(
    {
        "config",
        "path",
        "file",
        "dir",
        "template",
        "plugin",
        "plugins",
        "cls",
        "class",
        "module",
        "modules",
        "kwargs",
        "overrides",
        "processors",
        "pattern",
    }
)

# Other real vLLM option names, known only so that an abbreviation of one is
# reported as an abbreviation; none of them is accepted.
KNOWN_OTHER_OPTIONS: frozenset[str] = frozenset(
    {
        "headless",
        "api-server-count",
        "data-parallel-rank",
        "data-parallel-start-rank",
        "data-parallel-size-local",
        "data-parallel-address",
        "data-parallel-rpc-port",
        "data-parallel-backend",
        "decode-context-parallel-size",
        "enable-expert-parallel",
        "max-parallel-loading-workers",
        "prefix-caching-hash-algo",
        "disable-sliding-window",
        "disable-cascade-attn",
        "kv-cache-memory-bytes",
        "max-num-partial-prefills",
        "max-long-partial-prefills",
        "long-prefill-token-threshold",
        "max-cudagraph-capture-size",
        "cuda-graph-sizes",
        "cudagraph-capture-sizes",
        "max-seq-len-to-capture",
        "enable-log-requests",
        "disable-log-requests",
        "response-role",
        "enable-auto-tool-choice",
        "tool-call-parser",
        "reasoning-parser",
        "enable-sleep-mode",
        "model-impl",
        "async-scheduling",
        "num-gpu-blocks-override",
        "limit-mm-per-prompt",
        "enable-prompt-embeds",
        "return-tokens-as-token-ids",
        "max-log-len",
        "enable-ssl-refresh",
        "disable-access-log-for-endpoints",
        "enable-server-load-tracking",
        "otlp-traces-endpoint",
        "enable-scale-out",
    }
)


def is_owned(name: str) -> bool:
    """True for a launcher-owned option, its --no- negation, or an owned family."""
    bare = name.removeprefix("no-")
    return (
        bare in OWNED_OPTIONS
        or any(fragment in bare for fragment in _OWNED_FRAGMENTS)
        or bare.startswith(_OWNED_PREFIXES)
    )


def owned_prefix_targets() -> tuple[str, ...]:
    """Every owned spelling an abbreviation could expand to."""
    return (*sorted(OWNED_OPTIONS), *(f"no-{name}" for name in _OWNED_SWITCHES))


def is_path_valued(name: str) -> bool:
    """True for options whose value names a file, directory, config or code."""
    bare = name.removeprefix("no-")
    return (
        bare in PATH_VALUED_OPTIONS
        or bare.startswith("override-")
        or not _PATH_PARTS.isdisjoint(bare.split("-"))
    )
