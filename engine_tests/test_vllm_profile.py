"""``specdec-bench profile-engine --engine vllm`` end to end against the installed vLLM (vLLM stage only).

Two tiny profiles on the wide exact pair through the command line (which runs
:mod:`specdec_bench.vllm_profile` in a child process with one OpenMP / numba thread): greedy with
``draft_model`` and ``ngram`` instances in one process (several ``vllm.LLM`` instances interleaved; every
speculative completion equals AR's token for token; the per-request counters agree with ``get_metrics()``), and
sampling with defect A patched (vLLM's acceptance then matches the exact expectation of the pair's tables). The
files are written and the verdict has the profile's format. Nothing asserts how fast vLLM is.
"""
from __future__ import annotations

import io
import json

try:  # these tests run only in the vLLM stage: a missing engine fails the stage, it is never skipped
    import vllm  # noqa: F401
except ImportError as exc:
    raise ImportError("engine_tests need vllm: build .venv-vllm with scripts/env.sh vllm and run them with "
                      ".venv-vllm/bin/python -m pytest engine_tests") from exc

from specdec_bench.cli import main

TINY = ["--prompts", "2", "--repeats", "2", "--new-tokens", "12", "--prompt-length", "8"]


def _profile(tmp_path, *extra):
    buffer = io.StringIO()
    status = main(["profile-engine", "--engine", "vllm", *TINY, *extra, "--out", str(tmp_path)], out=buffer)
    return status, buffer.getvalue(), json.loads((tmp_path / "engine-profile.json").read_text())


def test_greedy_draft_model_and_ngram_in_one_process(tmp_path):
    status, text, report = _profile(tmp_path, "--k", "2", "--ngram-k", "2", "--mode", "greedy")
    assert status == 0, text
    assert report["verdict"].startswith(("PAYS: ", "DOES NOT PAY: best ")) and report["verdict"] in text
    assert report["settings"]["omp_num_threads"] == "1" and report["settings"]["torch_threads_seen"] == 1
    assert "wide exact pair" in report["pair_reason"] and "8x512" in report["pair"]
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"k=2", "ngram k=2"}
    for r in rows.values():
        assert r["greedy_mismatches"] == 0 and r["calls"] == 4 and r["low"] <= r["measured"] <= r["high"]
        assert r["decode"] is not None and r["tokens_per_second"] > 0
    acc = rows["k=2"]["acceptance"]
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 2 * acc["drafts"] and 0 <= acc["alpha"] <= 1
    assert report["counter_check"]["variant"] == "ngram k=2" and report["counter_check"]["agree"], report["counter_check"]
    assert len(report["calls"]) == 12 and (tmp_path / "engine-profile.md").read_text().count(report["verdict"]) == 1


def test_sampling_patched_acceptance_matches_the_exact_law(tmp_path):
    status, text, report = _profile(tmp_path, "--k", "2", "--mode", "sampling", "--patch", "A")
    assert status == 0, text
    (row,) = report["rows"]
    eff = row["efficiency"]
    assert eff["passed"] is True and eff["verdict"] == "matches the exact expectation", eff
    assert row["greedy_mismatches"] is None and report["counter_check"]["agree"]
