"""RegistryClient and AsyncRegistryClient: the job routes against a live registry.

Submit, wait with a progress callback, page through the list, show, cancel,
and download the corpus with verification, synchronously and asynchronously,
against ``kiln serve``'s app on loopback scoring with the reference teacher.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kiln_registry.client.asynchronous import AsyncRegistryClient
from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.domain.errors import InputError
from kiln_registry.jobs.core.signing import CorpusSigner
from kiln_registry.wire.jobs import JobPublic, JobStatus
from tests.client.conftest import ALIAS
from tests.jobs.harness import Registry

SEQUENCES = [[5, 9, 11, 40], [7], [1, 2, 3, 4, 5]]


def _stranger_keys() -> dict[str, object]:
    """A valid public key that did not sign the registry's corpora."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signer = CorpusSigner(Ed25519PrivateKey.generate())
    return {signer.public.key_id: signer.public}


def test_sync_client_runs_a_job_and_downloads_a_verified_corpus(
    live: Registry, tmp_path: Path
) -> None:
    seen: list[JobPublic] = []
    with RegistryClient(live.url, timeout=30) as client:
        job = client.submit_job(teacher=ALIAS, top_k=4, sequences=SEQUENCES)
        assert job.status in (JobStatus.queued, JobStatus.probing, JobStatus.running)
        done = client.wait_job(job.id, interval=0.05, on_progress=seen.append)
        assert done.status is JobStatus.succeeded and done.result is not None
        assert seen[-1] == done and done.progress.done == done.progress.total == 3
        assert client.get_job(job.id) == done
        second = client.submit_job(teacher=ALIAS, top_k=2, sequences=[[3, 4]])
        client.wait_job(second.id, interval=0.05)
        assert [j.id for j in client.list_jobs(limit=1)] == [second.id]
        assert {j.id for j in client.iter_jobs(page_size=1)} >= {job.id, second.id}
        with pytest.raises(RegistryClientError) as info:
            client.cancel_job(job.id)
        assert (info.value.status, info.value.code) == (409, "job_conflict")

        out = tmp_path / "new" / "dir" / "corpus.jsonl"
        got = client.download_result(job.id, out)
        assert got.path == out and out.is_file() and got.sha256 == done.result.sha256
        assert got.summary is not None and got.summary.sequences == 3
        assert got.summary.teacher == ALIAS and got.bytes == out.stat().st_size

        refused = tmp_path / "refused" / "corpus.jsonl"
        with pytest.raises(InputError) as bad:
            client.download_result(job.id, refused, keys=_stranger_keys())
        assert bad.value.rule == "corpus.unknown_key"
        assert list(refused.parent.iterdir()) == []  # neither the output nor a partial file


def test_async_client_covers_teachers_and_jobs(live: Registry, tmp_path: Path) -> None:
    async def scenario() -> None:
        changes: list[str] = []

        async def on_progress(job: JobPublic) -> None:
            changes.append(job.status)

        async with AsyncRegistryClient(live.url, timeout=30) as client:
            assert (await client.health()).status == "ok"
            entry = await client.get_teacher(ALIAS)
            assert entry.usable and ALIAS in [e.spec.alias for e in await client.list_teachers()]
            report = await client.probe_teacher(ALIAS)
            assert report.outcome == "passed"
            assert [r.outcome for r in await client.receipts(ALIAS)][:1] == ["passed"]
            job = await client.submit_job(teacher=ALIAS, top_k=3, sequences=SEQUENCES[:2])
            done = await client.wait_job(job.id, interval=0.05, on_progress=on_progress)
            assert done.status is JobStatus.succeeded and changes[-1] == "succeeded"
            assert job.id in [j.id async for j in client.iter_jobs(page_size=1)]
            got = await client.download_result(job.id, tmp_path / "a" / "c.jsonl")
            assert got.summary is not None and got.summary.sequences == 2
            with pytest.raises(RegistryClientError) as info:
                await client.get_job("job-" + "0" * 24)
            assert (info.value.status, info.value.code) == (404, "job_not_found")

    asyncio.run(scenario())


def test_bad_arguments_are_refused_before_a_request() -> None:
    with RegistryClient("http://127.0.0.1:1") as client:
        with pytest.raises(InputError, match=r"client\.job_id"):
            client.get_job("job-1/../../v1/teachers")
        with pytest.raises(InputError, match=r"client\.job_source"):
            client.submit_job(teacher="t", top_k=1)
        with pytest.raises(InputError, match=r"client\.status"):
            client.jobs_page(status="bogus")
        with pytest.raises(InputError, match=r"client\.interval"):
            client.wait_job("job-" + "0" * 24, interval=0)


def test_the_documented_jobs_example_runs(
    live: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text("utf-8")
    block = doc.split("Jobs too:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = block.replace("http://127.0.0.1:8420", live.url).replace("demo-teacher@reference", ALIAS)
    monkeypatch.chdir(tmp_path)
    # The block continues the one before it, which imported RegistryClient.
    scope = {"print": lambda *a: None, "RegistryClient": RegistryClient}
    exec(compile(code, "docs/operations.md", "exec"), scope)
    assert scope["corpus"].path.name == "run-1.jsonl" and scope["corpus"].path.is_file()
    assert not (tmp_path / "corpora").exists()  # issue 30 item 12: nothing written in the clone
