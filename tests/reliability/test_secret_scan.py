"""Secret-leak scan: planted secrets must appear nowhere the registry or launcher writes.

Every credential variable of a real ``kiln serve`` subprocess (debug logging)
holds its own distinctive secret, and the TLS reference teacher's API key is
one of them.  The test registers (success, wrong key, a teacher echoing the
Authorization header in a 500 body, a teacher reflecting the key into the
``model`` field of a 200, an origin mismatch, a teacher that is down, secrets
pasted into request fields), re-probes, runs a scoring job against the
credentialed teacher, reads receipts, the job, its result and metrics, then
scans every response (status, headers, body), every log line (tracebacks
included), the database file and its ``-wal``/``-shm`` and the job's result
files for each secret in its raw, base64 (every alignment, both alphabets),
URL-encoded and JSON-escaped forms, and for any 16-character piece of it.  Zero hits.

``kiln-teacher --dry-run`` and its error paths get the same scan of their
stdout and stderr with the key given as ``--api-key``.

``test_reflected_key_forms`` has a teacher reflect the key into the
``model`` field of a 200 answer in every form (raw, after ``Bearer``, as a
prefix cut by an 80-character quote, base64, URL-encoded).  Redaction alone
only catches the raw value; the probe must not quote response text of an
authenticated request at all (the gap this test exposed, closed since).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kiln_registry.domain.vocabulary import TERMINAL_JOB_STATUSES
from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.launcher.vllm_command import vllm_build
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import (  # noqa: F401  (session fixtures)
    KEY_ENV,
    TlsFiles,
    TlsTeacher,
    reference,
    tls_files,
    tls_teacher,
)
from tests.api.support import (
    CLEAN_EXIT,
    ServerProcess,
    remote,
    run_registry,
    serve_tls,
    write_config,
)
from tests.backend import is_postgres, rows_text
from tests.helpers import free_port
from tests.launcher.test_cli_manifest import TEACHER_INPUT
from tests.reliability import faulty_teachers as ft

Reference = tuple[ReferenceTeacher, TeacherIdentity]
WINDOW = 16
JOB_SEQUENCES = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
JOB_WAIT_S = 60.0
JOB = {"kind": "teacher_scoring", "teacher": "ok", "top_k": 4, "sequences": JOB_SEQUENCES}
# KEY_ENV is also the TLS reference teacher's own key (it reads the variable in this process).
SECRETS = {
    KEY_ENV: "sk-R10ok/Wq7+Zr=Hx9!Lm2~Pd4#Tf8$Ab",
    "KILN_R10_KEY_WRONG": "sk-R10wrong/Bv5+Kc=Nj8!Qs3~Ug6#Ye1",
    "KILN_R10_KEY_ECHO": "sk-R10echo/Dn4+Gh=Rt7!Vx2~Yb5#Ck9",
    "KILN_R10_KEY_REFLECT": "sk-R10refl/Jm3+Lp=Sw6!Zc1~Eh8#Fn2",
    "KILN_R10_KEY_DOWN": "sk-R10down/Kq9+Mu=Ta4!Wd7~Xg3#Hj6",
    "KILN_R10_KEY_UNUSED": "sk-R10unus/Nr2+Py=Ub5!Ye8~Zf1#Gk4",
}
LAUNCH_SECRET = "sk-R10launch/Qs6+Tv=Xa9!Bd2~Ef5#Hj8"
pytestmark = pytest.mark.secret_env(*SECRETS)


def _b64_cores(data: bytes) -> Iterator[str]:
    """The base64 text that ``data`` yields at any offset inside a larger encoded blob."""
    for skip in range(3):
        part = data[skip:]
        whole = len(part) - len(part) % 3
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            core = encode(part[:whole]).decode()
            if len(core) >= WINDOW:
                yield core


def needles(secret: str) -> dict[str, str]:
    """Every form of ``secret`` the scan looks for, keyed by a description."""
    forms = {"raw": secret, "url": urllib.parse.quote(secret, safe=""),
             "url+": urllib.parse.quote_plus(secret), "json": json.dumps(secret)[1:-1]}  # fmt: skip
    for prefix in ("", "Bearer "):
        for n, core in enumerate(_b64_cores((prefix + secret).encode())):
            forms[f"base64[{prefix.strip() or 'key'}:{n}]"] = core
    for start in range(len(secret) - WINDOW + 1):
        forms[f"piece[{start}]"] = secret[start : start + WINDOW]
    return forms


def scan(texts: Iterable[tuple[str, str]], secrets: Iterable[str]) -> list[str]:
    """``where: form of secret #i`` for every hit."""
    found: list[str] = []
    table = [
        (i, form, needle) for i, s in enumerate(secrets) for form, needle in needles(s).items()
    ]
    for where, text in texts:
        found += [f"{where}: {form} of secret #{i}" for i, form, needle in table if needle in text]
    return found


def _response_text(response: httpx.Response) -> str:
    head = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    return f"{response.status_code} {response.reason_phrase}\n{head}\n\n{response.text}"


def _database_texts(directory: Path) -> list[tuple[str, str]]:
    """SQLite's files as bytes; under PostgreSQL, every row of the registry's database."""
    texts = [(p.name, p.read_bytes().decode("latin-1")) for p in sorted(directory.glob("*.db*"))]
    if is_postgres():
        texts.append(("database rows", rows_text(directory / "registry.db")))
    return texts


@dataclass(frozen=True)
class Hostile:
    echo: ft.ScriptedTeacher
    echo_origin: str
    mirror: ft.ScriptedTeacher
    mirror_origin: str
    down_origin: str


@contextmanager
def _hostile_teachers(ref: Reference, tls: TlsFiles) -> Iterator[Hostile]:
    """TLS teachers for ``localhost``: one echoing, one reflecting; plus a closed port."""
    echo = ft.ScriptedTeacher(ref[1], reflect="error")
    mirror = ft.ScriptedTeacher(ref[1], reflect="model")
    with ExitStack() as stack:
        echo_port = stack.enter_context(serve_tls(ft.asgi_teacher(echo), tls.cert_pem))
        mirror_port = stack.enter_context(serve_tls(ft.asgi_teacher(mirror), tls.cert_pem))
        origin = "https://localhost:{}".format
        yield Hostile(echo, origin(echo_port), mirror, origin(mirror_port), origin(free_port()))


def _credentials(tls_origin: str, hostile: Hostile) -> dict[str, tuple[str, str]]:
    return {
        "ok": (tls_origin, KEY_ENV),
        "wrong": (tls_origin, "KILN_R10_KEY_WRONG"),
        "echo": (hostile.echo_origin, "KILN_R10_KEY_ECHO"),
        "mirror": (hostile.mirror_origin, "KILN_R10_KEY_REFLECT"),
        "down": (hostile.down_origin, "KILN_R10_KEY_DOWN"),
        "unused": ("https://unused.example", "KILN_R10_KEY_UNUSED"),
    }


def _requests(tls: str, hostile: Hostile) -> list[tuple[str, str, object]]:
    secret = SECRETS[KEY_ENV]
    echo, mirror, down = hostile.echo_origin, hostile.mirror_origin, hostile.down_origin
    quoted = urllib.parse.quote(secret, safe="")
    return [
        ("POST", "/v1/teachers", remote("ok", tls + "/v1", credential_id="ok")),
        ("POST", "/v1/teachers/ok/probe", None),
        ("POST", "/v1/jobs", JOB),
        ("GET", "/v1/teachers/ok", None),
        ("POST", "/v1/teachers", remote("wrong-key", tls + "/v1", credential_id="wrong")),
        ("POST", "/v1/teachers", remote("echo", echo, credential_id="echo")),
        ("POST", "/v1/teachers", remote("mirror", mirror, credential_id="mirror")),
        ("POST", "/v1/teachers", remote("mismatch", echo, credential_id="ok")),
        ("POST", "/v1/teachers", remote("down", down, credential_id="down")),
        ("POST", "/v1/teachers", remote("pasted", tls + "/v1") | {"api_key_env": secret}),
        ("POST", "/v1/teachers", remote("userinfo", tls.replace("//", f"//u:{quoted}@"))),
        ("POST", "/v1/teachers", remote("query", f"{tls}/v1?api_key={secret}")),
        ("POST", "/v1/teachers", remote("bad alias " + secret, tls + "/v1")),
        ("POST", "/v1/teachers", remote("x", tls + "/v1", credential_id=secret)),
        *[
            ("GET", f"/v1/teachers/{a}/receipts", None)
            for a in ("ok", "wrong-key", "echo", "mirror", "down")
        ],
        ("GET", "/v1/teachers", None),
        ("GET", "/metrics", None),
    ]


def _serve_and_record(
    tmp_path: Path, config: Path, requests: list[tuple[str, str, object]]
) -> tuple[list[httpx.Response], str]:
    with ServerProcess(config, tmp_path / "server.log", env=SECRETS) as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as http:
            responses = [http.request(m, path, json=body) for m, path, body in requests]
            responses += _job_responses(http, requests, responses)
        assert server.stop() in CLEAN_EXIT
        return responses, server.output()


def _job_responses(
    http: httpx.Client, requests: list[tuple[str, str, object]], responses: list[httpx.Response]
) -> list[httpx.Response]:
    """Wait for the submitted job (scored by the credentialed teacher); its status and result."""
    submitted = responses[[path for _, path, _ in requests].index("/v1/jobs")]
    assert submitted.status_code in (200, 201, 202), submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + JOB_WAIT_S
    while (job := http.get(f"/v1/jobs/{job_id}")).json()["status"] not in TERMINAL_JOB_STATUSES:
        assert time.monotonic() < deadline, job.text
        time.sleep(0.05)
    assert job.json()["status"] == "succeeded", job.text
    return [job, http.get(f"/v1/jobs/{job_id}/result"), http.get("/v1/jobs")]


@pytest.mark.slow
def test_planted_secrets_leak_nowhere_in_the_registry(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference: Reference,  # noqa: F811
    tls_teacher: TlsTeacher,  # noqa: F811
    tls_files: TlsFiles,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRETS[KEY_ENV])  # the reference teacher's own key
    with _hostile_teachers(reference, tls_files) as hostile:
        server = {"log_level": "debug", "teacher_ca_file": tls_files.ca_pem}
        credentials = _credentials(tls_teacher.origin, hostile)
        config = write_config(tmp_path, student=tiny_model.path, server=server,
                              credentials=credentials)  # fmt: skip
        with config.open("a", encoding="utf-8") as out:
            out.write(f'\n[jobs]\nresult_root = "{tmp_path / "results"}"\n')
        requests = _requests(tls_teacher.origin, hostile)
        responses, log = _serve_and_record(tmp_path, config, requests)
    statuses = [r.status_code for r in responses]
    assert statuses[:3] == [200, 200, 201], [r.text for r in responses[:3]]
    assert all(s < 500 or s == 502 for s in statuses), statuses
    # The secrets really were in flight: the hostile teachers received them.
    assert hostile.echo.authorizations and hostile.mirror.authorizations
    assert "DEBUG" in log and "/v1/teachers" in log
    labels = [f"{m} {p}" for m, p, _ in requests] + ["job", "job result", "job list"]
    texts = [(f"response {i} {label}", _response_text(r))
             for i, (label, r) in enumerate(zip(labels, responses, strict=True))]  # fmt: skip
    texts += [(f"log line {n}", line) for n, line in enumerate(log.splitlines(), 1)]
    texts += _database_texts(tmp_path)
    texts += [(p.name, p.read_bytes().decode("latin-1")) for p in (tmp_path / "results").iterdir()]
    hits = scan(texts, SECRETS.values())
    assert hits == [], hits
    print(f"secret scan: {len(texts)} texts, {len(SECRETS)} secrets, {len(hits)} hits")


@pytest.mark.parametrize("form", sorted(ft.REFLECTIONS))
def test_reflected_key_forms(
    tmp_path: Path,
    tiny_model: TinyModel,
    reference: Reference,  # noqa: F811
    tls_files: TlsFiles,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    form: str,
) -> None:
    secret = SECRETS["KILN_R10_KEY_REFLECT"]
    monkeypatch.setenv("KILN_R10_KEY_REFLECT", secret)
    mirror = ft.ScriptedTeacher(reference[1], reflect="model")
    with serve_tls(ft.asgi_teacher(mirror), tls_files.cert_pem) as port:
        origin = f"https://localhost:{port}"
        config = write_config(tmp_path, student=tiny_model.path,
                              server={"teacher_ca_file": tls_files.ca_pem},
                              credentials={"mirror": (origin, "KILN_R10_KEY_REFLECT")})  # fmt: skip
        with run_registry(config) as registry, registry.client() as http:
            body = remote("mirror", origin, model_id=f"reflect-{form}", credential_id="mirror")
            response = http.post("/v1/teachers", json=body)
    assert response.status_code == 502 and "probe.model" in response.text, response.text
    assert mirror.authorizations == [f"Bearer {secret}"]
    texts = [("response", _response_text(response)), *_database_texts(tmp_path)]
    assert scan(texts, [secret]) == [], response.text
    # the probe no longer quotes an authenticated answer, nor the API any answer (issue 27)
    assert "not shown to the caller" in response.text


KILN_TEACHER = Path(sys.executable).with_name("kiln-teacher")
LAUNCH_LIMITS = ["--served-model-id=teacher-large", "--max-top-k=32", "--max-model-len=32768"]


def _launcher_cases(tmp_path: Path, model: Path) -> list[tuple[list[str], dict[str, str], int]]:
    """(argv, extra environment, expected exit status) for the dry run and its error paths."""
    identity = tmp_path / "teacher-input.json"
    identity.write_text(json.dumps(TEACHER_INPUT), encoding="utf-8")
    ident = [f"--identity-input={identity}", *LAUNCH_LIMITS]
    base = [*ident, "--model-path=/models/teacher"]
    key = LAUNCH_SECRET
    dry = [*base, "--dry-run", "--", "--host=127.0.0.1", "--port=8001"]
    real = [f"--model-path={model}", *LAUNCH_LIMITS]
    return [
        ([*dry, f"--api-key={key}"], {}, 0),
        ([*dry, "--api-key", key], {}, 2),  # the two-token form is refused
        ([*ident, "--manifest-only", "--", f"--api-key={key}"], {}, 0),
        ([*dry, f"--api-key={key}", f"--api-key={key}"], {}, 2),
        ([*dry, f"--api-key={key}", "--no-such-option"], {}, 2),
        ([*dry, f"--api-key={key}", "--port=not-a-port"], {}, 2),
        ([*dry, f"--api_key={key}"], {}, 2),
        ([*dry, f"--api-key={key}", f"--served-model-name={key}"], {}, 2),
        ([*base, f"--api-key={key}", "--dry-run"], {}, 2),
        (dry, {"VLLM_API_KEY": key}, 2),
        ([*dry, f"--api-key={key}"], {"HF_TOKEN": key}, 2),
        # A real model path hashes the installed runtime: with vLLM the dry run
        # succeeds (key redacted); without it, the error names the package.
        ([*real, "--dry-run", "--", f"--api-key={key}"], {}, 0 if vllm_build() else 2),
    ]


def test_launcher_dry_run_and_error_paths_never_print_the_key(
    tmp_path: Path, tiny_model: TinyModel, python_without_vllm: Path
) -> None:
    outputs: list[tuple[str, str]] = []
    statuses: list[int] = []
    expected_statuses: list[int] = []
    cases = [
        (argv, extra, expected, [str(KILN_TEACHER)])
        for argv, extra, expected in _launcher_cases(tmp_path, tiny_model.path)
    ]
    real = [
        f"--model-path={tiny_model.path}",
        *LAUNCH_LIMITS,
        "--dry-run",
        "--",
        f"--api-key={LAUNCH_SECRET}",
    ]
    cases.append((real, {}, 2, [str(python_without_vllm), "-m", "kiln_registry.launcher"]))
    for n, (argv, extra, expected, command) in enumerate(cases):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **extra}
        done = subprocess.run([*command, *argv], env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        statuses.append(done.returncode)
        outputs += [(f"case {n} stdout", done.stdout), (f"case {n} stderr", done.stderr)]
        expected_statuses.append(expected)
    assert statuses == expected_statuses, outputs
    # The gateway (on by default) holds the key: vLLM's argv has none, redacted or not.
    assert "checked by the gateway (from --api-key)" in outputs[0][1]
    assert "--api-key=" not in outputs[0][1]
    hits = scan(outputs, [LAUNCH_SECRET])
    assert hits == [], hits
    print(f"launcher scan: {len(statuses)} runs, {len(hits)} hits")
