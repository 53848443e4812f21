"""``probe.wire.TeacherWire`` against real loopback servers whose bytes each test scripts.

The server below speaks raw HTTP/1.1 with keep-alive: every request on every
connection goes to the test's ``answer(conn, req, request)``, which returns
the exact bytes to send and what to do with the connection afterwards.  The
rules checked are the probe client's (``probe.transport``), which the
job queue's scoring requests must share.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from kiln_registry.domain.errors import ProbeFailed
from kiln_registry.probe.client import status_failure
from kiln_registry.probe.transport import ERROR_BODY_READ_LIMIT, teacher_tls_context
from kiln_registry.probe.wire import TeacherWire
from tests.probe.teacher_server import Reply, TeacherServer

SECRET = "wire-secret-7Qv9x2LmPz4K"
PAYLOAD: dict[str, object] = {"model": "m", "prompt": [1, 2], "prompt_logprobs": 1}


class EnvSecret:
    def read(self) -> str:
        return SECRET


@dataclass
class Answer:
    data: bytes
    then: str = "keep"  # keep | close | hang | reset
    pieces: int = 1  # written in this many parts, a short pause between them


@dataclass
class Seen:
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


def ok(body: bytes = b'{"ok":true}', *extra: str, status: str = "200 OK") -> bytes:
    head = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes, pieces: int = 3) -> bytes:
    step = max(1, len(body) // pieces)
    out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    for i in range(0, len(body), step):
        part = body[i : i + step]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


Script = Callable[[int, int, bytes], Answer]


class RawServer(TeacherServer):
    """Keep-alive HTTP/1.1 on 127.0.0.1 in its own thread, answering from a script."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(lambda request, index: Reply(), tls)
        self.script = script
        self.seen = Seen()

    def url(self, scheme: str = "http") -> str:  # type: ignore[override]
        return f"{scheme}://127.0.0.1:{self.port}/v1/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self.seen.connections
        self.seen.connections += 1
        try:
            for req in range(1000):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.seen.requests.append(request)
                answer = self.script(conn, req, request)
                step = -(-len(answer.data) // answer.pieces)
                for at in range(0, len(answer.data), step):
                    writer.write(answer.data[at : at + step])
                    await writer.drain()
                    await asyncio.sleep(0.01 if answer.pieces > 1 else 0)
                if answer.then == "hang":
                    await asyncio.sleep(3600)
                if answer.then == "reset":
                    writer.transport.abort()
                    return
                if answer.then == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@contextmanager
def serving(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    with RawServer(script, tls) as server:
        yield server


async def post(
    wire: TeacherWire, *, limit: int = 1 << 20, timeout_s: float = 5.0, secret: bool = False
) -> tuple[int, bytes]:
    answer = await wire.exchange(
        PAYLOAD, secret=EnvSecret() if secret else None, timeout_s=timeout_s, limit=limit
    )
    return answer.status, answer.body


def run_posts(url: str, count: int, **kwargs: object) -> list[tuple[int, bytes]]:
    async def go() -> list[tuple[int, bytes]]:
        async with TeacherWire(url, tls=None, max_idle=4) as wire:
            return [await post(wire, **kwargs) for _ in range(count)]  # type: ignore[arg-type]

    return asyncio.run(go())


def refused(url: str, **kwargs: object) -> ProbeFailed:
    with pytest.raises(ProbeFailed) as info:
        run_posts(url, 1, **kwargs)
    return info.value


def test_requests_share_one_kept_alive_connection() -> None:
    with serving(lambda c, r, req: Answer(ok(b'{"n":%d}' % r))) as srv:
        answers = run_posts(srv.url(), 3)
    assert answers == [(200, b'{"n":0}'), (200, b'{"n":1}'), (200, b'{"n":2}')]
    assert srv.seen.connections == 1
    first = srv.seen.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"\r\nhost: 127.0.0.1:%d\r\n" % srv.port in first
    assert b"accept-encoding: identity" in first
    assert first.endswith(b'{"model":"m","prompt":[1,2],"prompt_logprobs":1}')


def test_chunked_bodies_are_reassembled() -> None:
    body = b'{"choices":[' + b"1," * 5000 + b"1]}"
    with serving(lambda c, r, req: Answer(chunked(body, pieces=7))) as srv:
        assert run_posts(srv.url(), 2) == [(200, body), (200, body)]
    assert srv.seen.connections == 1


def test_a_connection_the_teacher_closed_is_replaced_without_failing() -> None:
    # The teacher ends each connection after one answer without saying so (a keep-alive
    # timeout): the next request finds the pooled connection dead and uses a fresh one.
    with serving(lambda c, r, req: Answer(ok(), then="close")) as srv:
        assert run_posts(srv.url(), 3) == [(200, b'{"ok":true}')] * 3
    assert srv.seen.connections == 3


def test_connection_close_is_honoured() -> None:
    with serving(lambda c, r, req: Answer(ok(b"{}", "connection: close"), then="close")) as srv:
        assert run_posts(srv.url(), 2) == [(200, b"{}")] * 2
    assert srv.seen.connections == 2


@pytest.mark.parametrize("pieces", [1, 3, 40])
def test_heads_and_bodies_arriving_in_pieces_are_read_whole(pieces: int) -> None:
    # Written in parts: a head cut anywhere (even in its blank line), then the body.
    body = bytes(range(256)) * 64
    with serving(lambda c, r, req: Answer(ok(body), pieces=pieces)) as srv:
        assert run_posts(srv.url(), 3, limit=1 << 20) == [(200, body)] * 3
    assert srv.seen.connections == 1


def test_an_http_1_0_answer_is_not_kept_alive() -> None:
    answer = b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}"  # the server keeps it open
    with serving(lambda c, r, req: Answer(answer)) as srv:
        assert run_posts(srv.url(), 2) == [(200, b"{}")] * 2
    assert srv.seen.connections == 2


def test_interim_responses_are_skipped() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\n" + ok()
    with serving(lambda c, r, req: Answer(answer)) as srv:
        assert run_posts(srv.url(), 1) == [(200, b'{"ok":true}')]


@pytest.mark.parametrize(
    ("answer", "rule"),
    [
        (ok(b"", "location: http://elsewhere/", status="307 Temporary Redirect"), "redirect"),
        (ok(b"{}", "content-encoding: gzip"), "content_encoding"),
        (ok(b"x" * 2000), "body_too_large"),
        (chunked(b"x" * 2000), "body_too_large"),
        (b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"y" * 300_000 + b"\r\n\r\n", "unreachable"),
        (b"NOT HTTP AT ALL\r\n\r\n", "unreachable"),  # no HTTP head: one error (issue 15)
        (b"HTTP/1.1 100 Continue\r\n\r\n" * 6 + ok(), "transport"),
    ],
    ids=["redirect", "gzip", "length", "chunked-length", "huge-head", "garbage", "interim"],
)
def test_heads_and_bodies_outside_the_rules_are_refused(answer: bytes, rule: str) -> None:
    with serving(lambda c, r, req: Answer(answer, then="close")) as srv:
        assert refused(srv.url(), limit=1000).rule == f"probe.{rule}"


def test_error_bodies_are_read_only_to_their_cap_and_the_connection_dropped() -> None:
    big = b"e" * (ERROR_BODY_READ_LIMIT * 2)
    with serving(lambda c, r, req: Answer(ok(big, status="500 Internal Server Error"))) as srv:
        answers = run_posts(srv.url(), 2, limit=1 << 22)
    assert [status for status, _ in answers] == [500, 500]
    assert all(body == big[:ERROR_BODY_READ_LIMIT] for _, body in answers)
    assert srv.seen.connections == 2


def test_a_connection_ending_mid_body_is_an_incomplete_body() -> None:
    half = ok(b"z" * 1000)[:-500]
    with serving(lambda c, r, req: Answer(half, then="close")) as srv:
        assert refused(srv.url()).rule == "probe.incomplete_body"
    with serving(lambda c, r, req: Answer(half, then="reset")) as srv:
        assert refused(srv.url()).rule == "probe.incomplete_body"


def test_a_fresh_connection_closed_without_an_answer_is_a_transport_failure() -> None:
    with serving(lambda c, r, req: Answer(b"", then="close")) as srv:
        assert (
            refused(srv.url()).rule == "probe.unreachable"
        )  # issue 15: one error before any HTTP head


def test_no_listener_is_a_connect_failure(free_port: int) -> None:
    assert refused(f"http://127.0.0.1:{free_port}/v1/completions").rule == "probe.unreachable"


def test_a_silent_teacher_times_out() -> None:
    with serving(lambda c, r, req: Answer(b"HTTP/1.1 200 OK\r\n", then="hang")) as srv:
        assert refused(srv.url(), timeout_s=0.5).rule == "probe.unreachable"  # no complete head


def test_a_stall_after_the_head_is_a_timeout_only_where_the_caller_asks() -> None:
    """The teacher endpoint's wire reports a stall mid-body as probe.timeout (its 504), as
    the httpx transport does; the job queue's keeps reading it as probe.unreachable."""
    stalled = ok(b"z" * 1000)[:-500]

    async def go(report: bool) -> ProbeFailed:
        async with TeacherWire(srv.url(), tls=None, max_idle=1, report_timeouts=report) as wire:
            with pytest.raises(ProbeFailed) as info:
                await post(wire, timeout_s=0.5)
        return info.value

    with serving(lambda c, r, req: Answer(stalled, then="hang")) as srv:
        assert asyncio.run(go(True)).rule == "probe.timeout"
        assert asyncio.run(go(False)).rule == "probe.unreachable"
    with serving(lambda c, r, req: Answer(b"HTTP/1.1 200 OK\r\n", then="hang")) as srv:
        assert asyncio.run(go(True)).rule == "probe.unreachable"  # no complete head yet


def test_https_is_verified_against_the_given_authority(tmp_path: Path) -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def go(tls: ssl.SSLContext, url: str) -> list[tuple[int, bytes]]:
        async with TeacherWire(url, tls=tls, max_idle=2) as wire:
            return [await post(wire), await post(wire)]

    with serving(lambda c, r, req: Answer(ok()), tls=server_tls) as srv:
        trusted = teacher_tls_context(ca_file)
        assert asyncio.run(go(trusted, srv.url("https"))) == [(200, b'{"ok":true}')] * 2
        assert srv.seen.connections == 1
        with pytest.raises(ProbeFailed) as info:
            asyncio.run(go(ssl.create_default_context(), srv.url("https")))
        assert info.value.rule == "probe.unreachable"
        assert "teacher_ca_file" in (info.value.hint or "")


def test_the_bearer_value_is_sent_and_never_echoed() -> None:
    reflected = ok(SECRET.encode() * 3, status="401 Unauthorized")
    with serving(lambda c, r, req: Answer(reflected)) as srv:

        async def go() -> str:
            async with TeacherWire(srv.url(), tls=None, max_idle=1) as wire:
                answer = await wire.exchange(PAYLOAD, secret=EnvSecret(), timeout_s=5, limit=4096)
            assert answer.authenticated and answer.status == 401
            failure = status_failure(answer, "scoring request")
            return f"{failure} {failure!r} {answer!r:.0}"

        text = asyncio.run(go())
    assert f"authorization: Bearer {SECRET}".encode() in srv.seen.requests[0]
    assert SECRET not in text
    assert "withheld" in text


def test_urls_it_cannot_serve_are_refused_at_construction() -> None:
    for url in ("ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "http:///x"):
        with pytest.raises(ValueError):
            TeacherWire(url, tls=None, max_idle=1)
    with pytest.raises(ValueError, match="TLS context"):
        TeacherWire("https://127.0.0.1/x", tls=None, max_idle=1)
