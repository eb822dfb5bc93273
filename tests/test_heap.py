"""The harness's heap settings (conformance.heap): in-process, never through the environment; freezes after large imports."""
import gc
import os
import platform
import sys

from conformance import heap
from conformance.heap import freeze_long_lived, keep_freed_memory


def test_thresholds_apply_where_glibc_runs_and_nowhere_else():
    """glibc accepts the three thresholds; any other C library (no ``mallopt``) is left as it is (False)."""
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    keep_freed_memory.cache_clear()
    assert keep_freed_memory() is glibc
    assert keep_freed_memory() is glibc  # cached: one mallopt round per process


def test_nothing_reaches_the_environment():
    """Processes the checks start (engine servers) keep their own allocator: the environment is left as it was."""
    before = dict(os.environ)
    keep_freed_memory.cache_clear()
    keep_freed_memory()
    assert dict(os.environ) == before


def test_freezes_after_a_large_import_only(monkeypatch):
    """A freeze happens when FREEZE_AFTER_MODULES modules arrived since the last one, never on every case."""
    monkeypatch.setattr(heap, "_frozen_at", [len(sys.modules) - heap.FREEZE_AFTER_MODULES])
    assert freeze_long_lived() is True and gc.get_freeze_count() > 0
    assert freeze_long_lived() is False  # nothing imported since
    monkeypatch.setattr(heap, "_frozen_at", [len(sys.modules) - heap.FREEZE_AFTER_MODULES + 1])
    assert freeze_long_lived() is False
