"""Issue 27 item 10: the ``teachers.json`` import obeys the registration rules and is audited.

A deleted alias stays reserved; neither ``kiln registry import`` nor the
start-up import of ``[server] legacy_registry`` may bring it back (or a
look-alike of a registered or reserved alias, or an alias with an invisible
character), and every alias an import adds is an audit row.  Real registry,
real CLI subprocess, real files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, RegistryServer, run_registry, write_config


def _entry(alias: str, model_id: str) -> dict[str, Any]:
    """A fixture entry as Kiln's teachers.json holds it."""
    return {"alias": alias, "kind": "fixture", "model_id": model_id, "max_top_k": 8,
            "vocab_size": 1024, "supports_full_vocab": False}  # fmt: skip


def _write(path: Path, aliases: list[str]) -> Path:
    doc = {alias: _entry(alias, "attacker-model") for alias in aliases}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _state(server: RegistryServer) -> tuple[dict[str, str], list[tuple[str, str]]]:
    with server.client() as http:
        teachers = http.get("/v1/teachers").json()["teachers"]
        events = http.get("/v1/audit", params={"limit": 100}).json()["events"]
    models = {t["spec"]["alias"]: t["spec"]["model_id"] for t in teachers}
    return models, [(e["action"], e["target"]) for e in events if e["action"] == "teacher.import"]


REFUSED = ["victim", "VICTIM", "vi\u0441tim", "Owner", "own\u200ber"]


def test_import_cannot_bring_back_a_deleted_alias_and_audits_what_it_adds(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    with run_registry(config) as server, server.client() as http:
        for alias in ("victim", "owner"):
            body = {"alias": alias, "kind": "fixture", "model_id": "real-model"}
            assert http.post("/v1/teachers", json=body).status_code == 200
        assert http.delete("/v1/teachers/victim").status_code == 200
    legacy = _write(tmp_path / "teachers.json", [*REFUSED, "fresh"])
    done = subprocess.run(
        [sys.executable, "-m", "kiln_registry.cli.main", "registry", "import", "--config",
         str(config), str(legacy)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["imported"] == ["fresh"]
    assert sorted(r["alias"] for r in summary["refused"]) == sorted(REFUSED)
    # At start-up too: [server] legacy_registry names a file with the same entries.
    startup = _write(tmp_path / "startup.json", [*REFUSED, "fresh2"])
    config = write_config(tmp_path, student=tiny_model.path, server={"legacy_registry": startup})
    with run_registry(config) as server:
        models, imports = _state(server)
    assert models == {"owner": "real-model", "fresh": "attacker-model", "fresh2": "attacker-model"}
    assert sorted(imports) == [("teacher.import", "fresh"), ("teacher.import", "fresh2")]
