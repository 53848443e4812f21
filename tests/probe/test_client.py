"""The probe client against real loopback teachers (tests/probe/teacher_server.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from kiln_registry.domain.errors import IdentityMismatch, KilnError, ProbeBusy, ProbeFailed
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.probe.client import ProbeLimiter, probe_teacher, score_prompt
from kiln_registry.probe.parse import response_body_limit
from kiln_registry.probe.report import ProbeReport, attached_report
from kiln_registry.probe.verify import StudentView
from tests.probe.teacher_server import (
    HASH_B,
    Reply,
    Request,
    TeacherServer,
    completion_body,
    good_teacher,
    make_identity,
)

SECRET = "s3cr3t-teacher-key-value-0123456789"
T = TypeVar("T")


class Secret:
    """A SecretSource that counts reads."""

    def __init__(self, value: str = SECRET) -> None:
        self.value = value
        self.reads = 0

    def read(self) -> str:
        self.reads += 1
        return self.value


def run(factory: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with httpx.AsyncClient(trust_env=False) as http:
            return await factory(http)

    return asyncio.run(main())


def probe(
    url: str,
    *,
    secret: Secret | None = None,
    pinned: TeacherIdentity | None = None,
    student: StudentView | None = None,
    timeout_s: float = 5.0,
    model_id: str = "teacher-tiny",
    limiter: ProbeLimiter | None = None,
) -> ProbeReport:
    return run(
        lambda http: probe_teacher(
            http,
            completions_url=url,
            model_id=model_id,
            student=student,
            pinned=pinned,
            secret=secret,
            timeout_s=timeout_s,
            limiter=limiter or ProbeLimiter(),
        )
    )


def assert_no_secret(exc: BaseException | None = None, report: ProbeReport | None = None) -> None:
    texts: list[str] = []
    while exc is not None:
        texts += [str(exc), repr(exc)]
        if isinstance(exc, KilnError):
            texts.append(exc.one_line())
        exc = exc.__cause__ or exc.__context__
    if report is not None:
        texts += [repr(report), json.dumps(report.to_dict())]
    for text in texts:
        assert SECRET not in text


def probe_fails(url: str, rule: str, **kwargs: object) -> ProbeFailed:
    with pytest.raises(ProbeFailed) as info:
        probe(url, **kwargs)  # type: ignore[arg-type]
    assert info.value.rule == rule, str(info.value)
    assert_no_secret(info.value, attached_report(info.value))
    return info.value


IDENTITY = make_identity()
STUDENT = StudentView(tokenizer_vocab_sha256=HASH_B, model_width=512)


def test_probe_passes_and_sends_kilns_probe() -> None:
    with TeacherServer(good_teacher(IDENTITY)) as srv:
        report = probe(srv.url, pinned=IDENTITY, student=STUDENT)
    assert report.passed and report.k_values == (1, 32, 33)
    assert [a.status_code for a in report.attempts] == [200, 200, 400]
    assert report.fingerprint == IDENTITY.fingerprint()
    assert report.identity_digest == IDENTITY.digest()
    assert report.attempts[1].min_row_width == 33 and report.attempts[1].candidate_count == 33
    first = srv.requests[0]
    assert first.json() == {
        "model": "teacher-tiny",
        "prompt": [0, 0],
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
        "n": 1,
        "stream": False,
        "add_special_tokens": False,
    }
    assert "authorization" not in first.headers
    assert report.to_dict()["outcome"] == "passed"


def test_secret_is_read_per_request_and_never_reported() -> None:
    secret = Secret()
    with TeacherServer(good_teacher(IDENTITY, api_key=SECRET)) as srv:
        report = probe(srv.url, secret=secret)
    assert report.passed and secret.reads == 3
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in srv.requests)
    assert_no_secret(report=report)


def test_fingerprint_change_between_probes_is_refused() -> None:
    other = make_identity(base="d" * 64)
    fps = [IDENTITY.fingerprint(), other.fingerprint()]
    with TeacherServer(good_teacher(IDENTITY, fingerprints=fps)) as srv:
        exc = probe_fails(srv.url, "probe.fingerprint_changed")
    report = attached_report(exc)
    assert report is not None and report.failure_rule == "probe.fingerprint_changed"
    assert len(report.attempts) == 2


def test_pinned_identity_mismatch_and_stock_fingerprint() -> None:
    with TeacherServer(good_teacher(IDENTITY)) as srv:
        probe_fails(srv.url, "probe.fingerprint_pinned", pinned=make_identity(base="e" * 64))
    with TeacherServer(good_teacher(IDENTITY, fingerprints=["vllm-0.32.0-96a60ac7"])) as srv:
        probe_fails(srv.url, "probe.fingerprint_stock")


def test_student_mismatch_is_409() -> None:
    with TeacherServer(good_teacher(IDENTITY)) as srv, pytest.raises(IdentityMismatch) as info:
        probe(srv.url, student=StudentView(tokenizer_vocab_sha256="0" * 64, model_width=512))
    assert info.value.status == 409 and attached_report(info.value) is not None
    with TeacherServer(good_teacher(IDENTITY)) as srv, pytest.raises(IdentityMismatch):
        probe(srv.url, student=StudentView(tokenizer_vocab_sha256=HASH_B, model_width=1024))


def test_base_alias_response_model_is_refused() -> None:
    with TeacherServer(good_teacher(IDENTITY, model="base-model")) as srv:
        probe_fails(srv.url, "probe.model")
    with TeacherServer(good_teacher(IDENTITY)) as srv:  # request model != served_model_id
        probe_fails(srv.url, "probe.model", model_id="base-model")


def test_teacher_answering_the_cap_probe_is_refused() -> None:
    with TeacherServer(good_teacher(IDENTITY, answer_cap=True)) as srv:
        exc = probe_fails(srv.url, "probe.cap_not_enforced")
    report = attached_report(exc)
    assert report is not None and [a.status_code for a in report.attempts] == [200, 200, 200]


def test_redirect_is_never_followed() -> None:
    def redirect(request: Request, index: int) -> Reply:
        return Reply(status=307, headers={"location": "http://127.0.0.1:1/steal"})

    with TeacherServer(redirect) as srv:
        probe_fails(srv.url, "probe.redirect", secret=Secret())
        assert len(srv.requests) == 1


def test_slow_loris_is_cut_by_the_overall_deadline() -> None:
    body = completion_body(
        model="teacher-tiny", fingerprint=IDENTITY.fingerprint(), prompt=[0, 0], k=1
    )

    def drip(request: Request, index: int) -> Reply:
        return Reply(body=body, mode="drip", drip_interval=0.1)

    with TeacherServer(drip) as srv:
        start = time.monotonic()
        probe_fails(srv.url, "probe.timeout", timeout_s=0.8)
        assert time.monotonic() - start < 3.0


def test_close_mid_body_is_incomplete() -> None:
    body = completion_body(
        model="teacher-tiny", fingerprint=IDENTITY.fingerprint(), prompt=[0, 0], k=1
    )
    with TeacherServer(lambda r, i: Reply(body=body, mode="close_mid")) as srv:
        probe_fails(srv.url, "probe.incomplete_body", secret=Secret())


def test_claimed_huge_body_is_refused_from_its_content_length() -> None:
    with TeacherServer(lambda r, i: Reply(mode="claim", length=300 * 1024 * 1024)) as srv:
        probe_fails(srv.url, "probe.body_too_large")
        assert srv.bytes_sent < 64 * 1024 * 1024


def test_streamed_huge_body_stops_at_the_bound() -> None:
    with TeacherServer(lambda r, i: Reply(mode="stream", length=300 * 1024 * 1024)) as srv:
        probe_fails(srv.url, "probe.body_too_large", secret=Secret())
        # The client stops at the bound; the server only got ahead by socket buffers.
        assert srv.bytes_sent < response_body_limit(2, 1) + 32 * 1024 * 1024


def test_401_body_is_echoed_only_without_a_key() -> None:
    with TeacherServer(good_teacher(IDENTITY, api_key="expected")) as srv:
        withheld = probe_fails(srv.url, "probe.unauthorized", secret=Secret())
        echoed = probe_fails(srv.url, "probe.unauthorized")
    assert "teacher-body-marker" not in str(withheld)
    # Issue 15: only vLLM's own error shapes are quoted; this body is not one.
    assert "teacher-body-marker" not in str(echoed) and "not shown" in str(echoed)


def test_error_echo_is_bounded_to_400_characters() -> None:
    long_error = json.dumps(
        {"error": {"message": "x" * 5000, "type": "E", "param": None, "code": 400}}
    ).encode()
    with TeacherServer(lambda r, i: Reply(status=400, body=long_error)) as srv:
        exc = probe_fails(srv.url, "probe.http_status")
    assert "x" * 400 in str(exc) and "x" * 401 not in str(exc)


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    probe_fails(f"http://127.0.0.1:{port}/v1/completions", "probe.unreachable")


def test_limiter_refuses_a_third_probe() -> None:
    limiter = ProbeLimiter(max_in_flight=2)
    with limiter.slot(), limiter.slot():
        with pytest.raises(ProbeBusy) as info:
            probe("http://127.0.0.1:1/v1/completions", limiter=limiter)
        assert info.value.status == 503 and info.value.retry_after == 5
    assert limiter.in_flight == 0


def test_concurrent_probes_hit_the_limiter() -> None:
    body = completion_body(
        model="teacher-tiny", fingerprint=IDENTITY.fingerprint(), prompt=[0, 0], k=1
    )
    limiter = ProbeLimiter()

    async def three(http: httpx.AsyncClient) -> list[ProbeReport | BaseException]:
        def one() -> Awaitable[ProbeReport]:
            return probe_teacher(
                http,
                completions_url=srv.url,
                model_id="teacher-tiny",
                student=None,
                pinned=None,
                secret=None,
                timeout_s=0.6,
                limiter=limiter,
            )

        return list(await asyncio.gather(one(), one(), one(), return_exceptions=True))

    with TeacherServer(lambda r, i: Reply(body=body, mode="drip", drip_interval=0.1)) as srv:
        results = run(three)
    assert sum(isinstance(r, ProbeBusy) for r in results) == 1
    assert sum(isinstance(r, ProbeFailed) and r.rule == "probe.timeout" for r in results) == 2


def test_score_prompt_returns_topk_matrices() -> None:
    prompt = [5, 9, 11, 3]
    with TeacherServer(good_teacher(IDENTITY)) as srv:
        scored = run(
            lambda http: score_prompt(
                http,
                completions_url=srv.url,
                model_id="teacher-tiny",
                prompt=prompt,
                k=4,
                identity=IDENTITY,
                secret=None,
            )
        )
    check = scored.check
    assert check.topk_ids.shape == (3, 4) and list(check.actual_ids) == prompt[1:]
    assert list(check.actual_ranks) == [7, 7, 7]
    assert scored.attempt.status_code == 200


def test_score_prompt_refuses_another_identity() -> None:
    other = make_identity(base="d" * 64)
    with TeacherServer(good_teacher(IDENTITY)) as srv, pytest.raises(ProbeFailed) as info:
        run(
            lambda http: score_prompt(
                http,
                completions_url=srv.url,
                model_id="teacher-tiny",
                prompt=[1, 2],
                k=1,
                identity=other,
                secret=None,
            )
        )
    assert info.value.rule == "probe.fingerprint_changed"
