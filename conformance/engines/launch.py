"""Starting a worker process (:func:`run_worker`): fresh, or forked from a warm interpreter, so that an engine's
imports are paid once per run, not once per worker.

A worker is its own process, in its own process group, per ``(configuration, family)`` (an engine crash or hang is
that job's failure, never the runner's). Starting it as a fresh interpreter repeats the engine's imports every time:
for vLLM they are most of a worker's start (``from vllm import LLM``: about three quarters of a load). An adapter
that names :attr:`~conformance.engines.adapter.EngineAdapter.preload_modules` gets a *zygote* instead: one process,
started in the adapter's interpreter for the whole run, that imports those modules (and the worker's) and then only
forks. Each worker is a fork of it, with what a fresh worker would have: its own session and process group (the
runner kills the group as before), its log on stdout and stderr, ``nice 10``, its CPU share, the runner's
environment, its arguments; it runs :func:`conformance.engines.worker.main` and exits with its return code.

Rules:

* the zygote imports only (and freezes what the imports made, :func:`conformance.heap.freeze_long_lived`: vLLM calls
  ``gc.collect()`` several times per engine start, each a second on its imports' objects): it never loads an
  engine, and forks only while it runs one Python thread (native thread pools such as OpenBLAS's stop and restart
  themselves across ``fork``); a request it cannot honour is answered with an error and the runner starts that
  worker fresh;
* a fork's intra-op threads are its own CPU share's count, as a fresh interpreter's are (the OpenMP runtime counts
  the CPUs once, when it loads: in the zygote, on every CPU; unset, two threads spun on one pinned CPU and vLLM's
  preemption cases ran 3 to 6 times slower);
* between the zygote and each worker sits a small monitor process (a fork too) that reports the worker's process id,
  then its exit status (``-N`` for a signal, as :class:`subprocess.Popen` does), on the request's connection;
* the zygote exits when the runner closes its stdin (the runner's death included), and the runner stops its group.

The verdicts do not depend on it: a forked worker runs the same code on the same inputs (the vLLM stage's steps are
checked against their recorded expectations with it).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from .adapter import REPO
from .waves import ControlPipe, WaveDriver, WorkerTimeout

__all__ = ["run_worker", "Zygote", "ForkedWorker", "warm", "active", "main"]

_ACTIVE: dict[str, "Zygote"] = {}  # the adapter's interpreter -> its zygote, while :func:`warm` holds it
MAX_FDS = 4


class _Replies:
    """The monitor's messages on one connection, a JSON object per line, read with a timeout."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buf = conn, b""

    def next(self, timeout: float | None = None) -> dict | None:
        """The next message; None when the other end closed first; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.time() + timeout
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.time())
            if not select.select([self.conn], [], [], left)[0]:
                raise TimeoutError
            data = self.conn.recv(1 << 16)
            if not data:
                return None
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


class ForkedWorker:
    """A worker forked by a zygote, seen from the runner as :class:`subprocess.Popen` is: ``pid`` (also its process
    group), :meth:`wait`."""

    def __init__(self, replies: _Replies, pid: int):
        self.replies, self.pid, self.returncode = replies, pid, None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        try:
            msg = self.replies.next(timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired("forked worker", timeout) from None
        self.returncode = int(msg["rc"]) if msg and "rc" in msg else -1  # the monitor vanished: a lost worker
        self.replies.conn.close()
        return self.returncode


class Zygote:
    """The runner's handle on one zygote process (:func:`warm` starts and stops it)."""

    def __init__(self, python: str, engine: str, cwd: Path, log: Path):
        self.dir = tempfile.mkdtemp(prefix="specdec-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.log = open(log, "w")
        self.proc = subprocess.Popen([python, "-m", "conformance.engines.launch", engine, self.path], cwd=str(cwd),
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.ready_s = None

    def wait_ready(self, timeout: float) -> str | None:
        """None once the zygote listens; else why not (it exited, or did not get ready in ``timeout`` seconds)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                return f"the zygote exited ({self.proc.returncode}): {_tail(self.log.name)}"
            if os.path.exists(self.path):
                self.ready_s = round(time.time() - t0, 1)
                return None
            time.sleep(0.2)
        return f"the zygote was not ready after {timeout:.0f} s"

    def spawn(self, argv: list[str], *, log_fd: int, control: tuple[int, int] | None, cpus,
              nice: int = 10) -> ForkedWorker:
        """Fork a worker running ``conformance.engines.worker`` with ``argv`` (``--control R,W`` is added with the
        worker's own numbers of ``control``'s descriptors). Raises ``OSError`` when the zygote does not fork it."""
        msg = {"argv": argv, "control": control is not None, "cpus": list(cpus) if cpus else None, "nice": nice,
               "env": dict(os.environ)}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        replies = _Replies(conn)
        try:
            conn.connect(self.path)
            socket.send_fds(conn, [json.dumps(msg).encode() + b"\n"], [log_fd, *(control or ())])
            reply = replies.next(60.0)
        except TimeoutError:
            reply = {"error": "the zygote did not answer in 60 s"}
        except OSError:
            conn.close()
            raise
        if not reply or "pid" not in reply:
            conn.close()
            raise OSError((reply or {}).get("error", "the zygote closed the connection"))
        return ForkedWorker(replies, int(reply["pid"]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def warm(ad, engine: str, python: str, cwd: Path, log: Path, timeout: float = 300.0):
    """While the block runs, workers of ``ad`` (``engine``: its name as the runner was given it) run in ``python``
    are forked from a zygote (:func:`active`) where the adapter preloads anything and ``SPECDEC_FRESH_WORKERS`` is
    unset; where there is none, the workers start fresh and the reason is printed."""
    if not ad.preload_modules or os.environ.get("SPECDEC_FRESH_WORKERS"):
        if ad.preload_modules:
            print("  workers start fresh: SPECDEC_FRESH_WORKERS is set", flush=True)
        yield None
        return
    z = Zygote(python, engine, cwd, log)
    why = z.wait_ready(timeout)
    if why:
        print(f"  workers start fresh: {why}", flush=True)
        z.close()
        yield None
        return
    print(f"  workers forked from a warm {ad.title} interpreter (its imports took {z.ready_s} s)", flush=True)
    _ACTIVE[python] = z
    try:
        yield z
    finally:
        _ACTIVE.pop(python, None)
        z.close()


def active(python: str) -> Zygote | None:
    return _ACTIVE.get(python)


def run_worker(engine: str, python: str, cfg: str, raw: Path, *, patch: str, family: str, cases: str = "",
                split: bool = False, scale: float = 1.0, timeout: float, driver: WaveDriver | None = None,
                cpus: tuple[int, ...] | None = None) -> dict:
    """One worker process: it generates in the waves ``driver`` asks for (:mod:`conformance.engines.waves`), else every
    case in one wave; its state (``worker.json``), with what the runner saw (timeouts, exit, the waves' verdicts).
    ``cpus``: the CPUs the worker (and every thread and process it starts) may run on."""
    args = [engine, "--config", cfg, "--raw", str(raw), "--scale", str(scale), "--family", family]
    args += ["--patch", patch] if patch else []
    args += ["--cases", cases] if cases else []
    args += ["--split"] if split else []
    cmd = [python, "-m", "conformance.engines.worker", *args]
    raw.mkdir(parents=True, exist_ok=True)
    log = open(raw / ("worker-split.log" if split else "worker.log"), "w")
    pipe, child_fds = None, ()
    if driver is not None:  # the control pipes: runner -> worker (waves), worker -> runner (what it did)
        worker_reads, runner_writes = os.pipe()
        runner_reads, worker_writes = os.pipe()
        child_fds = (worker_reads, worker_writes)
        cmd += ["--control", f"{worker_reads},{worker_writes}"]
        pipe = ControlPipe(runner_writes, runner_reads)
    t0 = time.time()
    proc, zygote = None, active(python)
    if zygote is not None:  # a fork of the warm interpreter (it sets its own CPU share before anything runs)
        try:
            proc = zygote.spawn(args, log_fd=log.fileno(), control=child_fds or None, cpus=cpus)
        except OSError as e:
            print(f"  [{cfg}/{family}] the zygote did not fork this worker ({e}): starting it fresh", flush=True)
    if proc is None:
        proc = subprocess.Popen(["nice", "-n", "10", *cmd], cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, pass_fds=child_fds)
        if cpus:  # before the engine starts its threads (they inherit the mask)
            try:
                os.sched_setaffinity(proc.pid, cpus)
            except OSError:
                pass
    for fd in child_fds:
        os.close(fd)
    timed_out = False
    try:
        if driver is not None:
            driver.drive(pipe, t0 + timeout)
        rc = proc.wait(timeout=max(t0 + timeout - time.time(), 1.0))
    except (subprocess.TimeoutExpired, WorkerTimeout):
        timed_out = True
        rc = None
    finally:  # the whole group (a server the worker started included) is stopped, whatever happened
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rc = proc.wait() if rc is None else rc
        if pipe is not None:
            pipe.close()
    log.close()
    state_path = raw / "worker.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"cases": {}}
    state.update(rc=rc, timed_out=timed_out, wall_s=round(time.time() - t0, 1))
    if driver is not None:
        state["verdicts"], state["waves"] = dict(driver.verdicts), list(driver.waves)
    if timed_out or rc != 0:
        tail = _tail(log.name)  # the path it was opened with
        why = f"worker {'timed out after %ds' % timeout if timed_out else 'exited %s' % rc}"
        state.setdefault("error", why + (": " + tail if tail else ""))
        for name, c in state["cases"].items():
            if c.get("status") in ("pending", "running"):
                c.update(status="timeout" if timed_out else "engine_error", error=state["error"])
    return state



# ---------------------------------------------------------------------------------------------- the zygote's side
def _read_request(conn: socket.socket, fds: list) -> dict | None:
    """The runner's request (one line; its descriptors arrive with its first bytes, appended to ``fds``)."""
    buf = b""
    while not buf.endswith(b"\n"):
        if not buf:
            data, got, _, _ = socket.recv_fds(conn, 1 << 20, MAX_FDS)
            fds.extend(got)
        else:
            data = conn.recv(1 << 20)
        if not data:
            return None
        buf += data
    return json.loads(buf)


def _send(conn: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(msg).encode() + b"\n")


def _tail(path: str, n: int = 3) -> str:
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-n:])[-300:]
    except OSError:
        return ""


def _run_worker_here(msg: dict, fds: list[int]) -> int:
    """In the forked worker: become what a fresh worker process would be, run the worker, return its code."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.nice(int(msg.get("nice") or 0))
    if msg.get("cpus"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, msg["cpus"])
    if "torch" in sys.modules:  # OpenMP counted the CPUs when it loaded, in the zygote: count the fork's own
        sys.modules["torch"].set_num_threads(max(1, len(os.sched_getaffinity(0))))
    os.environ.clear()
    os.environ.update(msg["env"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[0], 2)
    os.close(fds[0])
    argv = list(msg["argv"])
    if msg.get("control"):
        argv += ["--control", f"{fds[1]},{fds[2]}"]
    from conformance.engines.worker import main as worker_main

    sys.argv = ["conformance.engines.worker", *argv]
    try:
        rc = worker_main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a fresh interpreter
        traceback.print_exc()
        rc = 1
    return int(rc or 0)


def _serve_one(conn: socket.socket, msg: dict, fds: list[int]) -> None:
    """In the monitor: fork the worker, report its pid, wait for it, report its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        rc = 1
        try:
            rc = _run_worker_here(msg, fds)
        finally:
            with contextlib.suppress(Exception):
                atexit._run_exitfuncs()  # what a fresh interpreter runs at exit (the engine's shutdown hooks)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(rc & 0xFF if rc >= 0 else 1)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    _, status = os.waitpid(pid, 0)
    _send(conn, {"rc": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)})


def main(argv=None) -> int:
    """``python -m conformance.engines.launch ENGINE SOCKET``: preload, listen on ``SOCKET``, fork on request."""
    engine, path = (argv or sys.argv[1:])[:2]
    t0 = time.time()
    from conformance.engines.adapter import adapter as get_adapter

    get_adapter(engine).preload()
    import conformance.engines.worker  # noqa: F401 - the worker's own imports, once
    from conformance.heap import freeze_long_lived

    freeze_long_lived()  # the imports' objects out of the collector's reach (conformance.heap)
    print(f"zygote {engine}: preloaded in {time.time() - t0:.1f} s ({gc.get_freeze_count()} objects frozen)",
          flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(16)
    os.rename(path + ".tmp", path)  # the runner sees the socket only once it accepts
    while True:
        ready, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 16):
            return 0  # the runner closed its end (or died)
        if server not in ready:
            continue
        conn, _ = server.accept()
        fds: list[int] = []
        try:
            msg = _read_request(conn, fds)
            expected = 3 if msg and msg.get("control") else 1
            if msg is None or len(fds) != expected:
                raise ValueError(f"a request with {len(fds)} descriptors (expected {expected})")
            if threading.active_count() != 1:
                raise RuntimeError(f"the zygote runs {threading.active_count()} Python threads: it does not fork")
            sys.stdout.flush()
            if os.fork() == 0:
                server.close()
                try:
                    _serve_one(conn, msg, fds)
                finally:
                    os._exit(0)
        except Exception as e:  # noqa: BLE001 - the runner starts this worker fresh
            _send(conn, {"error": f"{type(e).__name__}: {e}"})
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
