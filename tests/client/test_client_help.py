"""Issue 30 item 11: the Python client reads well at a prompt.

``help(RegistryClient.submit_job)`` shows the operation's real signature and
answer type (not ``*args, **kwargs``), on the class, on an instance and on the
async client; response objects have a readable ``repr`` (absent fields left
out, long text cut) and documented fields.
"""

from __future__ import annotations

import inspect
import pydoc

from kiln_registry.client.asynchronous import AsyncRegistryClient
from kiln_registry.client.sync import RegistryClient
from kiln_registry.wire.jobs import JobPublic
from kiln_registry.wire.teachers import TeacherEntry

JOB = {
    "id": "job-" + "0" * 24, "kind": "teacher_scoring", "status": "queued", "teacher": "t@x",
    "identity_revision": "sha256:" + "a" * 64, "top_k": 8, "generation": None,
    "source": {"kind": "inline", "path": None, "sha256": "b" * 64}, "device": None, "attempts": 0,
    "cancel_requested": False,
    "progress": {"total": 1, "done": 0, "scored": 0, "cache_hits": 0, "requests": 0,
                 "retries": 0},
    "timestamps": {"created_at": "2026-12-03T00:00:00Z", "claimed_at": None,
                   "spec_checked_at": None, "probed_at": None, "leased_at": None,
                   "scoring_started_at": None, "finished_at": None,
                   "updated_at": "2026-12-03T00:00:00Z"},
    "error": None, "result": None,
}  # fmt: skip


def test_help_shows_the_real_signature() -> None:
    text = pydoc.render_doc(RegistryClient.submit_job, renderer=pydoc.plaintext)
    assert "submit_job(self, /, *, teacher: 'str', top_k: 'int'" in text
    assert "-> 'JobPublic'" in text and "*args" not in text
    with RegistryClient("http://127.0.0.1:9") as client:
        bound = inspect.signature(client.submit_job)
    assert list(bound.parameters) == ["teacher", "top_k", "sequences", "corpus"]
    assert inspect.signature(RegistryClient.wait_job).return_annotation == "JobPublic"
    assert "DownloadedCorpus" in str(inspect.signature(AsyncRegistryClient.download_result))


def test_response_repr_is_readable_and_fields_documented() -> None:
    job = JobPublic.model_validate(JOB)
    text = repr(job)
    assert text.startswith("JobPublic(id='job-000000000000000000000000', kind='teacher_scoring'")
    assert "generation=" not in text and "error=" not in text and "device=" not in text
    cut = repr(job.model_copy(update={"teacher": "t" * 500}))
    assert "...(500 chars)" in cut and "t" * 100 not in cut
    for model in (JobPublic, TeacherEntry):
        assert all(info.description for info in model.model_fields.values()), model
