"""The vLLM black-box runner against the installed vLLM (vLLM stage only: needs ``.venv-vllm``).

A reduced matrix (``--scale``: a few hundred completions per case, one draft-model configuration and the
control), or the full matrices the vLLM stage has just run (``SPECDEC_VLLM_ENGINE_RUNS=DIR`` holding the runner's
``engine-unpatched``, ``engine-patch-A`` and ``engine-patch-AC`` outputs: the same assertions, without running vLLM
twice), checks the
runner end to end: the worker writes valid black-box files, the control is never NOT
CERTIFIED, the efficiency counters are read, defect A shows in the counters unpatched (acceptance far below the
exact expectation) and the patch restores it, and ``--check-expected`` refuses reduced runs. The full matrix
(``python -m conformance.engines vllm --out DIR --check-expected``) is the certification itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:  # these tests run only in the vLLM stage: a missing engine fails the stage, it is never skipped
    import vllm  # noqa: F401
except ImportError as exc:
    raise ImportError("engine_tests need vllm: build .venv-vllm with scripts/env.sh vllm and run them with "
                      ".venv-vllm/bin/python -m pytest engine_tests") from exc

SCALE = "0.02"
#: the vLLM stage's full-matrix outputs (scripts/stage.sh vllm), used instead of reduced runs when set
RUNS = os.environ.get("SPECDEC_VLLM_ENGINE_RUNS")


def _finished(name: str):
    """A full run the stage already made (``RUNS/name``): its verdicts and folder; it must exist when RUNS is set."""
    out = Path(RUNS) / name
    path = out / "verdicts.json"
    assert path.is_file(), f"SPECDEC_VLLM_ENGINE_RUNS={RUNS}: no {path} (run the matrix first, as scripts/stage.sh vllm does)"
    return json.loads(path.read_text()), out


def _run(tmp_path, *extra, configs="control,draft-prob"):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "conformance.engines", "vllm", "--out", str(out), "--configs", configs,
           "--scale", SCALE, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "verdicts.json").read_text()), out


@pytest.fixture(scope="module")
def unpatched(tmp_path_factory):
    return _finished("engine-unpatched") if RUNS else _run(tmp_path_factory.mktemp("unpatched"))


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    return _finished("engine-patch-A") if RUNS else _run(tmp_path_factory.mktemp("patched"), "--patch", "A,B")


@pytest.fixture(scope="module")
def heads_patched(tmp_path_factory):
    return _finished("engine-patch-AC") if RUNS else _run(tmp_path_factory.mktemp("heads"), "--patch", "A,C",
                                                          configs="eagle,medusa,eagle3")


def test_proposer_heads_rounds_equal_the_counters_and_defect_a_breaks_them(unpatched, heads_patched):
    """The EAGLE, EAGLE-3 and Medusa heads with A and C patched: every round the completions show is the one vLLM
    counted; unpatched (the stage's full run) the rounds differ (a rejected one-hot draft comes back as its
    replacement)."""
    for cfg in ("eagle", "medusa", "eagle3"):
        rounds = heads_patched[0]["configs"][cfg]["rounds"]
        assert rounds["passed"] is True and rounds["per_request"], rounds["text"]
        if RUNS:
            assert unpatched[0]["configs"][cfg]["rounds"]["passed"] is False


def test_control_is_never_rejected(unpatched):
    results, out = unpatched
    for name, c in results["configs"]["control"]["cases"].items():
        # a few hundred completions: CERTIFIED (reduced power) or INCONCLUSIVE, never NOT CERTIFIED
        assert c["level"] in ("certified", "reduced", "inconclusive"), (name, c["headline"])
        lines = [json.loads(x) for x in open(c["file"])]
        assert all(set(r) >= {"prompt_ids", "completion_ids", "seed", "finish_reason"} for r in lines)
    assert (out / "verdicts.md").read_text().count("| control |") == len(results["configs"]["control"]["cases"])


def test_defect_a_shows_in_the_counters_and_the_patch_restores_them(unpatched, patched):
    before = unpatched[0]["configs"]["draft-prob"]["efficiency"]
    after = patched[0]["configs"]["draft-prob"]["efficiency"]
    assert before["passed"] is False and before["failing"], before["verdict"]
    assert after["passed"] is True, after["verdict"]
    assert after["acceptance_per_token"] > 0.7 > before["acceptance_per_token"]


def test_min_p_is_refused_with_speculation(unpatched):
    c = unpatched[0]["configs"]["draft-prob"]["cases"]["min-p"]
    assert c["level"] == "refused" and "min_p" in c["headline"]


def test_logit_bias_is_refused_with_speculation_and_applied_without(unpatched):
    """vLLM refuses logit_bias with any speculative configuration (SamplingParams verification), and applies it without."""
    c = unpatched[0]["configs"]["draft-prob"]["cases"]["logit-bias"]
    assert c["level"] == "refused" and "logit_bias" in c["headline"]
    assert unpatched[0]["configs"]["control"]["cases"]["logit-bias"]["level"] in ("certified", "reduced", "inconclusive")


def test_reduced_runs_cannot_check_expectations(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "conformance.engines", "vllm", "--out", str(tmp_path), "--scale", "0.1",
                           "--check-expected"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--scale 1" in proc.stderr
