"""The endpoint's heap: freed buffers stay in the process for the next answer.

Every batch passes a few megabytes through fresh buffers: the teachers' bodies, the
scan's temporaries, the joined answer and the socket's send buffer.  glibc's malloc
hands a freed block over its mmap threshold back to the kernel and trims the heap's
top past its trim threshold, so each request faulted those pages in again: 2,477
minor faults per request in ``bench/bench_endpoint.py`` (2026-12-05), about 2 ms of
the endpoint's CPU per batch.  ``keep_freed_memory`` raises both thresholds
(``mallopt``), so a freed buffer is reused by the next answer: 248 faults per
request.  The cost is resident memory: after a peak the process keeps up to
``TRIM_THRESHOLD`` free at the heap's top, and a block over ``MMAP_THRESHOLD`` is
still mapped and unmapped on its own.  Elsewhere than glibc it does nothing.

Imports the standard library only.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Final

log = logging.getLogger("kiln_registry.endpoint")

M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD: Final = 32 * 1024 * 1024  # glibc's largest on 64-bit hosts
TRIM_THRESHOLD: Final = 64 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc."""
    try:
        libc_name = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # no such name on this platform
        libc_name = ""
    if not libc_name.startswith("glibc"):
        log.debug("the C library is not glibc (%r): the heap thresholds stay", libc_name)
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    log.debug("heap thresholds raised: %s", kept)
    return kept
