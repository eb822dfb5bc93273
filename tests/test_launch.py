"""Workers forked from a warm interpreter (conformance.engines.launch) give the fresh workers' verdicts, and every
failure a fresh worker names (a crash, a hang killed with its group) is named the same way.

Bug classes: a forked worker that inherits the warm interpreter's state instead of its own (its log, its arguments,
its process group: a hang no longer killed, a crash lost as a pass); a zygote that fails silently (a run that hangs
waiting for it, or verdicts without workers)."""
from __future__ import annotations

import json
import time

import pytest

from conformance.engines import runner

pytestmark = pytest.mark.xdist_group("fake_engine")
SCALE = "0.05"


def _levels(results, cfg):
    return {name: c["level"] for name, c in results["configs"][cfg]["cases"].items()}


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_forked_and_fresh_workers_give_the_same_verdicts_and_name_crashes_and_hangs(tmp_path, capsys, monkeypatch,
                                                                                    fresh):
    """The fake engine's runs elsewhere in tests/ fork their workers; here both ways, on its exact, biased, crashing
    and hanging configurations."""
    if fresh:
        monkeypatch.setenv("SPECDEC_FRESH_WORKERS", "1")
    t0 = time.time()
    # the hang runs alone, under a timeout it cannot pass whatever the machine: the other workers do not wait for it
    rc_hang = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path / "hang"), "--scale", SCALE,
                           "--configs", "hang", "--timeout", "4"])
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path), "--scale", SCALE, "--jobs", "2",
                      "--configs", "control,spec,biased,crash", "--timeout", "120"])
    printed = capsys.readouterr().out
    assert rc == rc_hang == 0 and "starting it fresh" not in printed, printed
    if fresh:
        assert "workers start fresh: SPECDEC_FRESH_WORKERS is set" in printed and not (tmp_path / "zygote.log").exists()
    else:
        assert "workers forked from a warm Fake engine interpreter" in printed, printed
        assert "zygote specdec_fixtures.engines:FAKE: preloaded" in (tmp_path / "zygote.log").read_text()
    results = json.loads((tmp_path / "verdicts.json").read_text())
    for cfg in ("control", "spec"):
        assert set(_levels(results, cfg).values()) <= {"certified", "reduced"}, _levels(results, cfg)
    assert all(c["identity"]["passed"] for n, c in results["configs"]["spec"]["cases"].items() if n != "temperature")
    assert results["configs"]["biased"]["cases"]["warp"]["level"] == "not_certified"
    crash = results["configs"]["crash"]["cases"]["temperature"]
    assert crash["level"] == "engine_error" and "segfault-like" in crash["headline"]  # its log: the fork's own
    hang = json.loads((tmp_path / "hang" / "verdicts.json").read_text())["configs"]["hang"]["cases"]["temperature"]
    assert hang["level"] == "timeout" and "timed out after 4s" in hang["headline"]
    assert time.time() - t0 < 120


def test_a_zygote_that_cannot_start_leaves_the_workers_fresh_and_says_why(tmp_path, capsys):
    rc = runner.main(["specdec_fixtures.engines:FAKE_COLD", "--out", str(tmp_path), "--scale", SCALE, "--configs", "control"])
    printed = capsys.readouterr().out
    assert rc == 0 and "workers start fresh: the zygote exited" in printed and "no_such_module" in printed, printed
    results = json.loads((tmp_path / "verdicts.json").read_text())
    assert set(_levels(results, "control").values()) <= {"certified", "reduced"}


def test_a_forked_worker_runs_in_its_own_process_group_with_its_own_arguments(tmp_path):
    """The fork is what a fresh worker is: its own session (the runner kills its group), its own arguments, its exit
    status (a signal as -N)."""
    import os
    import signal
    import sys

    from conformance.engines.launch import Zygote
    from conformance.engines.adapter import REPO

    z = Zygote(sys.executable, "specdec_fixtures.engines:FAKE", REPO, tmp_path / "zygote.log")
    try:
        assert z.wait_ready(120) is None
        log, t0 = open(tmp_path / "worker.log", "w"), time.time()
        proc = z.spawn(["specdec_fixtures.engines:FAKE", "--config", "hang", "--raw", str(tmp_path / "raw"),
                        "--family", "order1", "--scale", SCALE], log_fd=log.fileno(), control=None, cpus=None)
        with pytest.raises(Exception) as e:
            proc.wait(timeout=3)
        assert type(e.value).__name__ == "TimeoutExpired"
        assert os.getpgid(proc.pid) == proc.pid != z.proc.pid
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        log.close()
        state = json.loads((tmp_path / "raw" / "worker.json").read_text())  # written by the fork, from its arguments
        assert state["config"] == "hang" and state["family"] == "order1" and state["started"] > t0, state
    finally:
        z.close()
    assert z.proc.returncode is not None


def test_a_forked_worker_has_the_intra_op_threads_of_its_cpu_share(tmp_path):
    """Bug class: a fork keeps the zygote's OpenMP thread count (counted on every CPU when the runtime loaded), so a
    worker pinned to one CPU spins two threads on it (vLLM's preemption cases ran 3 to 6 times slower). A fresh
    interpreter pinned to the same CPUs is the reference."""
    import os
    import subprocess
    import sys

    from conformance.engines.adapter import REPO
    from conformance.engines.launch import Zygote

    cpus = sorted(os.sched_getaffinity(0))[:1]
    fresh = subprocess.run([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {cpus}); import torch; "
                            "print(torch.get_num_threads())"], capture_output=True, text=True, check=True)
    z = Zygote(sys.executable, "specdec_fixtures.engines:FAKE_THREADS", REPO, tmp_path / "zygote.log")
    try:
        assert z.wait_ready(120) is None
        with open(tmp_path / "worker.log", "w") as log:
            proc = z.spawn(["specdec_fixtures.engines:FAKE_THREADS", "--config", "threads", "--raw", str(tmp_path / "raw"),
                            "--family", "order1", "--scale", SCALE], log_fd=log.fileno(), control=None, cpus=cpus)
            proc.wait(timeout=120)
    finally:
        z.close()
    state = json.loads((tmp_path / "raw" / "worker.json").read_text())
    assert state["families"]["order1"]["error"].endswith(f"torch threads {int(fresh.stdout)}"), state["families"]
