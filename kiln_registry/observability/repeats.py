"""``RepeatFilter``: the cap on log floods (issue 15, attack 8).

At most ``burst`` records with the same logger, level and message template
per ``window_s``; the first record after a quiet window says how many were
dropped.  Keys are bounded (the oldest is forgotten first).  Access records
(one per request, ``observability.access``) are exempt.  ``kiln serve``'s
root handler carries one (``observability.logs``).

Imports the standard library and ``observability.access``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from kiln_registry.observability.access import ACCESS_LOGGER

LOG_BURST = 10
LOG_WINDOW_S = 60.0
MAX_LOG_KEYS = 1024


class RepeatFilter(logging.Filter):
    """Drop repeats of one log line past ``burst`` per ``window_s`` (see the module docstring)."""

    def __init__(self, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S) -> None:
        super().__init__()
        self._burst = burst
        self._window = window_s
        # key -> [window start, records seen in the window, dropped in the window]
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == ACCESS_LOGGER:
            return True  # one line per request by design (observability.access), never a flood
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] >= self._window:
            dropped = int(entry[2]) if entry is not None else 0
            self._seen[key] = [now, 1.0, 0.0]
            self._seen.move_to_end(key)
            while len(self._seen) > MAX_LOG_KEYS:
                self._seen.popitem(last=False)
            if dropped:
                record.msg = f"{record.msg} [{dropped} identical lines suppressed]"
            return True
        entry[1] += 1
        if entry[1] <= self._burst:
            return True
        entry[2] += 1
        return False
