"""Fixtures of the browser tests: Debian's headless Chromium driven by Playwright.

``browser`` is one Chromium for all the browser tests.  Its scope is the
package, not the session: while Playwright's sync API is open it marks an
event loop as running in the main thread, which would break ``asyncio.run`` in
the test packages after this one.  Playwright's driver ships in its wheel; the
browser is the system's ``chromium``, which ``scripts/install-test-deps.sh``
installs (nothing is downloaded).  ``page`` is a fresh context per test (its
own sessionStorage) that records console errors (Content-Security-Policy
violations among them) and page errors, which every test asserts are absent.
``live`` is a real registry (``auth = "required"``, job workers running) with
the reference teacher behind a ``ScoringGate``, registered as ``ref@tiny``;
shared by the module.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln_registry.config.settings import KilnConfig
from kiln_registry.testing.tiny_models import TinyModel
from tests.auth.support import bearer, create_token
from tests.browser.gate import ScoringGate
from tests.helpers import serve_app
from tests.jobs.harness import Registry, running_registry

MODEL_ID = "tiny-ref"
ALIAS = "ref@tiny"
VIEWPORT = {"width": 1360, "height": 900}


def chromium_path() -> str:
    found = shutil.which("chromium")
    if found is None:
        message = "Debian's chromium is missing: run scripts/install-test-deps.sh (as root)"
        if os.geteuid() == 0:
            pytest.fail(message)  # the install script runs as root in CI: it must be there
        pytest.skip(message + "; this user cannot install it")
    return found


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


# Runs before any page script (Playwright injects it; the page's CSP does not apply to it).
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""
# Chromium logs every refused fetch; the pages' first call is refused until a token is given.
EXPECTED_401 = "Failed to load resource: the server responded with a status of 401"


@dataclass
class PageLog:
    messages: list[str] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Console errors (CSP violations among them) and page errors, less the expected 401."""
        return [m for m in self.messages if EXPECTED_401 not in m]


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, PageLog]]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    context.add_init_script(RECORD_VIOLATIONS)
    tab = context.new_page()
    log = PageLog()
    tab.on("console", lambda m: m.type == "error" and log.messages.append(f"console: {m.text}"))
    tab.on("pageerror", lambda e: log.messages.append(f"pageerror: {e}"))
    tab.on("request", lambda r: log.requests.append((r.url, dict(r.headers))))
    try:
        yield tab, log
    finally:
        context.close()


@dataclass
class Live:
    registry: Registry
    gate: ScoringGate
    token: str  # read, register, jobs: the test's own API calls
    reader: str  # read only: what the pages are given
    teacher_url: str

    @property
    def url(self) -> str:
        return self.registry.url

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers=bearer(self.token), timeout=30.0, trust_env=False
        )


def _config(directory: Path, student: Path) -> KilnConfig:
    (directory / "corpora").mkdir(exist_ok=True)
    return KilnConfig.model_validate(
        {
            "server": {"database": str(directory / "registry.db"), "auth": "required"},
            "student": {"model_path": str(student)},
            "jobs": {
                "corpus_root": str(directory / "corpora"),
                "result_root": str(directory / "results"),
                "concurrency": 1,
            },
        }
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Iterator[Live]:
    from kiln_registry.reference_teacher.app import create_reference_app
    from kiln_registry.reference_teacher.identity import load_reference_teacher

    directory = tmp_path_factory.mktemp("browser")
    teacher, _ = load_reference_teacher(
        tiny_model.path, served_model_id=MODEL_ID, max_top_k=8, max_model_len=64
    )
    gate = ScoringGate(create_reference_app(teacher, api_key_env=None))
    config = _config(directory, tiny_model.path)
    token = create_token(directory / "registry.db", "operator", {"read", "register", "jobs"})
    reader = create_token(directory / "registry.db", "reader", {"read"})
    with serve_app(gate) as teacher_url, running_registry(config) as registry:
        live = Live(
            registry=registry, gate=gate, token=token, reader=reader, teacher_url=teacher_url
        )
        with live.api() as http:
            body = {"alias": ALIAS, "kind": "remote", "provider": "vllm", "model_id": MODEL_ID,
                    "url": teacher_url, "notes": "the reference teacher"}  # fmt: skip
            answer = http.post("/v1/teachers", json=body)
            assert answer.status_code == 200, answer.text
        try:
            yield live
        finally:
            gate.open()  # a failed test may leave scoring requests held: let them finish


def csp_violations(tab: Any) -> list[str]:
    found: list[str] = tab.evaluate("() => window.__cspViolations")
    return found


def enter_token(tab: Any, token: str) -> None:
    """Fill the page's token form (shown because the registry needs one) and submit it."""
    tab.locator("#token-form").wait_for(state="visible")
    tab.fill("#token-input", token)
    tab.locator("#token-form button[type=submit]").click()
