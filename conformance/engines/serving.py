"""An engine's HTTP server as a child process: started on 127.0.0.1, waited for, called, stopped.

Engine-neutral (the vLLM and llama.cpp adapters start their servers through it). Rules: a server listens on 127.0.0.1
only, on a free port, in the caller's process group (the runner's group kill stops it too, never a new session); it
is healthy when its health path answers 200 within the start timeout, else the start fails with its log's last lines
(a port taken between choosing and binding it is retried on another, twice);
:meth:`HttpServer.stop` terminates it (kill after 10 s) and is safe to call twice; the log folder it made itself (no
``log_dir`` given) is removed by ``stop`` and by a failed start, after the failure's text is read, so a run leaves
nothing behind in the temporary folder; every call has a timeout; a dropped
keep-alive connection is retried once on a new one; a non-200 answer raises with the body's start.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["free_port", "HttpServer", "sse_events"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_events(data: bytes, what: str = "the server") -> list[dict]:
    """The JSON events of a server-sent-events body (``data: {...}`` lines; ``[DONE]`` ends it); raises naming
    ``what`` on an event that is not JSON."""
    events = []
    for line in data.decode("utf-8").splitlines():
        if not line.startswith("data: ") or line[6:].strip() == "[DONE]":
            continue
        try:
            events.append(json.loads(line[6:]))
        except json.JSONDecodeError as exc:
            raise RuntimeError(f"{what} streamed an event that is not JSON: {line[:200]!r}") from exc
    return events


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (``/proc``; empty where there is none to read)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class HttpServer:
    """``command`` (a list, ``{port}`` replaced by the chosen port) run as a server; ``health``: the path that answers
    200 once it serves."""

    def __init__(self, name: str, command: list[str], *, health: str = "/health", env: dict | None = None,
                 start_timeout_s: float = 180.0, request_timeout_s: float = 120.0, log_dir: str | None = None):
        self.name, self.command, self.health, self.env = name, list(command), health, env
        self.start_timeout_s, self.request_timeout_s = start_timeout_s, request_timeout_s
        self._own_dir = None if log_dir else Path(tempfile.mkdtemp(prefix=f"specdec-{name}-"))
        folder = Path(log_dir) if log_dir else self._own_dir
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{name}-{os.getpid()}-{id(self)}.log"
        self.proc, self.port, self._local, self._log = None, None, threading.local(), None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def log_tail(self, n: int = 8) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def failure_text(self) -> str:
        """What a failed start says after its cause (default: the log's last lines)."""
        return self.log_tail()

    def start(self) -> None:
        for attempt in range(3):
            self.port = free_port()
            cmd = [a.replace("{port}", str(self.port)) for a in self.command]
            self._log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(self.env or {})})
            t0 = time.time()
            while time.time() - t0 < self.start_timeout_s:
                if self.proc.poll() is not None:
                    break
                try:
                    c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    c.request("GET", self.health)
                    ok = c.getresponse().status == 200
                    c.close()
                    if ok:
                        return
                except OSError:
                    pass
                time.sleep(0.1)
            code = self.proc.poll()
            self._terminate()
            if "bind" not in self.log_tail(20).lower():  # a port race is retried, anything else is the failure
                break
        why = f"exited with {code}" if code is not None else f"not healthy after {self.start_timeout_s:.0f} s"
        text = self.failure_text()
        self.stop()
        raise RuntimeError(f"{self.name} server {why}: {text}")

    def call(self, method: str, path: str, body: dict | bytes | None = None, timeout: float | None = None) -> bytes:
        """The answer's body (``body``: JSON-encoded when a dict); raises naming the call on anything but 200."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        for attempt in (0, 1):
            c = getattr(self._local, "conn", None)
            if c is None:
                c = self._local.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                                  timeout=timeout or self.request_timeout_s)
            try:
                c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
                r = c.getresponse()
                out = r.read()
            except (ConnectionError, http.client.HTTPException) as exc:  # a dropped keep-alive: one new connection
                c.close()
                self._local.conn = None
                if attempt or (self.proc is not None and self.proc.poll() is not None):
                    raise RuntimeError(f"{self.name} {method} {path}: {exc}; server log: {self.log_tail()}") from exc
                continue
            if r.status != 200:
                raise RuntimeError(f"{self.name} {method} {path}: HTTP {r.status}: {out[:300]!r}")
            return out
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Terminate the server (kill after 10 s), then any process it started that outlived it; remove the log
        folder it made."""
        self._terminate()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def _terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            children = _descendants(self.proc.pid)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            for pid in children:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        if self._log is not None:
            self._log.close()
            self._log = None
