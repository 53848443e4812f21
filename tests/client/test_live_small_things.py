"""Issue 18 item 8 against a live registry: one test per item.

``kiln jobs result -o`` into a directory that does not exist yet, a
registration with many problems refused once with all of them, a re-probe
whose teacher changed identity naming the fields and the way out, and the
corpus example of ``docs/operations.md`` submitted as it is written there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln_registry.cli.main import run
from kiln_registry.client.sync import RegistryClient, RegistryClientError
from tests.client.conftest import ALIAS
from tests.jobs.harness import Controlled, Registry, student_identity
from tests.probe.teacher_server import TeacherServer

REPO = Path(__file__).resolve().parents[2]


def test_jobs_result_output_creates_its_parent_directory(
    live: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RegistryClient(live.url) as client:
        job = client.submit_job(teacher=ALIAS, top_k=2, sequences=[[1, 2, 3]])
        client.wait_job(job.id, interval=0.05)
    out = tmp_path / "not" / "yet" / "there.jsonl"
    assert run(["jobs", "result", job.id, "-o", str(out), "--server", live.url]) == 0
    assert out.is_file() and "verified" in capsys.readouterr().err
    assert [p.name for p in out.parent.iterdir()] == ["there.jsonl"]


def test_jobs_result_to_stdout_is_the_verified_corpus(
    live: Registry, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    with RegistryClient(live.url) as client:
        job = client.submit_job(teacher=ALIAS, top_k=2, sequences=[[4, 5]])
        client.wait_job(job.id, interval=0.05)
        saved = client.download_result(job.id, tmp_path / "saved.jsonl")
    assert run(["jobs", "result", job.id, "--server", live.url]) == 0
    assert capsysbinary.readouterr().out == saved.path.read_bytes()


def test_a_validation_error_lists_every_invalid_field(live: Registry) -> None:
    with RegistryClient(live.url) as client, pytest.raises(RegistryClientError) as info:
        client.register_teacher(alias="many-problems", kind="remote", notes="bad\x07notes",
                                adapter="lora")  # fmt: skip
    err = info.value
    assert (err.status, err.code) == (400, "teacher_registration_invalid")
    message = err.server_message or ""
    parts = ("notes", "provider is required", "model_id is required",
             "url (or urls, for a replica set) is required", "adapter must be null")  # fmt: skip
    for part in parts:
        assert part in message, message
    # A body of the wrong shapes is still a 400 naming each field (schemathesis found a 500).
    odd = {"alias": "odd", "kind": "remote", "provider": {}, "model_id": ["m"], "url": 1}
    refused = live.http.post("/v1/teachers", json=odd)
    assert refused.status_code == 400, refused.text
    assert all(name in refused.json()["error"]["message"] for name in ("provider", "model_id"))


def test_an_identity_mismatch_names_the_fields_and_what_to_do(
    live: Registry, student_vocab_sha256: str
) -> None:
    pinned = student_identity(student_vocab_sha256)
    changed = student_identity(student_vocab_sha256, inference="9" * 64)
    state = {"fp": pinned.fingerprint()}
    with (
        TeacherServer(Controlled(pinned, fingerprint=lambda i: state["fp"])) as teacher,
        RegistryClient(live.url) as client,
    ):
        url = f"http://127.0.0.1:{teacher.port}"
        client.register_teacher(
            alias="changes", kind="remote", provider="vllm", model_id="teacher-tiny", url=url
        )
        state["fp"] = changed.fingerprint()
        with pytest.raises(RegistryClientError) as info:
            client.probe_teacher("changes")
    text = str(info.value)
    assert "identity fields that differ: inference_config_sha256" in text
    assert "vLLM version or its inference options changed" in text
    assert "register the new identity under a new alias" in text


def test_the_documented_corpus_format_is_accepted(live: Registry) -> None:
    doc = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = doc.split("### The job's input", 1)[1].split("\n### ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith('    {"id"')]
    assert len(lines) == 2
    root = Path(live.ctx.config.jobs.corpus_root)
    (root / "documented.jsonl").write_text("".join(f"{line}\n" for line in lines), "utf-8")
    with RegistryClient(live.url) as client:
        job = client.submit_job(teacher=ALIAS, top_k=2, corpus="documented.jsonl")
        done = client.wait_job(job.id, interval=0.05)
    assert done.status == "succeeded" and done.progress.total == 2
    assert re.search(r"512 MiB per file", section)
