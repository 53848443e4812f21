"""Issue 30 items 2, 5 and 12: ``kiln demo --keep``, then the documented next commands.

A real ``kiln demo --keep --json`` subprocess (its cache filled from the
session's tiny model with the demo's chat template, through the demo's own
cache writer, so the model is not built twice); the commands it prints are run
as real ``kiln`` subprocesses against it: the teacher, an off-policy generation
job from ``--prompts`` (``kiln jobs show`` prints kind, K and the settings) and
a scoring job; then SIGINT stops both servers and removes the work directory.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.cli.demo_cmds import render_kept
from kiln_registry.demo.run import ALIAS, CHAT_TEMPLATE, ensure_demo_model
from kiln_registry.testing.tiny_models import TinyModel

DEMO_START_S = 240.0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _reset_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's Ctrl-C finds it


def _cache_from(tiny: TinyModel, cache: Path) -> None:
    def copy_with_template(dest: Path) -> None:
        shutil.copytree(tiny.path, dest)
        config = json.loads((dest / "tokenizer_config.json").read_text())
        config["chat_template"] = CHAT_TEMPLATE
        (dest / "tokenizer_config.json").write_text(json.dumps(config))

    ensure_demo_model(cache, build=copy_with_template)


def _first_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + DEMO_START_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            assert line, "kiln demo --keep ended before it printed its result"
            result: dict[str, Any] = json.loads(line)
            return result
        assert proc.poll() is None, "kiln demo --keep exited"
    raise AssertionError("kiln demo --keep did not print its result in time")


def _kiln(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kiln_registry", *argv],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kiln {' '.join(argv)}: {done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_keep_runs_the_next_commands_and_stops_on_ctrl_c(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    _cache_from(tiny_model, tmp_path / "cache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_registry", "demo", "--keep", "--json",
         "--cache-dir", str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=env, preexec_fn=_reset_sigint,
    )  # fmt: skip
    try:
        result = _first_line(proc)
        url, prompts = result["registry"]["url"], result["example_prompts"]
        text = render_kept(result)
        assert f"{url}/ui" in text and "no token needed" in text
        env["KILN_SERVER"] = url
        assert "verified" in _kiln(env, "teachers", "show", ALIAS)
        job = _kiln(env, "jobs", "submit", "--kind", "off-policy-generation", "--teacher", ALIAS,
                    "--prompts", prompts, "--max-tokens", "8", "--top-k", "8").strip()  # fmt: skip
        shown = _kiln(env, "jobs", "show", job, "--follow")
        assert "off_policy_generation" in shown and "succeeded" in shown, shown
        assert "max_tokens 8, temperature 0.0, top_p 1.0, seed none" in shown
        (tmp_path / "seq.json").write_text("[[1, 2, 3, 4]]")
        scoring = _kiln(env, "jobs", "submit", "--teacher", ALIAS, "--top-k", "4",
                        "--sequences", str(tmp_path / "seq.json")).strip()  # fmt: skip
        assert "succeeded" in _kiln(env, "jobs", "show", scoring, "--follow")
        _kiln(env, "jobs", "result", job, "--output", str(tmp_path / "corpus.jsonl"))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0 and "stopped the registry and the teacher" in err, err
    assert not Path(result["work_dir"]).exists()
    assert not any(_alive(pid) for pid in (result["teacher"]["pid"], result["registry"]["pid"]))
