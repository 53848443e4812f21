"""The extra-vLLM-option policy: the refusal matrix and the accepted forms."""

from __future__ import annotations

import pytest

from kiln_registry.domain.errors import PolicyError
from kiln_registry.launcher.policy import VLLM_OPTION_POLICY_VERSION, classify_vllm_options
from kiln_registry.vllm_options.tables import (
    INFERENCE_SWITCHES,
    INFERENCE_VALUE_OPTIONS,
    KNOWN_OTHER_OPTIONS,
    MAX_VLLM_TOKENS,
    OWNED_OPTIONS,
    PATH_VALUED_OPTIONS,
    TRANSPORT_SWITCHES,
    TRANSPORT_VALUE_OPTIONS,
    is_owned,
    is_path_valued,
    owned_prefix_targets,
)

OWNED = "owned by the launcher"
LAUNCHER_RULES = {"policy.owned", "policy.path_valued"}
SECRET = "s3cr3t-api-key-value"


def refusal(tokens: list[str]) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        classify_vllm_options(tokens)
    return caught.value


def forms_of(name: str) -> list[list[str]]:
    """Every spelling vLLM's argparse would map to ``name``."""
    forms = [
        [f"--{name}=x"],
        [f"--{name}", "x"],
        [f"--{name}"],
        [f"--{name}.key=1"],
        [f'--{name}={{"key":1}}'],
        [f"--no-{name}"],
    ]
    if "-" in name:
        forms.append([f"--{name.replace('-', '_')}=x"])
        forms.append([f"--{name.replace('-', '_')}", "x"])
    if len(name) > 2:
        forms.append([f"--{name[:-1]}=x"])
        forms.append([f"--{name[: max(2, len(name) // 2)]}=x"])
    return forms


OWNED_CASES = [
    pytest.param(name, form, id=f"{name}:{' '.join(form)}")
    for name in sorted(OWNED_OPTIONS)
    for form in forms_of(name)
]
PATH_CASES = [
    pytest.param(name, form, id=f"{name}:{' '.join(form)}")
    for name in sorted(PATH_VALUED_OPTIONS)
    for form in forms_of(name)
]


@pytest.mark.parametrize(("name", "form"), OWNED_CASES)
def test_owned_options_are_refused_in_every_form(name: str, form: list[str]) -> None:
    error = refusal(form)
    assert OWNED in error.message
    assert error.rule in LAUNCHER_RULES


@pytest.mark.parametrize(("name", "form"), PATH_CASES)
def test_path_valued_options_are_refused_in_every_form(name: str, form: list[str]) -> None:
    error = refusal(form)
    assert OWNED in error.message
    assert error.rule in LAUNCHER_RULES


@pytest.mark.parametrize("name", sorted(OWNED_OPTIONS))
def test_exact_owned_name_has_the_owned_rule(name: str) -> None:
    assert refusal([f"--{name}=x"]).rule == "policy.owned"
    assert refusal([f"--{name.replace('-', '_')}=x"]).rule == "policy.owned"


@pytest.mark.parametrize("name", sorted(PATH_VALUED_OPTIONS))
def test_exact_path_valued_name_has_the_path_rule(name: str) -> None:
    assert refusal([f"--{name}=/etc/x"]).rule == "policy.path_valued"


@pytest.mark.parametrize(
    "tokens",
    [
        ["--served-model=x"],
        ["--max-logp=9"],
        ["--fingerprint=x"],
        ["--served_model_name=x"],
        ['--hf-overrides.architectures=["LlamaForCausalLM"]'],
        ["--compilation-config.level=3"],
        ["--config", "/tmp/serve.yaml"],
        ["--config=/tmp/serve.yaml"],
        ["--trust-remote"],
        ["--no-trust-remote-code"],
        ["--enable-lora"],
        ["--max-loras=2"],
        ['--lora-modules={"name":"x","path":"/a"}'],
        ["--qlora-adapter-name-or-path=/a"],
        ["--enable-prompt-adapter"],
        ["--tokenizer-pool-size=2"],
        ["--middleware=evil.module"],
        ["--override-neuron-config={}"],
        ["--download-dir=/tmp"],
        ["--chat-template=/tmp/t.jinja"],
        ["--kv-transfer-config={}"],
        ["--speculative-config={}"],
        ["--worker-extension-cls=a.B"],
        ["--logits-processors=a.B"],
        ["--model=/models/other"],
        ["--version"],
        ["--help"],
    ],
    ids=lambda tokens: " ".join(tokens),
)
def test_named_launcher_refusals(tokens: list[str]) -> None:
    error = refusal(tokens)
    assert OWNED in error.message
    assert error.rule in LAUNCHER_RULES


@pytest.mark.parametrize(
    "token",
    ["-O", "-O3", "-O.level=3", "-O=3", "-tp=2", "-tp", "-pp=2", "-dp=2", "-q=awq", "-asc=2", "-h"],
)
def test_single_dash_tokens_are_refused(token: str) -> None:
    error = refusal([token])
    assert error.rule == "policy.form"
    assert "single-dash" in error.message


@pytest.mark.parametrize("token", ["serve", "/models/x", "x=1", "", SECRET])
def test_positional_tokens_are_refused_without_being_echoed(token: str) -> None:
    error = refusal(["--port=8000", token])
    assert error.rule == "policy.form"
    assert "positional" in error.message
    if token:
        assert token not in str(error)


def test_a_second_delimiter_is_refused() -> None:
    assert refusal(["--port=8000", "--", "--dtype=half"]).rule == "policy.delimiter"


@pytest.mark.parametrize("char", ["\x00", "\r", "\n"])
@pytest.mark.parametrize(
    "template", ["--host=a{c}b", "--dty{c}pe=half", "--enforce-eager{c}", "{c}"]
)
def test_nul_cr_lf_are_refused_anywhere(char: str, template: str) -> None:
    assert refusal([template.format(c=char)]).rule == "policy.control"


TRANSPORT_EXAMPLES = {
    "host": "127.0.0.1",
    "port": "8000",
    "uds": "/run/kiln/teacher.sock",
    "api-key": SECRET,
    "root-path": "/teacher",
    "uvicorn-log-level": "warning",
    "allowed-origins": '["https://kiln.example"]',
    "allowed-methods": '["POST"]',
    "allowed-headers": '["authorization"]',
    "h11-max-incomplete-event-size": "4194304",
    "h11-max-header-count": "256",
    "ssl-keyfile": "/etc/kiln/key.pem",
    "ssl-certfile": "/etc/kiln/cert.pem",
    "ssl-ca-certs": "/etc/kiln/ca.pem",
    "ssl-cert-reqs": "2",
    "ssl-ciphers": "ECDHE-RSA-AES256-GCM-SHA384",
}
INFERENCE_EXAMPLES = {
    "attention-backend": "TRITON_ATTN",
    "block-size": "16",
    "cpu-offload-gb": "0",
    "data-parallel-size": "1",
    "pipeline-parallel-size": "2",
    "tensor-parallel-size": "8",
    "device": "cuda",
    "dtype": "bfloat16",
    "gpu-memory-utilization": "0.75",
    "kv-cache-dtype": "fp8_e4m3",
    "max-num-batched-tokens": "32768",
    "max-num-seqs": "64",
    "quantization": "awq",
    "rope-scaling": '{"factor":4,"rope_type":"yarn"}',
    "rope-theta": "1000000",
    "scheduling-policy": "fcfs",
    "seed": "0",
    "swap-space": "4.5",
}


def test_every_allowlisted_value_option_has_an_example() -> None:
    assert set(TRANSPORT_EXAMPLES) == set(TRANSPORT_VALUE_OPTIONS)
    assert set(INFERENCE_EXAMPLES) == set(INFERENCE_VALUE_OPTIONS)


@pytest.mark.parametrize(("name", "value"), sorted(TRANSPORT_EXAMPLES.items()))
def test_transport_options_are_accepted_and_kept_out_of_inference(name: str, value: str) -> None:
    options = classify_vllm_options([f"--{name}={value}"])
    assert options.transport == (f"--{name}={value}",)
    assert options.inference == ()


@pytest.mark.parametrize(("name", "value"), sorted(INFERENCE_EXAMPLES.items()))
def test_inference_options_are_accepted_exactly_as_given(name: str, value: str) -> None:
    options = classify_vllm_options([f"--{name}={value}"])
    assert options.inference == (f"--{name}={value}",)
    assert options.transport == ()


@pytest.mark.parametrize("name", sorted(TRANSPORT_SWITCHES))
def test_transport_switches(name: str) -> None:
    assert classify_vllm_options([f"--{name}"]).transport == (f"--{name}",)
    assert refusal([f"--{name}=true"]).rule == "policy.form"


@pytest.mark.parametrize("name", sorted(INFERENCE_SWITCHES))
def test_inference_switches(name: str) -> None:
    assert classify_vllm_options([f"--{name}"]).inference == (f"--{name}",)
    assert refusal([f"--{name}=1"]).rule == "policy.form"


@pytest.mark.parametrize("name", sorted({*TRANSPORT_EXAMPLES, *INFERENCE_EXAMPLES} - {"api-key"}))
def test_two_token_and_underscore_forms_of_accepted_options_are_refused(name: str) -> None:
    assert refusal([f"--{name}", "1"]).rule == "policy.form"
    if "-" in name:
        assert refusal([f"--{name.replace('-', '_')}=1"]).rule == "policy.form"
    assert refusal([f"--{name}.key=1"]).rule == "policy.form"


@pytest.mark.parametrize(
    "token",
    [
        "--dtyp=half",
        "--enforce",
        "--enable-prefix=1",
        "--gpu-memory=0.5",
        "--tensor-parallel=2",
        "--hos=127.0.0.1",
        "--api-ke=x",
        "--no-enable-prefix",
        "--response-rol=x",
    ],
)
def test_abbreviations_are_refused(token: str) -> None:
    assert refusal([token]).rule == "policy.abbreviation"


@pytest.mark.parametrize(
    "token",
    [
        "--response-role=assistant",
        "--cuda-graph-sizes=8",
        "--cudagraph-capture-sizes=8",
        "--max-seq-len-to-capture=8192",
        "--enable-log-requests",
        "--disable-log-requests",
        "--headless",
        "--api-server-count=2",
        "--enable-sleep-mode",
        "--no-enforce-eager",
        "--kv-cache-memory-bytes=1000",
        "--totally-new-option=1",
    ],
)
def test_unreviewed_options_fail_closed(token: str) -> None:
    error = refusal([token])
    assert error.rule == "policy.not_reviewed"
    assert "not identity-reviewed" in error.message
    assert VLLM_OPTION_POLICY_VERSION in error.message


@pytest.mark.parametrize("token", ["--Dtype=half", "--DTYPE=half", "--dtype!=half"])
def test_names_must_be_lowercase_dashed(token: str) -> None:
    assert refusal([token]).rule == "policy.form"


@pytest.mark.parametrize(
    "token",
    [
        "--attention-backend=FLASH_ATTN",
        "--attention-backend=triton_attn",
        "--attention-backend=TORCH_SDPA",
        "--attention-backend=vllm.attention.backends.custom.Backend",
        "--attention-backend=TRITON_ATTN ",
        "--dtype=fp16",
        "--dtype=",
        "--device=neuron",
        "--kv-cache-dtype=int8",
        "--quantization=gguf",
        "--quantization=my_plugin",
        "--scheduling-policy=lifo",
        "--seed=-1",
        "--seed=+1",
        "--seed=01",
        "--seed=1_0",
        "--seed=4294967296",
        "--seed=true",
        "--seed= 1",
        "--block-size=0",
        "--tensor-parallel-size=0",
        "--max-num-seqs=1e3",
        "--max-num-batched-tokens=32k",
        "--gpu-memory-utilization=0",
        "--gpu-memory-utilization=0.90",
        "--gpu-memory-utilization=1.5",
        "--gpu-memory-utilization=.5",
        "--gpu-memory-utilization=nan",
        "--gpu-memory-utilization=1e-1",
        "--swap-space=-1",
        "--rope-theta=inf",
        '--rope-scaling={"rope_type":"yarn","factor":4}',
        '--rope-scaling={"factor": 4}',
        '--rope-scaling={"factor":{"x":1}}',
        "--rope-scaling={}",
        "--rope-scaling=[1]",
        '--rope-scaling={"factor":4,"factor":5}',
        '--rope-scaling={"factor":NaN}',
        "--port=0",
        "--port=65536",
        "--port=08000",
        "--host=a b",
        "--uds=relative.sock",
        "--uvicorn-log-level=loud",
        "--allowed-origins=*",
        "--allowed-origins=[1]",
        "--ssl-cert-reqs=3",
        "--ssl-keyfile=key.pem",
        "--api-key=",
        "--dtype=" + "x" * 300,
    ],
)
def test_values_are_strictly_validated(token: str) -> None:
    assert refusal([token]).rule == "policy.value"


@pytest.mark.parametrize(
    "tokens",
    [
        ["--seed=1", "--seed=2"],
        ["--dtype=half", "--dtype=half"],
        ["--port=1", "--port=2"],
        ["--enforce-eager", "--enforce-eager"],
        ["--enable-prefix-caching", "--no-enable-prefix-caching"],
        ["--no-enable-prefix-caching", "--enable-prefix-caching"],
        ["--enable-chunked-prefill", "--no-enable-chunked-prefill"],
        ["--no-enable-chunked-prefill", "--no-enable-chunked-prefill"],
        [f"--api-key={SECRET}", "--api-key=other"],
    ],
)
def test_duplicates_and_negation_pairs_are_refused(tokens: list[str]) -> None:
    error = refusal(tokens)
    assert error.rule == "policy.duplicate"
    assert SECRET not in str(error)


def test_summary_fields_and_redaction() -> None:
    options = classify_vllm_options(
        [
            "--host=127.0.0.1",
            "--port=8000",
            f"--api-key={SECRET}",
            "--dtype=float32",
            "--seed=7",
            "--enforce-eager",
            "--no-enable-prefix-caching",
        ]
    )
    assert options.host == "127.0.0.1"
    assert options.port == 8000
    assert options.seed == 7
    assert options.enforce_eager is True
    assert options.api_key_present is True
    assert options.inference == (
        "--dtype=float32",
        "--seed=7",
        "--enforce-eager",
        "--no-enable-prefix-caching",
    )
    assert f"--api-key={SECRET}" in options.transport
    assert options.redacted() == (
        "--host=127.0.0.1",
        "--port=8000",
        "--api-key=<redacted>",
        "--dtype=float32",
        "--seed=7",
        "--enforce-eager",
        "--no-enable-prefix-caching",
    )
    assert SECRET not in repr(options)
    assert SECRET not in " ".join(options.redacted())


def test_empty_options() -> None:
    options = classify_vllm_options([])
    assert options.transport == options.inference == ()
    assert (options.host, options.port, options.seed) == (None, None, None)
    assert options.api_key_present is False
    assert options.enforce_eager is False


@pytest.mark.parametrize(
    "tokens",
    [
        ["--api_key=" + SECRET],
        ["--api-key", SECRET],
        ["--api-key=" + SECRET + "\n"],
        ["--api-key=" + SECRET, "--model=/x"],
        ["--api-key=" + SECRET, SECRET],
        ["--api-key.x=" + SECRET],
        ["--apikey=" + SECRET],
    ],
)
def test_the_api_key_never_appears_in_a_refusal(tokens: list[str]) -> None:
    error = refusal(tokens)
    assert SECRET not in str(error)
    assert SECRET not in error.one_line()
    assert SECRET not in repr(error)


def test_token_count_is_bounded() -> None:
    tokens = ["--enforce-eager"] * (MAX_VLLM_TOKENS + 1)
    assert refusal(tokens).rule == "policy.too_many"


def test_allowlists_do_not_overlap_launcher_owned_names() -> None:
    accepted = {
        *TRANSPORT_VALUE_OPTIONS,
        *TRANSPORT_SWITCHES,
        *INFERENCE_VALUE_OPTIONS,
        *INFERENCE_SWITCHES,
    }
    for name in accepted:
        assert not is_owned(name), name
        assert not any(target.startswith(name) for target in owned_prefix_targets()), name
    assert accepted.isdisjoint(KNOWN_OTHER_OPTIONS)
    # ssl-*, uds and root-path carry paths but are transport; nothing else does.
    assert {name for name in accepted if is_path_valued(name)} == {"root-path"}
