"""Progress of long CLI operations: a ``tqdm`` bar on a terminal, nothing otherwise.

``ProgressBar`` draws on its stream (standard error by default) only when
that stream is a TTY; on a pipe or a file it writes nothing at all, so
scripted output stays exactly what the command prints.  Byte bars show the
bytes done, the rate and (when the total is known) the time left.  Updates
may come from several threads (the hashing pool): they are serialised.

* ``ProgressBar.counting(limiter)``: every byte read for hashing goes through
  ``ReadRateLimiter.acquire``; the limiter's ``observer`` advances the bar
  (``kiln identity``, ``kiln digest``, kiln-teacher's runtime hashing).
* ``PhaseBars``: the launcher's ``progress(phase, done, total)`` callback
  (staging ``copy``/``seal-verify``/``verify``, then ``runtime``), one bar per
  phase.
* ``tree_bytes``: the size of a model tree, bounded, for a bar's total.

Imports the standard library, tqdm and ``identity.hashing`` (the limiter type).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Final, TextIO

from tqdm import tqdm

from kiln_registry.identity.hashing import ReadRateLimiter

MAX_TREE_ENTRIES: Final = 200_000
REFRESH_S: Final = 0.2


def on_tty(stream: TextIO) -> bool:
    """Whether ``stream`` is an open terminal."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real file
        return False


class ProgressBar:
    """One tqdm bar, drawn only on a TTY (see the module docstring)."""

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        unit: str = "B",
        stream: TextIO | None = None,
    ) -> None:
        out = sys.stderr if stream is None else stream
        self.enabled = on_tty(out)
        byte_unit = unit == "B"
        self._bar = tqdm(
            total=total or None,
            desc=description,
            unit=unit,
            unit_scale=byte_unit,
            unit_divisor=1024 if byte_unit else 1000,
            file=out,
            disable=not self.enabled,
            mininterval=REFRESH_S,
            dynamic_ncols=True,
            leave=True,
        )
        self._lock = threading.Lock()

    def advance(self, amount: int) -> None:
        if self.enabled and amount:
            with self._lock:
                total = self._bar.total
                if total is not None and self._bar.n + amount > total:
                    self._bar.total = self._bar.n + amount  # an estimate ran short: stay at 100%
                self._bar.update(amount)

    def update_to(self, done: int, total: int | None = None, status: str | None = None) -> None:
        """Set the absolute position (and total, and a short status after the counts)."""
        if not self.enabled:
            return
        with self._lock:
            if total is not None and total != self._bar.total:
                self._bar.total = total or None
            if status is not None:
                self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(done - self._bar.n)

    @contextmanager
    def counting(self, limiter: ReadRateLimiter) -> Iterator[ReadRateLimiter]:
        """``limiter``, advancing this bar by every byte it admits, until the block ends."""
        previous = limiter.observer
        limiter.observer = self.advance
        try:
            yield limiter
        finally:
            limiter.observer = previous

    def close(self) -> None:
        with self._lock:
            self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class PhaseBars:
    """A ``progress(phase, done, total)`` callback drawing one bar per phase (total 0: unknown)."""

    def __init__(self, prefix: str, *, stream: TextIO | None = None) -> None:
        self._prefix = prefix
        self._stream = stream
        self._phase: str | None = None
        self._bar: ProgressBar | None = None
        self._lock = threading.Lock()

    def __call__(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            if phase != self._phase or self._bar is None:
                if self._bar is not None:
                    self._bar.close()
                self._phase = phase
                self._bar = ProgressBar(f"{self._prefix}: {phase}", total, stream=self._stream)
            self._bar.update_to(done)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


def tree_bytes(*roots: str | os.PathLike[str] | None) -> int | None:
    """Size of the files under ``roots`` (directory links not followed); None past the bound."""
    total, seen = 0, 0
    stack = [os.fspath(r) for r in roots if r is not None]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_TREE_ENTRIES:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file():  # a link to a file counts (model caches link blobs)
                        total += entry.stat().st_size
        except OSError:
            return None  # the real pass reports the problem; the bar just has no total
    return total
