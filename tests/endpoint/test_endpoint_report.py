"""A ``read`` token is all the endpoint needs: its report of a changed teacher makes the
registry re-probe by itself (``POST /v1/teachers/<alias>/report``), which marks the alias
unavailable and audits ``teacher.report``; a ``read`` token cannot ``/probe``.

The registry runs with ``[server] auth = "required"``; the teacher is a real wrapper
server flipped to another identity (``tests.endpoint.support.Switch``); all on loopback.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kiln_registry.identity.document import TeacherIdentity
from kiln_registry.reference_teacher.app import create_reference_app
from kiln_registry.reference_teacher.identity import load_reference_teacher
from kiln_registry.reference_teacher.model import ReferenceTeacher
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.conftest import SERVED
from tests.api.support import remote, run_registry, write_config
from tests.auth.support import bearer, create_token
from tests.endpoint.conftest import ALIAS
from tests.endpoint.support import EndpointProcess, Switch, tokens
from tests.helpers import serve_app

DEADLINE_S = 60.0


def test_a_read_token_reports_a_changed_teacher_and_the_registry_reprobes(
    reference: tuple[ReferenceTeacher, TeacherIdentity], tiny_model: TinyModel, tmp_path: Path
) -> None:
    other, _ = load_reference_teacher(
        tiny_model.path, served_model_id=SERVED, max_top_k=7, max_model_len=64
    )
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    database = tmp_path / "registry.db"
    read, register, admin = (create_token(database, s, {s}) for s in ("read", "register", "admin"))
    switch = Switch(create_reference_app(reference[0], api_key_env=None),
                    create_reference_app(other, api_key_env=None))  # fmt: skip
    with serve_app(switch) as url, run_registry(config) as registry, registry.client() as api:
        created = api.post("/v1/teachers", json=remote(ALIAS, url), headers=bearer(register))
        assert created.status_code == 200, created.text
        probe = api.post(f"/v1/teachers/{ALIAS}/probe", headers=bearer(read))
        assert probe.status_code in (401, 403)  # the read token cannot re-probe at will
        log = tmp_path / "endpoint.log"
        with EndpointProcess(ALIAS, registry.url, log, env={"KILN_TOKEN": read}) as endpoint:
            endpoint.wait_ready()
            switch.flip()
            with endpoint.client() as http:
                body = {"model": SERVED, "prompt": tokens(10), "max_tokens": 1,
                        "prompt_logprobs": 4}  # fmt: skip
                assert http.post("/v1/completions", json=body).status_code == 502
            deadline = time.monotonic() + DEADLINE_S
            while api.get(f"/v1/teachers/{ALIAS}", headers=bearer(read)).json()["usable"]:
                assert time.monotonic() < deadline, endpoint.output()
                time.sleep(0.2)
        events = api.get("/v1/audit", headers=bearer(admin)).json()["events"]
        reports = [e for e in events if e["action"] == "teacher.report"]
        assert [(e["token"], e["target"]) for e in reports] == [("read", ALIAS)]


@pytest.mark.parametrize("scope", ["read"])
def test_the_report_route_needs_only_read(scope: str) -> None:
    from kiln_registry.auth.scopes import audit_action, required_scope

    path = f"/v1/teachers/{ALIAS}/report"
    assert required_scope("POST", path) == scope
    assert audit_action("POST", path) == ("teacher.report", ALIAS)
