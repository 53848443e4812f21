"""Issue 15: a state-changing request whose handler crashed is still one audit row.

The registry runs for real (uvicorn in a thread, ``auth = "required"``, an
admin token); a test-only route raises, because no registry route can be made
to crash for real without a bug.  The client gets the 500 envelope (uvicorn
then closes that connection), the audit log gets the token name, the action
and outcome ``failed`` with status 500 (the audit table's outcomes are
``ok``/``refused``/``failed``; a crash is a failure), and the traceback
never carries the token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import error_of, run_registry, write_config
from tests.auth.support import bearer, create_token


def _crashing(app: Any) -> None:
    assert isinstance(app, FastAPI)

    @app.post("/v1/test-crash")
    async def crash() -> None:
        raise RuntimeError("handler crashed half way")


def test_a_crashed_state_change_is_audited_as_failed(
    tmp_path: Path, tiny_model: TinyModel, caplog: pytest.LogCaptureFixture
) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "required"})
    admin = create_token(tmp_path / "registry.db", "root", {"admin"})
    with run_registry(config, extend=_crashing) as registry:
        with registry.client() as http:
            crashed = http.post("/v1/test-crash", headers=bearer(admin))
            assert crashed.status_code == 500
            assert error_of(crashed)["code"] == "internal_error"
        with registry.client() as http:  # a new connection: uvicorn closes the crashed one
            events = http.get("/v1/audit", headers=bearer(admin)).json()["events"]
    [event] = [e for e in events if e["action"] == "post /v1/test-crash"]
    assert (event["token"], event["outcome"], event["status"]) == ("root", "failed", 500)
    assert admin not in caplog.text and admin not in str(events)
