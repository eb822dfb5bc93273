"""The engine stages' shared shell library (scripts/stage_lib.sh) and driver (scripts/stage.sh).

Every stage prints and writes the time of each of its steps (the engine-neutral budget CI reads), stops every process
it started when it ends, on failure too, and says that it failed; an engine without a folder is a usage error.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_stage_times_its_steps_and_stops_what_it_started_even_when_it_fails(tmp_path):
    script = tmp_path / "stage.sh"
    pidfile = tmp_path / "child.pid"
    script.write_text(f"""set -euo pipefail
STAGE_TITLE=demo
OUT={tmp_path}
source {REPO}/scripts/stage_lib.sh
step "first"
sleep 1
timed inner sleep 1
step "second"
sleep 300 &
echo $! > {pidfile}
false
""")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "=== demo stage: first" in proc.stdout and "=== demo stage: second" in proc.stdout
    times = (tmp_path / "step-times.txt").read_text()
    assert "demo stage:" in times and "(exit 1)" in times
    assert "first" in times and "second" in times and "inner (within: first)" in times, times
    assert "stage demo: FAILED (exit 1)" in proc.stderr
    pid = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the stage left its background process running")


def test_every_engine_folder_has_a_stage_and_an_environment_and_ci_names_them():
    engines = sorted(p.parent.name for p in (REPO / "conformance" / "engines").glob("*/stage.sh"))
    assert engines == sorted(p.parent.name for p in (REPO / "conformance" / "engines").glob("*/env.sh"))
    ci = (REPO / ".ci" / "run").read_text()
    line = next(x for x in ci.splitlines() if x.startswith("ENGINES="))
    assert sorted(w.split(":")[0] for w in line.split("=", 1)[1].strip('"').split()) == engines
    for f in [REPO / "scripts" / "stage.sh", REPO / "scripts" / "stage_lib.sh", *(REPO / "conformance" / "engines").glob("*/*.sh")]:
        subprocess.run(["bash", "-n", str(f)], check=True)


def test_an_unknown_engine_is_a_usage_error(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "stage.sh"), "no-such-engine", str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "no engine 'no-such-engine'" in proc.stderr
    proc = subprocess.run(["bash", str(REPO / "scripts" / "env.sh"), "no-such-engine"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
