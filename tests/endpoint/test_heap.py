"""``endpoint.heap``: freed buffers stay in the process (counted in page faults, not time).

Each test process allocates and frees what one batch does (eight 0.73 MB answers, the
scan's masks and positions, the 5.8 MB joined answer and a send buffer), twenty times,
and counts its minor page faults (``/proc/self/stat``): with the thresholds raised, the
freed pages are reused and the count falls by far more than half.
"""

from __future__ import annotations

import os
import subprocess
import sys

BATCHES = r"""
import os, sys
import numpy as np
from kiln_registry.endpoint.heap import keep_freed_memory

def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])

# twice: a second call is harmless
kept = [keep_freed_memory(), keep_freed_memory()] if sys.argv[1] == "keep" else None
before = faults()
for _ in range(20):
    answers = [os.urandom(16) * (730_000 // 16) for _ in range(8)]
    masks = [np.frombuffer(a, dtype=np.uint8) == 0x22 for a in answers]
    positions = [np.flatnonzero(m) for m in masks]
    del masks, positions
    joined = b"".join(answers)
    del answers
    unsent = bytearray(joined[100_000:])
    del joined, unsent
print(kept == [True, True], faults() - before)
"""


def batch_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", BATCHES, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


def glibc() -> bool:
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):
        return False


def test_freed_buffers_are_reused_instead_of_faulted_in_again() -> None:
    assert glibc(), "this suite runs on glibc hosts; elsewhere keep_freed_memory does nothing"
    kept, with_heap = batch_faults("keep")
    _, plain = batch_faults("plain")
    assert kept == "True"
    assert with_heap * 4 < plain, (with_heap, plain)
