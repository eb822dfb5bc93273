"""The harness process's heap: large tensors reuse freed memory, and the garbage collector skips what imports built.

**Freed memory** (:func:`keep_freed_memory`).
A check draws samples in tensors of a few MB (65 536 blocks x 16 tokens, float64 exponentials), thousands of times.
glibc's malloc serves every request above its mmap threshold (128 KiB, raised only as far as the largest chunk freed
so far) with a fresh ``mmap``, and gives the heap's free top back to the system above its trim threshold: each draw
then pays page faults, the kernel zeroing the pages, and the unmapping. :func:`keep_freed_memory` raises both
(``mallopt``), so a process that runs checks keeps what it freed and reuses it (what it saves and what it costs in
memory: docs/benchmarks.md). It changes how memory is obtained, never a value computed.

The harness sets this in its own process, at its first case (``conformance.registry.run_case``), never through the
environment: processes the checks start (engine servers) keep their own allocator. On a C library other than glibc
(``mallopt`` absent) nothing changes.

**Long-lived objects** (:func:`freeze_long_lived`). The modules a check process imports (torch, transformers, scipy,
Hypothesis) leave hundreds of thousands of objects the cyclic garbage collector tracks, and every full collection
walks them all. After a collection, ``gc.freeze()`` moves every object alive to a generation the collector no longer
walks; :func:`freeze_long_lived` does so at a case's start whenever the process imported many modules since it last
did (its first case, then the case whose models first import transformers). Objects are still freed by reference
counting; only a reference cycle that becomes garbage after a freeze is never collected, which for imported modules,
cached models and exact laws is never (what it saves: docs/benchmarks.md).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import sys

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


#: A freeze follows an import of at least this many modules since the last one (transformers brings about a thousand).
FREEZE_AFTER_MODULES = 200
_frozen_at = [0]  # len(sys.modules) at the last freeze


def freeze_long_lived() -> bool:
    """``gc.collect()`` then ``gc.freeze()`` when the process imported ``FREEZE_AFTER_MODULES`` modules or more since the
    last freeze (or never froze); True when it froze."""
    if len(sys.modules) - _frozen_at[0] < FREEZE_AFTER_MODULES:
        return False
    gc.collect()
    gc.freeze()
    _frozen_at[0] = len(sys.modules)
    return True
