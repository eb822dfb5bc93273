"""The harness's heap setting (conformance.allocator): applied in-process, once, never through the environment."""
import os
import platform

import pytest

from conformance.allocator import keep_freed_memory


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds_once():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # cached: one mallopt round per process


def test_nothing_reaches_the_environment():
    """Processes the checks start (engine servers) keep their own allocator: the environment is left as it was."""
    before = dict(os.environ)
    keep_freed_memory.cache_clear()
    keep_freed_memory()
    assert dict(os.environ) == before
