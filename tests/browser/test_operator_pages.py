"""The pages as an operator meets them (issue 30, items 6, 8 and 9), in headless Chromium.

``/ui``: the token prompt is a sentence naming the real `kiln tokens create`
command; the header shows the registry's version and its live job workers; the
jobs table shows kind and K; a click anywhere on a teacher row selects it; every
time is UTC and labelled so.  A registry without a live worker says so in the
header and under its queued job.  ``/docs`` without a token says in one line why
it is empty and how to get a token; ``[server] public_docs = true`` renders the
schema without one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import expect

from kiln_registry.jobs.core.liveness import NO_WORKER
from kiln_registry.testing.tiny_models import TinyModel
from kiln_registry.version import package_version
from tests.api.support import run_registry, write_config
from tests.browser.conftest import ALIAS, MODEL_ID, Live, PageLog, csp_violations, enter_token

CREATE = "kiln tokens create --config kiln.toml --name NAME --scope read"
UTC_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")


def test_dashboard_header_prompt_rows_and_times(
    live: Live, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    tab, log = page
    tab.goto(live.url + "/ui")
    tab.locator("#token-form").wait_for(state="visible")
    assert tab.locator("#token-reason").inner_text() == (
        f"This registry needs an API token with the read scope. Create one with {CREATE}"
        " on the registry's host, then paste it below."
    )
    assert tab.locator("#token-reason code").inner_text() == CREATE
    enter_token(tab, live.token)
    expect(tab.locator("#version")).to_have_text("v" + package_version(), timeout=30_000)
    expect(tab.locator("#workers")).to_have_text("1 job worker live")
    expect(tab.locator("#state")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d UTC$"))
    headings = tab.locator("th").all_inner_texts()
    assert {"Last probe (UTC)", "When (UTC)", "Updated (UTC)", "Kind", "K"} <= set(headings)

    row = tab.locator("#teachers tbody tr", has=tab.locator(f"button:text-is('{ALIAS}')"))
    expect(row.locator("td").nth(6)).to_have_text("passed", timeout=30_000)
    assert UTC_TIME.match(row.locator("td").nth(5).inner_text().strip())
    row.locator("td").nth(7).click()  # the notes cell, not the alias button
    expect(tab.locator("#receipts-alias")).to_have_text("of " + ALIAS, timeout=30_000)
    expect(row).to_have_class(re.compile(r"\bselected\b"))
    when = tab.locator("#receipts tbody tr").first.locator("td").nth(1)
    expect(when).to_have_text(UTC_TIME)

    with live.api() as http:
        body = {"kind": "teacher_scoring", "teacher": ALIAS, "top_k": 3, "sequences": [[4, 5]]}
        job = http.post("/v1/jobs", json=body).json()
    job_row = tab.locator(f"#jobs tbody tr[data-job='{job['id']}'][data-status='succeeded']")
    job_row.wait_for(timeout=60_000)
    cells = [c.strip() for c in job_row.locator("td").all_inner_texts()]
    assert cells[2:4] == ["scoring", "3"] and UTC_TIME.match(cells[-1]), cells
    refreshes = [h for url, h in log.requests if url.startswith(live.url + "/v1/")]
    assert refreshes and all(h.get("x-kiln-refresh") == "1" for h in refreshes)
    tab.screenshot(path=str(tmp_path / "operator.png"), full_page=True)
    assert log.problems == [] and csp_violations(tab) == []


def test_no_live_worker_shows_in_the_header_and_under_the_queued_job(
    live: Live, tiny_model: TinyModel, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    config = write_config(tmp_path, student=tiny_model.path, server={"auth": "off"})
    with config.open("a", encoding="utf-8") as toml:
        toml.write("\n[jobs]\nembedded_workers = false\n")
    tab, log = page
    with (
        run_registry(config) as registry,
        httpx.Client(base_url=registry.url, timeout=60, trust_env=False) as http,
    ):
        body = {"alias": "t", "kind": "remote", "provider": "vllm", "model_id": MODEL_ID,
                "url": live.teacher_url}  # fmt: skip
        assert http.post("/v1/teachers", json=body).status_code == 200
        job = {"kind": "teacher_scoring", "teacher": "t", "top_k": 2, "sequences": [[1, 2]]}
        job_id = http.post("/v1/jobs", json=job).json()["id"]
        tab.goto(registry.url + "/ui")
        header = tab.locator("#workers")
        expect(header).to_have_text("no live job worker (1 queued): start `kiln worker`")
        expect(header).to_have_class(re.compile(r"\bnone\b"))
        waiting = tab.locator(f"#jobs tbody tr[data-job='{job_id}'] small.waiting")
        expect(waiting).to_have_text(NO_WORKER)
        tab.screenshot(path=str(tmp_path / "no-worker.png"), full_page=True)
    assert log.messages == [] and csp_violations(tab) == []


def test_docs_without_a_token_say_why_in_one_line(live: Live, page: tuple[Any, PageLog]) -> None:
    tab, log = page
    tab.goto(live.url + "/docs")
    reason = tab.locator("#token-reason")
    expect(reason).to_contain_text("kiln tokens create", timeout=30_000)
    text = reason.inner_text()
    assert "\n" not in text.strip() and text == (
        "The API reference is empty because this registry's schema needs an API token with"
        f" the read scope: create one with {CREATE} and paste it below (or set"
        " [server] public_docs = true to publish the schema)."
    )
    assert tab.locator(".swagger-ui .opblock").count() == 0
    enter_token(tab, live.reader)
    tab.locator(".swagger-ui .opblock").first.wait_for()
    assert tab.locator("#token-form").is_hidden()
    assert log.problems == [] and csp_violations(tab) == []


def test_public_docs_render_the_schema_without_a_token(
    tiny_model: TinyModel, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    tab, log = page
    server = {"auth": "required", "public_docs": True}
    config = write_config(tmp_path, student=tiny_model.path, server=server)
    with run_registry(config) as registry:
        tab.goto(registry.url + "/docs")
        tab.locator(".swagger-ui .opblock").first.wait_for()
        assert tab.locator(".opblock-summary-operation-id:text-is('listTeachers')").count() == 1
        assert tab.locator("#token-form").is_hidden()
    assert log.messages == [] and csp_violations(tab) == []
