"""A per-check time limit: a hung backend gets a named failure, never a hung harness.

:func:`time_limit` arms ``signal.setitimer(signal.ITIMER_REAL, seconds)`` with a
``SIGALRM`` handler for the duration of one check; when it fires, the check
fails with :class:`BackendTimeout` (an ``AssertionError``, so it counts as a
failed check) naming the check, the limit and what to do. The previous handler
and timer are restored afterwards.

Limitations, stated:

* Python runs signal handlers between bytecodes of the main thread. A backend
  sleeping in ``time.sleep``, waiting on most blocking calls, or looping in
  Python is interrupted promptly; a backend stuck inside one long C call (a
  single huge kernel, a C-level deadlock) is interrupted only when that call
  returns to Python -- if it never does, neither does the check.
* Signals can only be handled in the main thread of the main interpreter, on
  platforms with ``SIGALRM`` (not Windows). That holds in pytest and in
  pytest-xdist workers; elsewhere :func:`time_limit` runs the check with no
  limit and says so once (``warnings.warn``).

Internally the handler raises a private ``BaseException`` so that the expiry
passes through ``except Exception`` blocks in the backend and through
Hypothesis (which would otherwise treat it as a failing example and replay the
hanging call while shrinking); it becomes :class:`BackendTimeout` at the
boundary of the check. An alarm that lands in :class:`time_limit`'s own
``__enter__`` (armed, body not yet started) re-fires a millisecond later inside the body;
one that lands in ``__exit__`` (the body already returned) is ignored.
"""
from __future__ import annotations

import math
import signal
import threading
import time
import warnings

#: Default per-check limit in seconds (``--specdec-timeout``, ``CheckContext.timeout``); 0 disables.
DEFAULT_TIMEOUT = 300.0

_warned: set[str] = set()


class BackendTimeout(AssertionError):
    """A check did not finish within its time limit (counts as a failed check)."""


class _Expired(BaseException):
    """Raised by the SIGALRM handler; not an ``Exception`` so nothing on the way up swallows it."""


def unsupported_reason() -> str | None:
    """Why no limit can be armed here, or None when it can."""
    if not hasattr(signal, "SIGALRM") or not hasattr(signal, "setitimer"):
        return "this platform has no SIGALRM/setitimer"
    if threading.current_thread() is not threading.main_thread():
        return f"checks run in thread {threading.current_thread().name!r}, not the main thread"
    return None


def _warn_once(reason: str) -> None:
    if "disabled" in _warned:  # once per process, whatever the reason
        return
    _warned.add("disabled")
    warnings.warn(
        f"specdec: per-check time limit disabled ({reason}); a hanging backend will hang this run",
        RuntimeWarning,
        stacklevel=3,
    )


def timeout_message(what: str, seconds: float, where: str = "") -> str:
    return (
        f"check {what!r} timed out: the backend did not return within the limit of {seconds:g} s.{where} "
        f"If the backend is merely slow, raise the limit with --specdec-timeout=SECONDS "
        f"(or run_case(..., timeout=SECONDS) / CheckContext(timeout=SECONDS); 0 disables it); "
        f"if it hangs, fix the backend."
    )


class time_limit:
    """``with time_limit(seconds, what):`` run the body with a wall-clock limit (None or <= 0: no limit).

    On expiry raises :class:`BackendTimeout` whose message names ``what``. Falls back
    to no limit (warning once) outside the main thread or without SIGALRM. Restores
    the previous SIGALRM handler and re-arms an enclosing ``ITIMER_REAL`` timer with
    what is left of it.
    """

    def __init__(self, seconds: float | None, what: str):
        self.seconds = seconds
        self.what = what
        self.armed = False

    def __enter__(self) -> "time_limit":
        seconds = self.seconds
        if seconds is None or not seconds > 0 or math.isinf(seconds):
            return self
        reason = unsupported_reason()
        if reason is None:
            try:
                self.previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
            except ValueError as exc:  # e.g. a sub-interpreter
                reason = f"cannot install a SIGALRM handler: {exc}"
        if reason is not None:
            _warn_once(reason)
            return self
        self.started = time.monotonic()
        self.previous_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
        self.armed = True
        return self

    def __exit__(self, typ, exc, tb) -> bool:
        __tracebackhide__ = True  # pytest: show the check's line and the message, not this machinery
        if not self.armed:
            return False
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)  # disarm first (an alarm arriving in this frame is ignored)
        signal.signal(signal.SIGALRM, self.previous_handler if self.previous_handler is not None else signal.SIG_DFL)
        delay, interval = self.previous_timer
        if delay > 0:  # an enclosing timer: re-arm it with what is left (overdue: fire at once)
            signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - self.started), 1e-6), interval)
        if isinstance(exc, _Expired):
            raise BackendTimeout(timeout_message(self.what, self.seconds, exc.args[0] if exc.args else "")) from None
        return False


def _on_alarm(signum, frame):
    code = getattr(frame, "f_code", None)
    if code is time_limit.__enter__.__code__:  # armed but the body has not started: fire again inside it
        signal.setitimer(signal.ITIMER_REAL, 1e-3)
        return
    if code is time_limit.__exit__.__code__:  # the body already returned: it made it in time
        return
    where = "" if frame is None else f" It was interrupted in {code.co_name} ({code.co_filename}:{frame.f_lineno})."
    raise _Expired(where)
