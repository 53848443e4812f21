"""The in-flight limiter for teacher probes and who is probing.

Owns ``ProbeLimiter`` (a non-blocking slot counter, in all and per caller)
and ``PROBE_CALLER`` (the context variable the API sets per request).
Imports the standard library and ``kiln_registry.domain.errors`` only.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kiln_registry.domain.errors import ProbeBusy

# Who is probing: the API sets it per request (token name, else client address); None
# for the job workers, which have their own limiter.
PROBE_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "kiln_probe_caller", default=None
)


class ProbeLimiter:
    """A non-blocking slot counter: past ``max_in_flight`` probes in all, or
    ``max_per_caller`` for one caller (``PROBE_CALLER``), a probe gets ProbeBusy."""

    def __init__(self, max_in_flight: int = 2, max_per_caller: int | None = None) -> None:
        if max_in_flight < 1 or (max_per_caller is not None and max_per_caller < 1):
            raise ValueError("max_in_flight and max_per_caller must be at least 1")
        self._max = max_in_flight
        self._per_caller = max_per_caller or max_in_flight
        self._in_flight = 0
        self._by_caller: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def slot(self, caller: str | None = None) -> Iterator[None]:
        with self._lock:
            if self._in_flight >= self._max:
                raise ProbeBusy(f"{self._in_flight} teacher probes are already in flight")
            held = self._by_caller.get(caller, 0) if caller is not None else 0
            if held >= self._per_caller:
                raise ProbeBusy(f"this caller already has {held} teacher probes in flight")
            self._in_flight += 1
            if caller is not None:
                self._by_caller[caller] = held + 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if caller is not None:
                    left = self._by_caller[caller] - 1
                    if left:
                        self._by_caller[caller] = left
                    else:
                        del self._by_caller[caller]
