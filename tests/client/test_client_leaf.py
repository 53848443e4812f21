"""``import kiln_registry.client`` loads the wire shapes, never the server (issue 29).

A fresh interpreter imports the client and reports what it loaded: no
SQLAlchemy, Starlette or FastAPI, and no module of ``api``, ``jobs``, ``auth``
or ``db``.  The import time is printed for the record (``-s``), never asserted.
The import-linter contract "client imports wire, never the server" in
pyproject.toml says the same of the source; this test checks the running result.
"""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN_ROOTS = ("sqlalchemy", "starlette", "fastapi")
FORBIDDEN_PACKAGES = ("api", "jobs", "auth", "db")
PROBE = """
import json, sys, time
start = time.perf_counter()
import kiln_registry.client
elapsed = time.perf_counter() - start
print(json.dumps({"elapsed_s": elapsed, "modules": sorted(sys.modules)}))
"""


def _forbidden(module: str) -> bool:
    parts = module.split(".")
    if parts[0] in FORBIDDEN_ROOTS:
        return True
    return len(parts) > 1 and parts[0] == "kiln_registry" and parts[1] in FORBIDDEN_PACKAGES


def test_importing_the_client_loads_no_server_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    loaded = [name for name in report["modules"] if _forbidden(name)]
    assert loaded == [], f"import kiln_registry.client loaded server modules: {loaded[:20]}"
    assert "kiln_registry.wire.jobs" in report["modules"]
    own = [name for name in report["modules"] if name.startswith("kiln_registry")]
    print(f"import kiln_registry.client: {report['elapsed_s']:.3f} s, {len(own)} project modules")
