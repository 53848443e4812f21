"""Progress bars: drawn on a terminal (a real pseudo-terminal), silent on a pipe.

Each command runs as a real subprocess twice: once with stderr on the slave
side of a pty (``os.openpty``, sized 120x40), once with stderr on a pipe.
On the pty the tqdm bar appears (its description, and for byte bars a rate
such as ``B/s``); on the pipe stderr stays empty.  stdout is a pipe in both
runs and carries exactly the same document, so scripts never see a bar.
Covered: ``kiln identity`` (bytes hashed, rate, time left), ``kiln registry
import``, ``kiln corpus verify --public-key``; the launcher's staging and
runtime callbacks and ``jobs show --follow``'s bar are the same
``ProgressBar``/``PhaseBars``, checked in process on a pty.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from kiln_registry.identity.hashing import ReadRateLimiter
from kiln_registry.launcher.fsops import reporter
from kiln_registry.observability.progress import PhaseBars, ProgressBar, tree_bytes
from kiln_registry.testing.tiny_models import TinyModel
from tests.api.support import REPO, write_config
from tests.jobs.test_corpus import make_signer, write_corpus
from tests.test_legacy_registry import legacy_registry, write_registry

KILN = [sys.executable, "-m", "kiln_registry.cli.main"]


def _drain(master: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every slave descriptor is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@contextmanager
def _pty() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        yield master, slave
    finally:
        for fd in (master, slave):
            with suppress(OSError):  # the slave may be closed already
                os.close(fd)


ENV = {**os.environ, "COLUMNS": "120"}


def run_tty(argv: list[str]) -> tuple[str, str]:
    """``(stdout, stderr)`` with stderr on a pty (stdout on a pipe)."""
    env = ENV
    with _pty() as (master, slave):
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=slave)  # fmt: skip
        os.close(slave)
        reader: list[bytes] = []
        thread = threading.Thread(target=lambda: reader.append(_drain(master)), daemon=True)
        thread.start()
        out, _ = proc.communicate(timeout=300)
        thread.join(60)
        assert proc.returncode == 0, reader
        return out.decode(), reader[0].decode("utf-8", "replace")


def run_pipe(argv: list[str]) -> tuple[str, str]:
    """``(stdout, stderr)``, both on pipes."""
    done = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=True)  # fmt: skip
    return done.stdout, done.stderr


def run_both(argv: list[str]) -> tuple[tuple[str, str], tuple[str, str]]:
    return run_tty(argv), run_pipe(argv)


def test_kiln_identity_shows_bytes_rate_and_time_left_on_a_tty(tiny_model: TinyModel) -> None:
    (tty_out, tty_err), (pipe_out, pipe_err) = run_both(
        [*KILN, "identity", str(tiny_model.path), "--tokenizer-view", "tokenizers"]
    )
    assert json.loads(tty_out) == json.loads(pipe_out)  # stdout never carries the bar
    assert "kiln identity: hashing" in tty_err and "100%" in tty_err
    assert "B/s" in tty_err and "<" in tty_err  # rate, and tqdm's "elapsed<left"
    assert pipe_err == ""


def test_registry_import_draws_a_bar_only_on_a_tty(tmp_path: Path, tiny_model: TinyModel) -> None:
    runs = []
    for name in ("tty", "pipe"):
        directory = tmp_path / name
        directory.mkdir()
        config = write_config(directory, student=tiny_model.path)
        teachers = write_registry(directory / "teachers.json", legacy_registry(secret=None))
        runs.append([*KILN, "registry", "import", "--config", str(config), str(teachers)])
    (tty_out, tty_err), (pipe_out, pipe_err) = run_tty(runs[0]), run_pipe(runs[1])
    assert json.loads(tty_out)["imported"] == json.loads(pipe_out)["imported"]
    assert "kiln registry import" in tty_err and "3/3" in tty_err
    assert pipe_err == ""


def test_corpus_verify_draws_a_bar_only_on_a_tty(tmp_path: Path, tiny_model: TinyModel) -> None:
    config = write_config(tmp_path, student=tiny_model.path)
    signer = make_signer(tmp_path)  # the key beside tmp_path/registry.db, as `kiln serve` keeps it
    corpus = write_corpus(tmp_path / "c.jsonl", [[1, 2, 3], [4, 5], [6]], signer)
    keys = subprocess.run([*KILN, "keys", "show", "--config", str(config), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    (tmp_path / "keys.json").write_text(keys.stdout)
    argv = [*KILN, "corpus", "verify", str(corpus), "--public-key", str(tmp_path / "keys.json")]
    (tty_out, tty_err), (pipe_out, pipe_err) = run_both([*argv, "--json"])
    assert json.loads(tty_out) == json.loads(pipe_out)
    assert json.loads(pipe_out)["ok"] is True
    assert "kiln corpus verify" in tty_err and "100%" in tty_err
    assert pipe_err == ""


def _tty_stream(slave: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(os.fdopen(slave, "wb", closefd=False), write_through=True)


def test_phase_bars_and_the_job_bar_draw_on_a_tty_and_stay_silent_elsewhere() -> None:
    with _pty() as (master, slave):
        stream = _tty_stream(slave)
        bars = PhaseBars("kiln-teacher", stream=stream)
        copy = reporter(bars, "copy", 4096)
        threads = [threading.Thread(target=copy, args=(1024,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        reporter(bars, "runtime", 0)(2048)  # runtime hashing: total unknown
        bars.close()
        with ProgressBar("job job-1", unit="seq", stream=stream) as job:
            job.update_to(3, 4, "running, 1 cached")
        stream.flush()
        os.close(slave)
        drawn = _drain(master).decode()
    assert "kiln-teacher: copy" in drawn and "4.00k/4.00k" in drawn
    assert "kiln-teacher: runtime" in drawn and "2.00kB" in drawn
    assert "job job-1" in drawn and "3/4" in drawn and "running, 1 cached" in drawn
    quiet = io.StringIO()  # not a terminal
    with ProgressBar("quiet", 10, stream=quiet) as bar:
        bar.update_to(10)
    PhaseBars("kiln-teacher", stream=quiet)("copy", 1, 2)
    assert quiet.getvalue() == ""


def test_a_counting_limiter_reports_every_byte_and_detaches(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    assert tree_bytes(tmp_path) == 1024
    assert tree_bytes(tmp_path / "missing") is None
    seen: list[int] = []

    class Recording(ProgressBar):
        def advance(self, amount: int) -> None:  # what the bar is told, without a terminal
            seen.append(amount)

    limiter = ReadRateLimiter(None)
    with Recording("bytes", 1024, stream=io.StringIO()) as bar, bar.counting(limiter) as counted:
        counted.acquire(1000)
        counted.acquire(24)
    limiter.acquire(5)  # after the block: no longer observed
    assert seen == [1000, 24] and limiter.observer is None
