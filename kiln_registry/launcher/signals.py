"""Signals a foreground launch catches (re-exported by ``launcher.supervisor``).

Imports: standard library only.
"""

from __future__ import annotations

import signal
from types import FrameType

FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
)


class Interrupted(BaseException):
    """A forwarded signal arrived before the server was spawned."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class SignalGate:
    """Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT while installed (main thread only).

    Before a spawn it raises ``Interrupted`` once, so long work unwinds
    through its cleanup; after ``record_only()`` signals are queued for the
    supervisor to forward.  The first signal decides the exit status.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._raise = True
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGate:
        for sig in FORWARDED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def record_only(self) -> None:
        self._raise = False

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._raise:
            self._raise = False
            raise Interrupted(signum)
