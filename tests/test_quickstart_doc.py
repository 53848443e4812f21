"""Issue 30 item 3: the single-host quickstart of docs/deployment.md runs as written.

The page's ``bash`` block of the "Quickstart" section is run by bash (``set
-euo pipefail``) in a temporary directory, with its two fixed ports replaced
by free ones and ``MODEL`` pointing at the session's tiny model with the
demo's chat template (what ``kiln demo`` caches).  Real processes: openssl,
``kiln reference-teacher``, ``kiln serve`` with auth and TLS, the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiln_registry.demo.run import CHAT_TEMPLATE
from kiln_registry.testing.tiny_models import TinyModel
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "deployment.md"


def quickstart_script() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
    return block


def _stop(pid_file: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pid_file.read_text()), signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the quickstart needs openssl")
def test_the_quickstart_runs_as_written(tmp_path: Path, tiny_model: TinyModel) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model.path, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    script = quickstart_script()
    assert script.count("8400") >= 2 and script.count("8420") >= 2
    script = script.replace("8400", str(free_port())).replace("8420", str(free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(MODEL=str(model), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    work = tmp_path / "kiln-quickstart"
    try:
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + script],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        _stop(work / "registry.pid")
        _stop(work / "teacher.pid")
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("ok: 1 sequences of job") == 2, done.stdout
    assert "status        succeeded" in done.stdout and "off_policy_generation" in done.stdout
    assert {"scored.jsonl", "generated.jsonl", "cert.pem"} <= {p.name for p in work.iterdir()}
