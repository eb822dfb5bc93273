"""A hung backend gets a named failure (conformance.watchdog), never a hung harness.

This module doubles as the backend factory of the end-to-end run:
``--specdec-backend=tests.test_watchdog:hanging_backend`` (importable because pytest runs
from the repository root), with the way it hangs chosen by ``SPECDEC_TEST_HANG``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from conformance import watchdog
from conformance.registry import CheckContext, all_cases, run_case
from conformance.watchdog import BackendTimeout, time_limit
from specdec_ref.backend import ReferenceBackend

ROOT = Path(__file__).resolve().parents[1]
CHECK = "structure_greedy"  # deterministic, fast on a correct backend


class Hanging(ReferenceBackend):
    """``verify`` never returns: sleeps, spins in Python, or sleeps while swallowing every Exception."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def verify(self, draft_tokens, draft_probs, target_probs, *, generator=None):
        if self.how == "sleep":
            time.sleep(3600)
        elif self.how == "spin":
            while True:
                pass
        elif self.how == "swallow":
            while True:
                try:
                    time.sleep(3600)
                except Exception:  # a backend that retries on any error must not defeat the limit
                    pass
        return super().verify(draft_tokens, draft_probs, target_probs, generator=generator)


class Observing(ReferenceBackend):
    """Correct backend that records the timer armed while it runs."""

    def __init__(self):
        super().__init__()
        self.timers = []

    def verify(self, *args, **kwargs):
        self.timers.append(signal.getitimer(signal.ITIMER_REAL)[0])
        return super().verify(*args, **kwargs)


def hanging_backend():
    """Factory for the end-to-end run (``SPECDEC_TEST_HANG``: sleep, spin or swallow)."""
    return Hanging(os.environ.get("SPECDEC_TEST_HANG", "sleep"))


def case():
    (c,) = all_cases([CHECK])
    return c


def assert_no_timer_left(handler_before):
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler_before


@pytest.mark.parametrize("how", ["sleep", "spin", "swallow"])
def test_run_case_names_the_timeout(how):
    handler = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    record = run_case(case(), Hanging(how), CheckContext(), timeout=1 if how == "sleep" else 0.5)
    elapsed = time.monotonic() - start
    assert record.status == "failed", record.message
    assert "timed out" in record.message and repr(CHECK) in record.message
    assert "--specdec-timeout" in record.message and "fix the backend" in record.message
    assert "interrupted in verify" in record.message  # where the backend was stuck
    assert elapsed < 5, elapsed
    assert_no_timer_left(handler)


def test_context_timeout_is_honoured_and_zero_disables():
    record = run_case(case(), Hanging("sleep"), CheckContext(timeout=0.5))
    assert record.status == "failed" and "limit of 0.5 s" in record.message

    backend = Observing()
    assert run_case(case(), backend, CheckContext()).status == "passed"  # default: 300 s armed
    assert backend.timers and all(0 < t <= 300 for t in backend.timers)

    for ctx, timeout in ((CheckContext(timeout=0), None), (CheckContext(), 0), (CheckContext(timeout=None), None)):
        backend = Observing()
        assert run_case(case(), backend, ctx, timeout=timeout).status == "passed"
        assert backend.timers and all(t == 0 for t in backend.timers)  # nothing armed


def test_enclosing_timer_and_handler_are_restored():
    seen = []
    previous = signal.signal(signal.SIGALRM, lambda *_: seen.append("outer"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 60)
        record = run_case(case(), Hanging("sleep"), CheckContext(), timeout=0.3)
        assert record.status == "failed" and "timed out" in record.message
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 55 < remaining <= 60, remaining
        with time_limit(5, "quick"):
            pass
        assert 55 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60
        assert not seen
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        signal.signal(signal.SIGALRM, previous)


def test_time_limit_raises_backend_timeout_an_assertion_error():
    assert issubclass(BackendTimeout, AssertionError)
    with pytest.raises(BackendTimeout, match="'my check' timed out"):
        with time_limit(0.2, "my check"):
            time.sleep(3600)
    with time_limit(0, "disabled"):
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_outside_the_main_thread_no_limit_and_one_warning(monkeypatch):
    monkeypatch.setattr(watchdog, "_warned", set())
    out = {}

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["records"] = [run_case(case(), ReferenceBackend(), CheckContext(timeout=1)) for _ in range(2)]
        out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert [r.status for r in out["records"]] == ["passed", "passed"]
    assert len(out["warnings"]) == 1 and "not the main thread" in out["warnings"][0], out["warnings"]


def test_pytest_run_fails_the_hanging_check_and_ends():
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_BACKEND", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env["SPECDEC_TEST_HANG"] = "sleep"
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "conformance/test_verifier.py", "-q", "-k", CHECK,
            "--specdec-backend=tests.test_watchdog:hanging_backend", "--specdec-timeout=1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed" in out and "BackendTimeout" in out, out
    assert f"check {CHECK!r} timed out" in out and "limit of 1 s" in out and "--specdec-timeout" in out, out
    assert "NOT CERTIFIED" in out, out
    assert elapsed < 60, elapsed


def test_alarm_in_the_watchdogs_own_frames_is_not_raised_there():
    """An alarm landing in __enter__ (armed, body not started) re-fires inside the body; in __exit__ it is ignored."""
    from types import SimpleNamespace

    previous = signal.signal(signal.SIGALRM, lambda *_: None)  # the re-armed 1 ms alarm must not kill the process
    try:
        watchdog._on_alarm(signal.SIGALRM, SimpleNamespace(f_code=time_limit.__enter__.__code__))
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 1e-3
        signal.setitimer(signal.ITIMER_REAL, 0)
        watchdog._on_alarm(signal.SIGALRM, SimpleNamespace(f_code=time_limit.__exit__.__code__))
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        with pytest.raises(watchdog._Expired):
            watchdog._on_alarm(signal.SIGALRM, sys._getframe())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
