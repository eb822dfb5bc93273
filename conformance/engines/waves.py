"""Waves: the runner tells an engine worker how many completions of each case to generate next, and stops a case at
the first look that decides it.

Engine-neutral. Each sampling case is certified at the black-box tool's planned looks (:mod:`conformance.samples.looks`:
an interim look on 5 % of its N, early-pass looks on 25-70 %, the full look on 1.07 x N): a wave brings every case
still undecided to its next look's number of completions, and after the wave each such case's file is certified
(:class:`conformance.samples.growing.GrowingFile`) -- rejected, passed, or on to the next look. A greedy case (every
completion checked token for token) is one wave of its N. While some case still runs, every decided case adds a few
completions to each wave (:meth:`WaveDriver.mixers`), written after the lines its verdict read, so that every step
mixes every case's settings as one batch of every case did (an engine's batch bugs depend on which settings share a
step). Invariant: the verdict the runner records is the one
:func:`conformance.samples.certify_samples` gives the case's file with the same looks, however the waves were cut.
"""
from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path

__all__ = ["case_looks", "WaveDriver", "ControlPipe", "WorkerTimeout"]


def case_looks(case, scale: float = 1.0):
    """The planned looks of a case at ``scale`` of its requests: sampling, looks planned for its N; greedy, one look
    on all of its N."""
    from conformance.samples.looks import Looks

    n = max(1, int(round(case.n * scale)))
    return Looks.whole(n) if case.greedy else Looks(n)


class WorkerTimeout(Exception):
    """The worker did not answer before its deadline."""


class ControlPipe:
    """The runner's end of a worker's control pipes: one JSON object per line each way."""

    def __init__(self, tx: int, rx: int):
        self.tx, self.rx, self.buffer = tx, rx, b""

    def send(self, message: dict) -> None:
        try:
            os.write(self.tx, (json.dumps(message) + "\n").encode())
        except (BrokenPipeError, OSError):  # the worker is gone: its state file says why
            pass

    def receive(self, deadline: float) -> dict | None:
        """The worker's next message, or None when it closed its end (it exited); :class:`WorkerTimeout` at the
        deadline."""
        while b"\n" not in self.buffer:
            left = deadline - time.time()
            if left <= 0:
                raise WorkerTimeout()
            ready, _, _ = select.select([self.rx], [], [], left)
            if not ready:
                raise WorkerTimeout()
            chunk = os.read(self.rx, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        for fd in (self.tx, self.rx):
            try:
                os.close(fd)
            except OSError:
                pass


class WaveDriver:
    """The waves of one worker: which completions each case needs next, from its looks so far.

    ``cases``: the worker's cases under the engine's conventions; ``scale``: the share of every case's requests
    this run generates; ``one_at_a_time``: a worker that runs one batch per case (after a crash, to attribute it)
    gets one case per wave, each to its decision before the next (the cases without top-k or top-p first, as it
    orders them), so a case that crashes the engine stops only the cases after it. After :meth:`drive`,
    :attr:`verdicts` holds each decided case's verdict and :attr:`waves` what each wave asked for."""

    def __init__(self, cases, raw: Path, scale: float = 1.0, one_at_a_time: bool = False):
        cases = sorted(cases, key=lambda c: bool(c.sampling.top_k or c.sampling.top_p)) if one_at_a_time else cases
        self.one_at_a_time = one_at_a_time
        self.cases = {c.name: c for c in cases}
        self.raw, self.scale = Path(raw), scale
        self.files: dict = {}
        self.verdicts: dict = {}
        self.errors: dict[str, str] = {}
        self.waves: list[dict[str, int]] = []

    def _file(self, name: str):
        from conformance.samples.growing import GrowingFile

        if name not in self.files:
            c = self.cases[name]
            self.files[name] = GrowingFile(self.raw / f"{name}.jsonl", looks=case_looks(c, self.scale), model=c.model,
                                           sampling=c.sampling, max_new_tokens=c.max_new_tokens,
                                           eos_id=True if c.eos else None, stop=c.stop_rule(),
                                           pool_prompts=c.pooled)
        return self.files[name]

    def next_wave(self, statuses: dict) -> dict[str, int]:
        """``{case: completions it needs in all}`` for every case that is ``ok`` (or not started) and undecided."""
        wave = {}
        for name in self.cases:
            status = (statuses.get(name) or {}).get("status")
            if name in self.verdicts or name in self.errors or status not in ("ok", "pending", None):
                continue
            f = self._file(name)
            if status == "ok":
                try:
                    verdict = f.update()
                except Exception as exc:  # noqa: BLE001 - an unusable file: the runner's certification says why
                    self.errors[name] = f"{type(exc).__name__}: {exc}"
                    continue
                if f.decided:
                    self.verdicts[name] = verdict
                    continue
                asked = self.waves[-1].get(name) if self.waves else None
                if asked is not None and (statuses.get(name) or {}).get("n", 0) < asked:
                    self.errors[name] = f"the worker wrote {statuses[name].get('n')} lines of the {asked} asked for"
                    continue
            wave[name] = f.next_n
            if self.one_at_a_time:
                break
        if wave and not self.one_at_a_time:  # every step keeps mixing every case's settings, as one batch did
            for name in self.cases:
                status = statuses.get(name) or {}
                if name not in wave and status.get("status") == "ok" and name in self.verdicts:
                    wave[name] = int(status.get("n") or 0) + self.mixers(name)
        return wave

    def mixers(self, name: str) -> int:
        """Completions a decided case adds to each later wave: as many as its first look read (5 % of its N; a greedy
        case, all of it). They keep every wave's batch as mixed as one batch of every case was (an engine's batch
        bugs depend on which settings share a step), and are written after the lines its verdict read."""
        return self._file(name).looks.schedule(self.cases[name].greedy)[0].n

    def drive(self, pipe: ControlPipe, deadline: float) -> None:
        """Answer the worker until it has nothing left to generate (then ``stop``) or it exits."""
        message = pipe.receive(deadline)
        while message is not None:
            if message.get("event") in ("ready", "wave_done") and message.get("alive", True):
                wave = self.next_wave(message.get("cases") or {})
                if not wave:
                    pipe.send({"stop": True})
                    return
                self.waves.append(wave)
                pipe.send({"wave": wave})
            elif message.get("alive") is False:  # the engine died in this wave: the cases it finished are judged,
                self.next_wave(message.get("cases") or {})  # nothing more is asked of it
                pipe.send({"stop": True})
                return
            message = pipe.receive(deadline)
