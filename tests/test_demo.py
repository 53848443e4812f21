"""``kiln demo``: real subprocess runs (success, Ctrl-C, a child that cannot start) and
the model cache rules.

The demo runs as ``python -m kiln_registry.cli.main demo`` with a temporary
``--cache-dir`` shared by the runs of this module (the first run builds the
tiny model, later ones reuse it).  After each run every child process must be
gone and the work directory removed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiln_registry.cli.demo_cmds import render_result
from kiln_registry.config.loader import load_config
from kiln_registry.demo.run import (
    COMPLETE_NAME,
    MODEL_DIR_NAME,
    ensure_demo_model,
    model_is_complete,
    write_config,
)
from kiln_registry.domain.errors import InputError, LauncherError
from kiln_registry.testing.tiny_models import TinyModel

DEMO = [sys.executable, "-m", "kiln_registry.cli.main", "demo"]


def _alive(pid: int) -> bool:
    """A live process (a zombie waiting for this sandbox's init to reap it is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _demo_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo-cache")


@pytest.fixture(scope="module")
def first_run(cache_dir: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [*DEMO, "--json", "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, timeout=240, env=_demo_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(proc.stdout)


@pytest.mark.slow
def test_demo_registers_and_cleans_up(
    first_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]], cache_dir: Path
) -> None:
    proc, result = first_run
    assert proc.stdout.count("\n") == 1  # one JSON object
    assert result["schema"] == "kiln.demo-result.v1" and result["model_reused"] is False
    entry = result["entry"]
    assert entry["status"] == "verified" and entry["usable"] is True
    assert entry["spec"]["alias"] == "demo-teacher@reference"
    manifest = json.loads(result["off_policy_manifest"])
    assert manifest["schema"] == "kiln.off-policy-distillation-manifest.v1"
    assert manifest["teacher_identity"] == entry["spec"]["identity"]
    assert result["off_policy_manifest"] == entry["off_policy_manifest"]
    digest = result["teacher"]["fingerprint"].rsplit(".", 1)[1]
    assert entry["identity_revision"] == f"sha256:{digest}"
    assert result["stopped"] is True and result["work_dir_removed"] is True
    assert not Path(result["work_dir"]).exists()
    assert not _alive(result["teacher"]["pid"]) and not _alive(result["registry"]["pid"])
    assert sorted(p.name for p in cache_dir.iterdir()) == [MODEL_DIR_NAME]
    assert model_is_complete(cache_dir / MODEL_DIR_NAME)


@pytest.mark.slow
def test_demo_human_output(
    first_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    text = render_result(first_run[1])
    assert "demo-teacher@reference" in text and "verified" in text
    assert '"schema": "kiln.off-policy-distillation-manifest.v1"' in text
    assert text.endswith("removed the work directory")


def _reset_sigint() -> None:
    # The test runner may ignore SIGINT; a terminal's Ctrl-C reaches a default handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_children_and_removes_the_work_dir(
    first_run: object, cache_dir: Path, sig: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [*DEMO, "--json", "--cache-dir", str(cache_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=_demo_env(), preexec_fn=_reset_sigint,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        while not lines or "registry pid" not in lines[-1]:
            line = proc.stderr.readline()
            assert line, f"demo ended early: {lines}"
            lines.append(line)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(lines) + err
    assert proc.returncode == 130 and out == "", text
    assert "interrupted" in text and "tiny model reused from the cache" in text
    work_dir = re.search(r"work dir (\S+);", text)
    pids = [int(p) for p in re.findall(r"pid (\d+)", text)]
    assert work_dir is not None and len(pids) == 2
    assert not Path(work_dir.group(1)).exists()
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_child_that_cannot_start_is_one_error_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # A "complete" cache entry whose model is not a model: both children fail.
    ensure_demo_model(cache, build=_junk_builder)
    proc = subprocess.run(
        [*DEMO, "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=240, env=_demo_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("kiln: error: demo.") and "exited with status" in last
    work_dir = re.search(r"work dir (\S+);", proc.stderr)
    assert work_dir is not None and not Path(work_dir.group(1)).exists()
    assert not any(_alive(int(p)) for p in re.findall(r"pid (\d+)", proc.stderr))


# -- the model cache, with builders that write a few small files ---------------
# (The real builder takes seconds; these injected builders exercise the cache
# rules: reuse, rebuild of an incomplete or altered entry, cleanup on failure.)


def _junk_builder(dest: Path) -> None:
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}", encoding="utf-8")
    (dest / "weights.bin").write_bytes(b"\x00" * 1000)


def _failing_builder(dest: Path) -> None:
    _junk_builder(dest)
    raise InputError("builder failed", rule="tiny_model.test")


def test_cache_is_built_atomically_and_reused(tmp_path: Path) -> None:
    calls: list[Path] = []

    def builder(dest: Path) -> None:
        calls.append(dest)
        _junk_builder(dest)

    model, reused = ensure_demo_model(tmp_path, build=builder)
    assert (model, reused) == (tmp_path / MODEL_DIR_NAME / "model", False)
    assert calls[0].parent != model.parent  # built elsewhere, then renamed
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_DIR_NAME]
    assert ensure_demo_model(tmp_path, build=builder) == (model, True)
    assert len(calls) == 1
    record = json.loads((tmp_path / MODEL_DIR_NAME / COMPLETE_NAME).read_text())
    assert sorted(record["files"]) == ["config.json", "weights.bin"]


@pytest.mark.parametrize("damage", ["marker", "byte", "extra", "missing"])
def test_an_incomplete_or_altered_cache_entry_is_rebuilt(tmp_path: Path, damage: str) -> None:
    model, _ = ensure_demo_model(tmp_path, build=_junk_builder)
    if damage == "marker":
        (model.parent / COMPLETE_NAME).unlink()
    elif damage == "byte":
        (model / "weights.bin").write_bytes(b"\x01" + b"\x00" * 999)
    elif damage == "extra":
        (model / "stray.txt").write_text("x", encoding="utf-8")
    else:
        (model / "config.json").unlink()
    assert not model_is_complete(model.parent)
    assert ensure_demo_model(tmp_path, build=_junk_builder) == (model, False)
    assert model_is_complete(model.parent)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_DIR_NAME]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="builder failed"):
        ensure_demo_model(tmp_path, build=_failing_builder)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_is_a_launcher_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    with pytest.raises(LauncherError) as info:
        ensure_demo_model(blocker / "cache", build=_junk_builder)
    assert info.value.rule == "demo.model_cache" and "--cache-dir" in info.value.one_line()


def test_generated_config_is_valid(tmp_path: Path, tiny_model: TinyModel) -> None:
    work = tmp_path / 'odd "dir" \\ name'
    work.mkdir()
    config = load_config(write_config(work, tiny_model.path, 18555))
    assert config.server.host == "127.0.0.1" and config.server.port == 18555
    assert config.server.database == work / "registry.db"
    assert config.student.model_path == tiny_model.path
