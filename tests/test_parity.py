"""``kiln teachers parity`` against real reference teachers on loopback.

Teachers: two independently loaded reference teachers on the session's tiny
model (identical), one on a copy whose MLP weights carry 1e-5 noise
(within tolerance), one on a tiny model built with another seed (mismatch),
and one behind an API key.  The grading rules are also checked on
hand-built verified rows (pure numpy, no server).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kiln_registry.cli.main import run
from kiln_registry.domain.errors import InputError, KilnError
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.parity.grade import grade
from kiln_registry.parity.run import (
    ParityOptions,
    ParityTarget,
    check_comparable,
    choose_prompt_len,
    choose_top_k,
    parity,
    parity_prompts,
)
from kiln_registry.probe.verify import RowsCheck
from kiln_registry.testing.tiny_models import TinyModel, build_tiny_llama
from tests.helpers import serve_app

SERVED = "teacher-tiny"
KEY_ENV = "KILN_TEST_PARITY_KEY"
KEY = "parity-secret-value-7781"


def _serve_teacher(model: Path, api_key_env: str | None = None) -> Iterator[str]:
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    teacher, _ = load_reference_teacher(
        model, served_model_id=SERVED, max_top_k=8, max_model_len=48
    )
    with serve_app(create_reference_app(teacher, api_key_env=api_key_env)) as url:
        yield url


@pytest.fixture(scope="module")
def url_a(tiny_model: TinyModel) -> Iterator[str]:
    yield from _serve_teacher(tiny_model.path)


@pytest.fixture(scope="module")
def url_b(tiny_model: TinyModel) -> Iterator[str]:
    yield from _serve_teacher(tiny_model.path)


@pytest.fixture(scope="module")
def url_keyed(tiny_model: TinyModel) -> Iterator[str]:
    yield from _serve_teacher(tiny_model.path, api_key_env=KEY_ENV)


@pytest.fixture(scope="module")
def url_noisy(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import torch
    from safetensors.torch import load_file, save_file

    dest = tmp_path_factory.mktemp("noisy") / "model"
    shutil.copytree(tiny_model.path, dest)
    weights = dest / "model.safetensors"
    tensors = load_file(weights)
    generator = torch.Generator().manual_seed(7)
    for name in sorted(tensors):
        if name.endswith("mlp.down_proj.weight"):
            noise = torch.randn(tensors[name].shape, generator=generator)
            tensors[name] = tensors[name] + 1e-5 * noise
    save_file(tensors, weights, metadata={"format": "pt"})
    yield from _serve_teacher(dest)


@pytest.fixture(scope="module")
def url_seed1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = build_tiny_llama(tmp_path_factory.mktemp("seed1") / "model", seed=1)
    yield from _serve_teacher(model.path)


def test_two_teachers_on_the_same_model_are_identical(url_a: str, url_b: str) -> None:
    report = parity(ParityTarget(url_a), ParityTarget(url_b), ParityOptions())
    assert report["schema"] == "kiln.teacher-parity-report.v1"
    assert report["grade"] == "identical" and report["same_identity"] is True
    assert report["k"] == 8 and report["prompt_len"] == 47
    assert report["final_is_longest_accepted"] is True
    assert report["compared_rows"] == report["identical_rows"] == 2 * 46
    assert report["max_abs_diff"] == 0.0 and report["min_topk_overlap"] == 1.0
    assert report["first_difference"] is None and report["first_divergence"] is None
    assert {c: s["rows"] for c, s in report["by_position"].items()} == {
        "first": 2,
        "interior": 88,
        "final": 2,
    }
    assert report["teachers"]["a"]["model_id"] == SERVED  # discovered from /v1/models


def test_small_numeric_noise_is_within_tolerance(url_a: str, url_noisy: str) -> None:
    report = parity(ParityTarget(url_a), ParityTarget(url_noisy), ParityOptions(atol=1e-3))
    assert report["grade"] == "within_tolerance", report
    assert report["same_identity"] is False
    assert 0.0 < report["max_abs_diff"] <= 1e-3
    assert report["first_difference"] is not None and report["first_divergence"] is None
    strict = parity(ParityTarget(url_a), ParityTarget(url_noisy), ParityOptions(atol=0.0))
    assert strict["grade"] == "mismatch"
    assert strict["first_divergence"] == strict["first_difference"]


@pytest.mark.slow
def test_different_seeds_mismatch_at_the_first_position(
    url_a: str, url_seed1: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(["teachers", "parity", "--url", url_a, "--url", url_seed1, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["grade"] == "mismatch"
    div = report["first_divergence"]
    assert (div["prompt"], div["position"], div["class"]) == (0, 1, "first")
    assert div["max_abs_diff"] > 1e-3
    assert div["token_id"] == parity_prompts(1, report["prompt_len"], 512)[0][1]
    assert run(["teachers", "parity", "--url", url_a, "--url", url_seed1]) == 1
    human = capsys.readouterr().out
    assert "grade: mismatch" in human and "first divergence: prompt 0 position 1" in human


@pytest.mark.secret_env(KEY_ENV)
def test_api_key_is_read_from_the_named_variable_and_never_reported(
    url_a: str, url_keyed: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["teachers", "parity", "--url", url_a, "--url", url_keyed, "--json"]
    assert run([*argv, "--api-key-env-b", KEY_ENV]) == 2
    assert f"environment variable {KEY_ENV} is not set" in capsys.readouterr().err
    monkeypatch.setenv(KEY_ENV, KEY)
    assert run([*argv, "--api-key-env-b", KEY_ENV, "--positions", "first,final"]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and json.loads(out)["grade"] == "identical"
    assert set(json.loads(out)["by_position"]) == {"first", "final"}
    assert run(argv) == 2  # no key sent: the teacher answers 401
    err = capsys.readouterr().err
    assert "teacher B:" in err and "parity.unauthorized" in err and KEY not in err
    assert run([*argv, "--model-id", SERVED]) == 2  # straight to the probe: also 401
    err = capsys.readouterr().err
    assert "teacher B:" in err and "probe.unauthorized" in err and KEY not in err


def test_wrong_model_id_names_the_teacher(
    url_a: str, url_b: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["teachers", "parity", "--url", url_a, "--url", url_b, "--model-id-b", "other"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: probe.") and "teacher B:" in err


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        (ParityOptions(positions=("middle",)), "parity.positions"),
        (ParityOptions(prompts=17), "parity.prompts"),
        (ParityOptions(top_k=9), "parity.top_k"),
        (ParityOptions(max_prompt_len=3), "parity.prompt_len"),
    ],
)
def test_bad_options_are_refused(url_a: str, options: ParityOptions, rule: str) -> None:
    with pytest.raises(InputError) as info:
        parity(ParityTarget(url_a), ParityTarget(url_a), options)
    assert info.value.rule == rule


def test_a_non_loopback_http_url_is_refused_before_any_request() -> None:
    with pytest.raises(KilnError, match="url"):
        parity(ParityTarget("http://teacher.example.com"), ParityTarget("http://127.0.0.1:1"),
               ParityOptions())  # fmt: skip


# -- pure rules: identities and hand-built verified rows ----------------------

IDENTITY = TeacherIdentity(
    served_model_id="t",
    base_model_sha256="a" * 64,
    tokenizer_vocab_sha256="b" * 64,
    tokenizer_config_sha256="c" * 64,
    adapter=None,
    vocab_size=512,
    max_top_k=8,
    max_model_len=100,
    max_prompt_logprob_candidates=900,
    implementation="transformers:5.19.0",
    inference_config_sha256="d" * 64,
)


def test_teachers_with_different_vocabularies_are_refused() -> None:
    other_vocab = dataclasses.replace(IDENTITY, tokenizer_vocab_sha256="e" * 64)
    with pytest.raises(InputError, match="tokenizer_vocab_sha256") as info:
        check_comparable(IDENTITY, other_vocab)
    assert info.value.rule == "parity.vocab"
    wider = dataclasses.replace(IDENTITY, vocab_size=544)
    with pytest.raises(InputError) as info:
        check_comparable(IDENTITY, wider)
    assert info.value.rule == "parity.vocab_size"
    check_comparable(IDENTITY, dataclasses.replace(IDENTITY, base_model_sha256="f" * 64))


def test_top_k_and_prompt_length_fit_both_teachers() -> None:
    small = dataclasses.replace(
        IDENTITY, max_top_k=4, max_model_len=50, max_prompt_logprob_candidates=250
    )
    assert choose_top_k(IDENTITY, small, None) == 4
    k = choose_top_k(IDENTITY, IDENTITY, None)
    assert choose_prompt_len(IDENTITY, IDENTITY, k, ParityOptions()) == (99, True)
    tight = dataclasses.replace(IDENTITY, max_prompt_logprob_candidates=90)
    assert choose_prompt_len(IDENTITY, tight, k, ParityOptions()) == (11, True)
    capped = ParityOptions(max_prompt_len=20)
    assert choose_prompt_len(IDENTITY, IDENTITY, k, capped) == (20, False)


def test_prompts_are_deterministic_and_inside_the_vocabulary() -> None:
    prompts = parity_prompts(3, 200, 544)
    assert prompts == parity_prompts(3, 200, 544)
    assert len({p for p in prompts}) == 3
    assert all(0 <= t < 544 * 7 // 8 for p in prompts for t in p)


def _rows(top_ids: list[list[int]], top_lps: list[list[float]], actual: list[float]) -> RowsCheck:
    n = len(top_ids)
    return RowsCheck(
        identity=IDENTITY,
        fingerprint="",
        k=len(top_ids[0]),
        prompt_len=n + 1,
        row_count=n,
        candidate_count=0,
        min_row_width=0,
        max_row_width=0,
        actual_ids=np.arange(n, dtype=np.int32),
        actual_logprobs=np.asarray(actual, dtype=np.float32),
        actual_ranks=np.ones(n, dtype=np.int32),
        topk_ids=np.asarray(top_ids, dtype=np.int32),
        topk_logprobs=np.asarray(top_lps, dtype=np.float32),
    )


def test_a_tie_at_the_kth_place_is_not_a_divergence() -> None:
    a = _rows([[5, 6], [1, 2], [1, 2]], [[-0.5, -1.0], [-0.1, -2.0], [-0.1, -2.0]], [-3, -3, -3])
    b = _rows([[5, 7], [1, 2], [2, 1]], [[-0.5, -1.0], [-0.1, -2.0], [-0.1, -2.0]], [-3, -3, -3])
    graded = grade([(a, b)], ("first", "interior"), atol=1e-3)
    assert graded["grade"] == "within_tolerance"  # 6 vs 7 tied at -1.0: lower bound 0
    assert graded["first_difference"]["position"] == 1
    assert graded["by_position"]["interior"]["identical_rows"] == 1
    assert graded["first_divergence"] is None
    assert graded["min_topk_overlap"] == 0.5 and graded["compared_rows"] == 2
    swapped = grade([(a, b)], ("final",), atol=1e-3)  # ids 1 and 2 swap: |-0.1 - -2.0|
    assert swapped["grade"] == "mismatch" and swapped["compared_rows"] == 1
    assert swapped["first_divergence"]["position"] == 3
    assert swapped["first_divergence"]["max_abs_diff"] == pytest.approx(1.9)
