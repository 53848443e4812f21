"""``/ui`` in headless Chromium: teachers, receipts and a real job whose progress moves on screen.

The registry needs a token; the page asks for it and keeps it in the tab.  The
reference teacher sits behind a ``ScoringGate``, so the test decides when each
scoring request is answered and watches the job row go from ``0 / N`` through
a value between, to ``N / N`` (then a repeat job served from the score cache).
Aliases and notes holding HTML are shown as text: nothing they contain runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import ALIAS, MODEL_ID, Live, PageLog, csp_violations, enter_token

CACHED = [[5, 9, 11, 40], [7, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 11, 40, 41]]
FRESH = [[3, 8 + i, 13, 21] for i in range(6)]
HOSTILE_ALIAS = '<img src=x onerror="window.__xss=1">/<b>bold</b>'
HOSTILE_NOTES = '<script>window.__xss=2</script><i>notes</i> & "quotes"'
SHOWN_DONE = """(id) => {
  const row = document.querySelector(`#jobs tbody tr[data-job="${id}"]`);
  return row ? row.querySelector(".done").textContent.trim() : null;
}"""


def done_shown(tab: Any, job_id: str) -> tuple[int, int] | None:
    text = tab.evaluate(SHOWN_DONE, job_id)
    if text is None:
        return None
    done, _, total = text.partition(" / ")
    return int(done), int(total)


def wait_for_job(tab: Any, job_id: str, status: str, timeout_ms: float = 60_000) -> None:
    tab.wait_for_function(
        "([id, status]) => document.querySelector("
        '`#jobs tbody tr[data-job="${id}"][data-status="${status}"]`) !== null',
        arg=[job_id, status],
        timeout=timeout_ms,
    )


def job_cells(tab: Any, job_id: str) -> list[str]:
    cells: list[str] = tab.locator(f"#jobs tbody tr[data-job='{job_id}'] td").all_inner_texts()
    return [c.strip() for c in cells]


def submit(live: Live, sequences: list[list[int]]) -> str:
    with live.api() as http:
        body = {"kind": "teacher_scoring", "teacher": ALIAS, "top_k": 4, "sequences": sequences}
        answer = http.post("/v1/jobs", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def watch_progress_move(live: Live, tab: Any, job_id: str, total: int) -> int:
    """Let scoring requests through one by one until the page shows 0 < done < total."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    wait_for_job(tab, job_id, "running")
    assert done_shown(tab, job_id) == (0, total)
    for step in range(1, total):
        live.gate.release(1)
        try:
            tab.wait_for_function(
                f"(id) => ({SHOWN_DONE})(id) !== '0 / {total}'", arg=job_id, timeout=5_000
            )
        except PlaywrightTimeout:
            continue  # progress is flushed at most every half second: let one more through
        shown = done_shown(tab, job_id)
        assert shown is not None and 0 < shown[0] <= step < total, shown
        return shown[0]
    pytest.fail("the job's progress never changed on screen before it finished")


def test_dashboard_shows_teachers_receipts_and_a_job_progressing(
    live: Live, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    tab, log = page
    tab.goto(live.url + "/ui")
    # The submitting token: jobs belong to it, and a token sees its own jobs (admin: all).
    enter_token(tab, live.token)
    row = tab.locator("#teachers tbody tr", has=tab.locator(f"button:text-is('{ALIAS}')"))
    expect(row.locator("td").nth(6)).to_have_text("passed", timeout=30_000)
    with live.api() as http:
        entry = http.get(f"/v1/teachers/{ALIAS}").json()
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert cells[:5] == [ALIAS, "remote", "verified", "yes", entry["identity_revision"][7:23]]
    assert cells[7] == "the reference teacher"

    row.locator("button.alias").click()
    expect(tab.locator("#receipts-alias")).to_have_text("of " + ALIAS, timeout=30_000)
    tab.locator("#receipts tbody .badge.passed").first.wait_for()

    warm = submit(live, CACHED)
    wait_for_job(tab, warm, "succeeded")
    assert job_cells(tab, warm)[2:8] == ["scoring", "4", "succeeded", "4 / 4", "4", "0"]

    live.gate.hold()
    job_id = submit(live, FRESH + CACHED)
    total = len(FRESH) + len(CACHED)
    middle = watch_progress_move(live, tab, job_id, total)
    tab.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    live.gate.open()
    wait_for_job(tab, job_id, "succeeded")
    cells = job_cells(tab, job_id)
    assert cells[1:8] == [ALIAS, "scoring", "4", "succeeded", f"{total} / {total}",
                          str(len(FRESH)), "4"]  # fmt: skip
    assert 0 < middle < total
    tab.screenshot(path=str(tmp_path / "dashboard-done.png"), full_page=True)
    assert log.problems == [] and csp_violations(tab) == []


def test_html_in_aliases_and_notes_is_shown_as_text(
    live: Live, page: tuple[Any, PageLog], tmp_path: Path
) -> None:
    with live.api() as http:
        body = {"alias": HOSTILE_ALIAS, "kind": "remote", "provider": "vllm",
                "model_id": MODEL_ID, "url": live.teacher_url, "notes": HOSTILE_NOTES}  # fmt: skip
        answer = http.post("/v1/teachers", json=body)
        assert answer.status_code == 200, answer.text
    tab, log = page
    tab.goto(live.url + "/ui")
    enter_token(tab, live.reader)
    button = tab.get_by_role("button", name=HOSTILE_ALIAS, exact=True)
    button.wait_for()
    row = tab.locator("#teachers tbody tr", has=button)
    assert row.locator("td").nth(7).inner_text().strip() == HOSTILE_NOTES
    button.click()
    expect(tab.locator("#receipts-alias")).to_have_text("of " + HOSTILE_ALIAS, timeout=30_000)
    tab.locator("#receipts tbody .badge.passed").first.wait_for()
    assert tab.locator("main img, main script, main b, main i").count() == 0
    assert tab.evaluate("() => window.__xss") is None
    tab.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
    assert log.problems == [] and csp_violations(tab) == []


def test_the_policy_blocks_injected_markup_that_would_run(
    live: Live, page: tuple[Any, PageLog]
) -> None:
    """Defence in depth: even markup written as HTML could not run a handler or a script."""
    tab, _ = page
    tab.goto(live.url + "/ui")
    enter_token(tab, live.reader)
    tab.locator("#teachers tbody tr").first.wait_for()
    tab.evaluate(
        """() => document.body.insertAdjacentHTML("beforeend",
        '<img src="/assets/favicon.png" onload="window.__xss=3">'
        + '<iframe srcdoc="<b>x</b>"></iframe>')"""
    )
    tab.wait_for_function("() => window.__cspViolations.length >= 1")
    assert tab.evaluate("() => window.__xss") is None
    assert any(v.startswith("script-src") for v in csp_violations(tab)), csp_violations(tab)
