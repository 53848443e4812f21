"""Aliases as Kiln accepts them, on every route, over a real server.

Kiln (ericflo/kiln, ``crates/kiln-server/src/api/teachers.rs``,
``validate_teacher_spec_static``) refuses only an alias that is blank after
trimming ("teacher alias must be non-empty"); its own examples name teachers
after Hugging Face models (``qwen/qwen-3.6-27b`` is a ``model_id`` there, and
people reuse it as the alias: ``qwen/qwen3-8b@vllm``).  Kiln's routes take the
alias as one path segment (``/v1/teachers/{alias}``, axum's ``Path`` decodes
``%2F``).  This registry also accepts the unencoded form; the suffix routes
match only the last segment, and an alias whose last segment is ``probe``,
``receipts`` or ``launch`` is refused at registration (documented in
docs/operations.md).  Everything runs against a registry under uvicorn on
127.0.0.1 (uvicorn percent-decodes the path before routing) and a reference
teacher on loopback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.domain.aliases import (
    ALIAS_JSON_PATTERN,
    MAX_ALIAS_CHARS,
    alias_path_segment,
    alias_problem,
)
from kiln_registry.domain.errors import InputError
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, RegistryServer, error_of, remote, run_registry, write_config
from tests.helpers import serve_reference_teacher

HF_ALIAS = "qwen/qwen3-8b@vllm"  # a Hugging Face model name as the alias
SERVED = "teacher-tiny"
JOB_DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def teacher_url(tiny_model: TinyModel) -> Iterator[str]:
    with serve_reference_teacher(tiny_model.path, SERVED) as url:
        yield url


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel
) -> Iterator[RegistryServer]:
    directory = tmp_path_factory.mktemp("aliases")
    with run_registry(write_config(directory, student=tiny_model.path)) as server:
        yield server


@pytest.fixture(scope="module")
def hf_alias(registry: RegistryServer, teacher_url: str) -> str:
    with registry.client() as http:
        created = http.post("/v1/teachers", json=remote(HF_ALIAS, teacher_url))
    assert created.status_code == 200, created.text
    assert created.json()["spec"]["alias"] == HF_ALIAS
    return HF_ALIAS


def _forms(alias: str) -> list[str]:
    """The alias percent-encoded as one segment, and with its '/' written as is."""
    return [quote(alias, safe="@"), quote(alias, safe="@/")]


def test_a_hugging_face_alias_reads_the_same_in_both_forms(
    registry: RegistryServer, hf_alias: str
) -> None:
    with registry.client() as http:
        bodies = [http.get(f"/v1/teachers/{form}") for form in _forms(hf_alias)]
        # The second read of each form may come from the lookup cache: same bytes.
        bodies += [http.get(f"/v1/teachers/{form}") for form in _forms(hf_alias)]
    assert [b.status_code for b in bodies] == [200] * 4
    assert len({b.content for b in bodies}) == 1
    assert bodies[0].json()["spec"]["alias"] == hf_alias


def test_probe_and_receipts_take_the_alias_in_both_forms(
    registry: RegistryServer, hf_alias: str
) -> None:
    with registry.client() as http:
        for form in _forms(hf_alias):
            probed = http.post(f"/v1/teachers/{form}/probe")
            assert probed.status_code == 200, probed.text
            assert probed.json()["outcome"] == "passed"
        for form in _forms(hf_alias):
            receipts = http.get(f"/v1/teachers/{form}/receipts", params={"limit": 10})
            assert receipts.status_code == 200, receipts.text
            listed = receipts.json()["receipts"]
            assert len(listed) >= 3 and {r["alias"] for r in listed} == {hf_alias}


def test_launch_reaches_the_alias_in_both_forms(registry: RegistryServer, hf_alias: str) -> None:
    """A remote alias is not launched; the refusal names the whole alias (not 'qwen')."""
    with registry.client() as http:
        for form in _forms(hf_alias):
            response = http.post(f"/v1/teachers/{form}/launch")
            assert response.status_code == 400, response.text
            error = error_of(response)
            assert repr(hf_alias) in error["message"]
            assert error.get("rule") == "teacher.launch_not_local"


def test_a_job_names_a_slash_alias(registry: RegistryServer, hf_alias: str) -> None:
    body = {"kind": "teacher_scoring", "teacher": hf_alias, "top_k": 2, "sequences": [[1, 2, 3]]}
    with registry.client() as http:
        submitted = http.post("/v1/jobs", json=body)
        assert submitted.status_code == 201, submitted.text
        job: dict[str, Any] = submitted.json()
        assert job["teacher"] == hf_alias
        deadline = time.monotonic() + JOB_DEADLINE_S
        while job["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, job
            time.sleep(0.1)
            job = http.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job


def test_delete_takes_the_alias_in_both_forms(registry: RegistryServer) -> None:
    with registry.client() as http:
        for number, form in enumerate(("encoded", "plain")):
            alias = f"org-{number}/model.v1@fixture"
            created = http.post("/v1/teachers", json={"alias": alias, "kind": "fixture",
                                                      "model_id": "m"})  # fmt: skip
            assert created.status_code == 200, created.text
            path = _forms(alias)[0 if form == "encoded" else 1]
            deleted = http.delete(f"/v1/teachers/{path}")
            assert deleted.status_code == 200, deleted.text
            assert deleted.json() == {"status": "deleted", "alias": alias}
            assert http.get(f"/v1/teachers/{path}").status_code == 404


KILN_ACCEPTS = [
    "probe",  # one segment: GET /v1/teachers/probe and POST .../probe/probe are unambiguous
    "..",
    ".",
    "spaced name",  # Kiln also takes " spaced name "; white space at either end is refused
    "été/modèle 1",
    "a?b#c&d=e",
    "org/",
    "/lead",
    "a//b",
    "x" * MAX_ALIAS_CHARS,
    "emoji-\U0001f600",
]


@pytest.mark.parametrize("alias", KILN_ACCEPTS)
def test_aliases_kiln_accepts_work_through_the_client(registry: RegistryServer, alias: str) -> None:
    with RegistryClient(registry.url) as client:
        entry = client.register_teacher(alias=alias, kind="fixture", model_id="m")
        assert entry.spec.alias == alias
        assert client.get_teacher(alias).spec.alias == alias
        assert alias in [e.spec.alias for e in client.list_teachers()]
        assert client.receipts(alias) == []
        assert client.delete_teacher(alias).alias == alias
        with pytest.raises(RegistryClientError) as gone:
            client.get_teacher(alias)
    assert gone.value.code == "teacher_not_found"


def test_a_one_segment_alias_named_like_a_suffix_is_probed(
    registry: RegistryServer, teacher_url: str
) -> None:
    with registry.client() as http:
        assert http.post("/v1/teachers", json=remote("receipts", teacher_url)).status_code == 200
        assert http.get("/v1/teachers/receipts").json()["spec"]["alias"] == "receipts"
        probed = http.post("/v1/teachers/receipts/probe")
        assert probed.status_code == 200 and probed.json()["outcome"] == "passed"
        listed = http.get("/v1/teachers/receipts/receipts").json()["receipts"]
        assert {r["alias"] for r in listed} == {"receipts"}
        assert http.delete("/v1/teachers/receipts").status_code == 200


REFUSED = [
    ("", "blank"),
    ("  \t ", "blank"),
    ("x" * (MAX_ALIAS_CHARS + 1), "longer than"),
    ("nul\x00here", "U+0000"),
    ("esc\x1b[31m", "U+001B"),
    ("del\x7f", "U+007F"),
    ("c1\x9f", "U+009F"),
    ("line\nbreak", "U+000A"),
    ("org/probe", "'/probe'"),
    ("a/b/receipts", "'/receipts'"),
    ("x/launch", "'/launch'"),
]


@pytest.mark.parametrize(("alias", "needle"), REFUSED)
def test_refused_aliases_are_400_and_persist_nothing(
    registry: RegistryServer, alias: str, needle: str
) -> None:
    with registry.client() as http:
        before = http.get("/v1/teachers").json()
        response = http.post("/v1/teachers", json={"alias": alias, "kind": "fixture",
                                                   "model_id": "m"})  # fmt: skip
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == "teacher_registration_invalid"
        assert error["message"].startswith("alias: ") and needle in error["message"]
        assert http.get("/v1/teachers").json() == before


def test_the_client_refuses_aliases_the_registry_cannot_hold() -> None:
    with RegistryClient("http://127.0.0.1:9") as client:
        for alias, _ in REFUSED:
            with pytest.raises(InputError) as refused:
                client.get_teacher(alias)
            assert refused.value.rule == "client.alias"


def test_dot_segments_are_encoded() -> None:
    assert alias_path_segment(HF_ALIAS) == "qwen%2Fqwen3-8b@vllm"
    assert alias_path_segment("..") == "%2E%2E"
    assert alias_path_segment(".") == "%2E"


def test_the_cli_encodes_a_slash_alias(
    registry: RegistryServer, hf_alias: str, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "kiln_registry.cli.main", "teachers", "show", hf_alias,
            "--server", registry.url, "--json"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["spec"]["alias"] == hf_alias


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.from_regex(ALIAS_JSON_PATTERN, fullmatch=True)))
def test_the_openapi_pattern_states_the_same_rule(alias: str) -> None:
    """The pattern in the OpenAPI document accepts exactly what the server accepts."""
    assert (re.fullmatch(ALIAS_JSON_PATTERN, alias) is not None) == (alias_problem(alias) is None)
