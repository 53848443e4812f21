"""``/docs`` in headless Chromium: Swagger UI from the package, the token, "Try it out".

The registry needs a token (``auth = "required"``): the page asks for one,
loads ``/openapi.json`` with it, renders every operation, and "Try it out" on
``GET /v1/teachers`` sends ``Authorization: Bearer`` and shows the live list.
Every request the page makes stays on the registry's origin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import run_registry, write_config
from tests.browser.conftest import ALIAS, Live, PageLog, csp_violations, enter_token

OPERATIONS = ("listTeachers", "registerTeacher", "getTeacher", "listTeacherReceipts",
              "submitJob", "listJobs", "getJob", "health")  # fmt: skip


def test_docs_render_every_operation_and_try_it_out_lists_the_teachers(
    live: Live, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    tab, log = page
    tab.goto(live.url + "/docs")
    enter_token(tab, live.reader)
    tab.locator(".swagger-ui .opblock").first.wait_for()
    for operation in OPERATIONS:
        assert tab.locator(f".opblock-summary-operation-id:text-is('{operation}')").count() == 1
    assert tab.locator(".swagger-ui .btn.authorize").count() == 1

    block = tab.locator(".opblock-get", has=tab.locator("text='listTeachers'")).first
    block.locator(".opblock-summary").click()
    block.locator("button.try-out__btn").click()
    block.locator("button.execute").click()
    body = block.locator(".live-responses-table .response-col_description pre").first
    body.wait_for()
    listed = json.loads(body.inner_text())
    assert [t["spec"]["alias"] for t in listed["teachers"]] == [ALIAS]
    status = block.locator(".live-responses-table tr.response .response-col_status").first
    assert status.inner_text() == "200"
    tab.screenshot(path=str(tmp_path / "docs.png"), full_page=False)

    sent = [h for url, h in log.requests if url.startswith(live.url + "/v1/teachers")]
    assert sent and all(h.get("authorization") == f"Bearer {live.reader}" for h in sent)
    assert all(url.startswith(live.url + "/") for url, _ in log.requests), log.requests
    assert log.problems == [] and csp_violations(tab) == []


def test_with_auth_off_the_pages_ask_for_no_token(
    tiny_model: TinyModel, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    tab, log = page
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "off"})
    with run_registry(config) as registry:
        tab.goto(registry.url + "/docs")
        tab.locator(".swagger-ui .opblock").first.wait_for()
        assert tab.locator("#token-form").is_hidden()
        tab.goto(registry.url + "/ui")
        expect(tab.locator("#teachers tbody td.empty")).to_have_text("no teachers registered")
        expect(tab.locator("#jobs tbody td.empty")).to_have_text("no jobs")
        assert tab.locator("#token-form").is_hidden() and tab.locator("#forget").is_hidden()
    assert log.messages == [] and csp_violations(tab) == []
