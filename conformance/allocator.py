"""The harness process's heap: large tensors reuse freed memory instead of a fresh mapping each.

A check draws samples in tensors of a few MB (65 536 blocks x 16 tokens, float64 exponentials), thousands of times.
glibc's malloc serves every request above its mmap threshold (128 KiB, raised only as far as the largest chunk freed
so far) with a fresh ``mmap``, and gives the heap's free top back to the system above its trim threshold: each draw
then pays page faults, the kernel zeroing the pages, and the unmapping. :func:`keep_freed_memory` raises both
(``mallopt``), so a process that runs checks keeps what it freed and reuses it: on the main job (two xdist workers)
system time fell from about 6 to about 2.5 CPU-s, peak resident memory rose from 0.80 to 0.93 GB
(``docs/benchmarks.md``). It changes how memory is obtained, never a value computed.

The harness sets this in its own process, at its first case (``conformance.registry.run_case``), never through the
environment: processes the checks start (engine servers) keep their own allocator. On a C library other than glibc
(``mallopt`` absent) nothing changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: ``mallopt`` parameters (glibc's ``malloc.h``).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
#: Requests up to this size come from the heap (glibc's largest allowed threshold on 64-bit: 32 MiB).
MMAP_THRESHOLD = 32 << 20
#: The heap's free top goes back to the system only beyond this much.
TRIM_THRESHOLD = 256 << 20
#: Extra room the heap takes whenever it grows.
TOP_PAD = 64 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (once); True when ``mallopt`` accepted all three."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library found, or not glibc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
