"""Phase timings of one launch: where a ``kiln-teacher`` start spends its time.

Owns ``PhaseClock``: wall-clock durations (``time.monotonic``) of named
phases, recorded from any thread (several phases overlap: the runtime digest
and the identity probe run while the snapshot is staged), in the order they
finish.  ``document()`` is what the attempts log and the ``--timings`` line
carry: ``{"phases": {name: seconds}, "since_start_s": ...}``, seconds rounded
to the millisecond.  A ``listener`` (the terminal display) is told of each
phase as it starts and ends.

The phase names of a launch (docs/launcher.md, "Where a launch spends its
time"): ``resolve``, ``stage`` (copy while hashing, seal, verify),
``runtime_digest``, ``accelerator_probe``, ``tokenizer_identity``,
``recheck``, ``verify`` (the pre-spawn snapshot check), ``vllm_ready``
(spawn to vLLM's ``/health`` 200) and ``gateway`` (gateway start to its own
``/health`` 200 on the public address: the self-probe).

Imports: standard library only.  Nothing happens at import time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

MAX_PHASES = 64
Listener = Callable[[str, str, float | None], None]


class PhaseClock:
    """Durations of named phases; thread-safe; bounded to ``MAX_PHASES`` names."""

    def __init__(self, listener: Listener | None = None) -> None:
        self.started = time.monotonic()
        self._durations: dict[str, float] = {}
        self._lock = threading.Lock()
        self.listener = listener

    def record(self, name: str, seconds: float) -> None:
        """Record ``name`` as having taken ``seconds`` (the last record of a name wins)."""
        with self._lock:
            if name in self._durations or len(self._durations) < MAX_PHASES:
                self._durations[name] = max(0.0, seconds)
        if self.listener is not None:
            self.listener("end", name, seconds)

    def begin(self, name: str) -> float:
        """Tell the listener ``name`` started; the start time to pass to ``end``."""
        if self.listener is not None:
            self.listener("start", name, None)
        return time.monotonic()

    def end(self, name: str, started: float) -> None:
        self.record(name, time.monotonic() - started)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (recorded whether it succeeds or fails)."""
        started = self.begin(name)
        try:
            yield
        finally:
            self.end(name, started)

    def durations(self) -> dict[str, float]:
        with self._lock:
            return dict(self._durations)

    def document(self) -> dict[str, object]:
        """``{"phases": {name: s}, "since_start_s": s}``, milliseconds precision."""
        return {
            "phases": {name: round(s, 3) for name, s in self.durations().items()},
            "since_start_s": round(time.monotonic() - self.started, 3),
        }


def terminal_listener(write: Callable[[str], object], prefix: str) -> Listener:
    """A listener that writes one line per finished phase (``prefix: name 1.234 s``)."""
    lock = threading.Lock()

    def listen(event: str, name: str, seconds: float | None) -> None:
        if event != "end" or seconds is None:
            return
        with lock:
            write(f"{prefix}: {name} {seconds:.2f} s\n")

    return listen
