"""One contract, two clients: ``probe.transport``'s rules through httpx and through h11.

The probes use ``HttpxTransport`` and the job queue's scoring requests use
``TeacherWire``; both implement ``TeacherTransport``.  Each case here runs the
same scripted loopback answer through both and expects the same status and
body, or the same refusal rule, from the one failure mapper
(``transport_failure``).  The servers are ``test_wire``'s real keep-alive
HTTP/1.1 servers.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trustme

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.httpx_transport import HttpxTransport
from kiln_registry.probe.transport import (
    ERROR_BODY_READ_LIMIT,
    TeacherTransport,
    teacher_tls_context,
)
from kiln_registry.probe.wire import TeacherWire
from tests.probe.test_wire import PAYLOAD, Answer, EnvSecret, chunked, ok, serving

Opener = Callable[[str, ssl.SSLContext | None], AbstractAsyncContextManager[TeacherTransport]]


@asynccontextmanager
async def over_httpx(url: str, tls: ssl.SSLContext | None) -> AsyncIterator[TeacherTransport]:
    verify: ssl.SSLContext | bool = tls if tls is not None else True
    async with httpx.AsyncClient(trust_env=False, verify=verify) as http:
        yield HttpxTransport(http, url)


@asynccontextmanager
async def over_h11(url: str, tls: ssl.SSLContext | None) -> AsyncIterator[TeacherTransport]:
    async with TeacherWire(url, tls=tls, max_idle=2) as wire:
        yield wire


CLIENTS = pytest.mark.parametrize("opener", [over_httpx, over_h11], ids=["httpx", "h11"])


def exchange(
    opener: Opener, url: str, *, limit: int = 1 << 20, tls: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        async with opener(url, tls) as transport:
            assert transport.url == url
            answer = await transport.exchange(
                PAYLOAD, secret=EnvSecret(), timeout_s=5.0, limit=limit
            )
        assert answer.authenticated
        return answer.status, answer.body

    return asyncio.run(go())


def refusal(opener: Opener, url: str, **kwargs: object) -> ProbeFailed:
    with pytest.raises(ProbeFailed) as info:
        exchange(opener, url, **kwargs)  # type: ignore[arg-type]
    return info.value


@CLIENTS
def test_both_clients_read_the_same_answers(opener: Opener) -> None:
    body = b'{"choices":[' + b"1," * 3000 + b"1]}"
    with serving(lambda c, r, req: Answer(ok(body))) as srv:
        assert exchange(opener, srv.url()) == (200, body)
    with serving(lambda c, r, req: Answer(chunked(body, pieces=5))) as srv:
        assert exchange(opener, srv.url()) == (200, body)
    request = srv.seen.requests[0].lower()
    for header in (b"content-type: application/json", b"accept-encoding: identity"):
        assert header in request
    assert request.endswith(b'{"model":"m","prompt":[1,2],"prompt_logprobs":1}')


@CLIENTS
@pytest.mark.parametrize(
    ("answer", "rule"),
    [
        (ok(b"", "location: http://elsewhere/", status="307 Temporary Redirect"), "redirect"),
        (ok(b"{}", "content-encoding: gzip"), "content_encoding"),
        (ok(b"x" * 2000), "body_too_large"),
        (chunked(b"x" * 2000), "body_too_large"),
        (ok(b"z" * 1000)[:-500], "incomplete_body"),
        (b"", "unreachable"),
    ],
    ids=["redirect", "gzip", "length", "chunked-length", "mid-body", "no-answer"],
)
def test_both_clients_refuse_with_the_same_rule(opener: Opener, answer: bytes, rule: str) -> None:
    with serving(lambda c, r, req: Answer(answer, then="close")) as srv:
        assert refusal(opener, srv.url(), limit=1000).rule == f"probe.{rule}"


@CLIENTS
def test_both_clients_cut_error_bodies_at_the_same_cap(opener: Opener) -> None:
    big = b"e" * (ERROR_BODY_READ_LIMIT * 2)
    with serving(lambda c, r, req: Answer(ok(big, status="500 Internal Server Error"))) as srv:
        assert exchange(opener, srv.url(), limit=1 << 22) == (500, big[:ERROR_BODY_READ_LIMIT])


@CLIENTS
def test_no_listener_reads_the_same_through_both(opener: Opener, free_port: int) -> None:
    failure = refusal(opener, f"http://127.0.0.1:{free_port}/v1/completions")
    assert failure.rule == "probe.unreachable"
    assert "teacher_ca_file" in (failure.hint or "")


@CLIENTS
def test_an_untrusted_certificate_is_named_in_the_log_only(
    opener: Opener, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The cause chain differs (httpx wraps the ssl error twice; h11 sees it directly):
    # the one mapper finds the certificate error in either and logs what to do.
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with serving(lambda c, r, req: Answer(ok()), tls=server_tls) as srv:
        url = srv.url("https")
        assert exchange(opener, url, tls=teacher_tls_context(ca_file)) == (200, b'{"ok":true}')
        with caplog.at_level(logging.WARNING, logger="kiln_registry.probe"):
            failure = refusal(opener, url, tls=teacher_tls_context(None))
    assert failure.rule == "probe.unreachable"
    assert "certificate" not in failure.message  # one message before any HTTP answer
    logged = [r.getMessage() for r in caplog.records if r.name == "kiln_registry.probe"]
    assert any(f"https://127.0.0.1:{srv.port} is not trusted" in line for line in logged)
