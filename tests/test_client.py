"""RegistryClient against a real registry and a real reference teacher on loopback.

The registry runs in-process under uvicorn (lifespan on, so its outbound
client exists) with a real SQLite file; the teacher is the reference teacher
on the session's tiny model.  Odd wire shapes (redirects, bodies that are not
envelopes, oversized bodies) come from ``tests/probe/teacher_server.py``, a
real loopback server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kiln_registry.client.sync import RegistryClient, RegistryClientError
from kiln_registry.domain.errors import InputError
from kiln_registry.testing.tiny_models import TinyModel
from kiln_registry.wire.teachers import TeacherStatus
from tests.helpers import free_port, serve_reference_teacher
from tests.probe.teacher_server import Reply, Request, TeacherServer

SERVED = "teacher-tiny"


@contextmanager
def serve_registry(tmp: Path, student: Path) -> Iterator[str]:
    """``kiln serve``'s app on a free loopback port, in a thread, lifespan on."""
    import uvicorn

    from kiln_registry.api.app import create_app
    from kiln_registry.config.loader import load_config
    from kiln_registry.reference_teacher.app import bind_socket
    from kiln_registry.serve.startup import build_context

    config_path = tmp / "kiln.toml"
    config_path.write_text(
        f'[server]\ndatabase = "{tmp / "registry.db"}"\n[student]\nmodel_path = "{student}"\n',
        encoding="utf-8",
    )
    app = create_app(build_context(load_config(config_path)))
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "registry did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


@pytest.fixture(scope="module")
def teacher_url(tiny_model: TinyModel) -> Iterator[str]:
    with serve_reference_teacher(tiny_model.path, SERVED) as url:
        yield url


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[str]:
    with serve_registry(tmp_path_factory.mktemp("registry"), tiny_model.path) as url:
        yield url


@pytest.fixture
def client(registry_url: str) -> Iterator[RegistryClient]:
    with RegistryClient(registry_url, timeout=30) as c:
        yield c


def test_health_and_ready(client: RegistryClient) -> None:
    assert client.health().status == "ok"
    assert client.ready().status == "ready"


def test_register_show_probe_receipts_delete(client: RegistryClient, teacher_url: str) -> None:
    entry = client.register_teacher(
        alias="tiny@ref", kind="remote", provider="vllm", model_id=SERVED, url=teacher_url
    )
    assert entry.status is TeacherStatus.verified and entry.usable
    assert entry.spec.identity is not None and entry.spec.identity.served_model_id == SERVED
    assert entry.off_policy_manifest is not None
    assert client.get_teacher("tiny@ref") == entry
    assert "tiny@ref" in [e.spec.alias for e in client.list_teachers()]
    report = client.probe_teacher("tiny@ref")
    assert report.outcome == "passed" and report.k_values == [1, 8, 9]
    receipts = client.receipts("tiny@ref")
    assert [r.outcome for r in receipts] == ["passed", "passed"]
    assert client.delete_teacher("tiny@ref").alias == "tiny@ref"
    with pytest.raises(RegistryClientError) as info:
        client.get_teacher("tiny@ref")
    assert (info.value.status, info.value.code) == (404, "teacher_not_found")


def test_envelope_errors_carry_status_code_and_hint(client: RegistryClient) -> None:
    client.register_teacher(alias="fixture-1", kind="fixture", model_id="m")
    with pytest.raises(RegistryClientError) as info:
        client.register_teacher(alias="fixture-1", kind="fixture", model_id="m")
    err = info.value
    assert (err.status, err.code) == (409, "teacher_alias_exists")
    assert err.hint and "delete" in err.hint
    assert "teacher_alias_exists" in err.one_line()
    with pytest.raises(RegistryClientError) as info:
        client.register_teacher(alias="x", kind="remote", provider="openai", model_id="m", url="u")
    assert (info.value.status, info.value.code) == (400, "teacher_registration_invalid")
    assert "provider" in (info.value.server_message or "")


def test_unreachable_registry() -> None:
    with (
        RegistryClient(f"http://127.0.0.1:{free_port()}", timeout=5) as c,
        pytest.raises(RegistryClientError) as info,
    ):
        c.health()
    assert (info.value.status, info.value.code, info.value.rule) == (
        503,
        "registry_unreachable",
        "client.connect",
    )


def test_environment_proxies_are_ignored_unless_asked(
    registry_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    with RegistryClient(registry_url) as c:
        assert c.health().status == "ok"
    with (
        RegistryClient(registry_url, trust_env=True, timeout=5) as c,
        pytest.raises(RegistryClientError) as info,
    ):
        c.health()
    assert info.value.code == "registry_unreachable"


def _serve(reply: Reply) -> TeacherServer:
    return TeacherServer(lambda request, index: reply)


def _client(srv: TeacherServer, max_response_bytes: int = 1 << 20) -> RegistryClient:
    return RegistryClient(f"http://127.0.0.1:{srv.port}", max_response_bytes=max_response_bytes)


def test_redirect_is_not_followed() -> None:
    with _serve(Reply(307, b"", {"location": "http://127.0.0.1:9/elsewhere"})) as srv:
        with _client(srv) as c, pytest.raises(RegistryClientError) as info:
            c.list_teachers()
        assert len(srv.requests) == 1
    assert (info.value.code, info.value.rule) == ("registry_redirect", "client.redirect")


def test_error_without_envelope_is_excerpted() -> None:
    body = b"<html>\x1b[31mBad gateway</html>" + b"x" * 5000
    with (
        _serve(Reply(502, body, {"content-type": "text/html"})) as srv,
        _client(srv) as c,
        pytest.raises(RegistryClientError) as info,
    ):
        c.list_teachers()
    err = info.value
    assert (err.status, err.code) == (502, "http_error")
    assert "\x1b" not in str(err) and "Bad gateway" in str(err) and len(str(err)) < 400


def test_body_that_is_not_the_schema_is_refused() -> None:
    with (
        _serve(Reply(200, b'{"teachers": [{"alias": "x"}]}')) as srv,
        _client(srv) as c,
        pytest.raises(RegistryClientError) as info,
    ):
        c.list_teachers()
    assert info.value.code == "registry_response_invalid"
    assert "TeachersListResponse" in str(info.value) and "teachers.0.spec" in str(info.value)


@pytest.mark.parametrize("mode", ["stream", "claim"])
def test_oversized_body_is_refused_at_the_bound(mode: str) -> None:
    with _serve(Reply(200, mode=mode, length=8 * 1024 * 1024)) as srv:
        with (
            _client(srv, max_response_bytes=65536) as c,
            pytest.raises(RegistryClientError) as info,
        ):
            c.list_teachers()
        assert srv.bytes_sent < 8 * 1024 * 1024
    assert info.value.rule == "client.response" and "65536" in str(info.value)


def test_alias_is_one_encoded_path_segment() -> None:
    seen: list[Request] = []

    def handler(request: Request, index: int) -> Reply:
        seen.append(request)
        return Reply(404, b'{"error":{"code":"teacher_not_found","message":"no","hint":null}}')

    with TeacherServer(handler) as srv, _client(srv) as c, pytest.raises(RegistryClientError):
        c.delete_teacher("a/b?c#d")
    assert seen[0].method == "DELETE" and seen[0].path == "/v1/teachers/a%2Fb%3Fc%23d"
    with pytest.raises(InputError, match=r"client\.alias"):
        RegistryClient("http://127.0.0.1:1").get_teacher("bad\nalias")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1:8420",
        "http://user:s3cret-value@127.0.0.1:8420",
        "http://127.0.0.1:8420/?token=s3cret-value",
        "http://127.0.0.1:8420/#s3cret-value",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:8420/ x",
        "127.0.0.1:8420",
    ],
)
def test_bad_server_urls_are_refused_without_echo(url: str) -> None:
    with pytest.raises(InputError) as info:
        RegistryClient(url)
    assert info.value.rule == "client.server_url"
    assert "s3cret-value" not in str(info.value)
