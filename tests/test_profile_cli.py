"""``specdec-bench profile`` end to end on a tiny configuration of the trained pair: the text report, JSON, Markdown
and the three plots are written (no assertion on speed)."""
from __future__ import annotations

import io
import json
import sys

import pytest

from specdec_bench.cli import main
from specdec_bench.profile_plots import PlotsUnavailable, write_plots

ARGS = ["profile", "--k", "1,2", "--prompts", "2", "--repeats", "1", "--new-tokens", "8", "--prompt-length", "8",
        "--contexts", "8,16,1000", "--context-repeats", "1", "--cost-seconds", "0.003"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("profile")
    buffer = io.StringIO()
    status = main(ARGS + ["--out", str(out_dir), "--json", str(out_dir / "cli.json")], out=buffer)
    return status, buffer.getvalue(), out_dir


def test_prints_verdict_tables_and_sweep(run):
    status, text, _ = run
    assert status == 0  # greedy speculative output equals AR
    verdict = text.strip().splitlines()[-2 if text.strip().endswith(".json") else -1]
    assert verdict.startswith(("PAYS: ", "DOES NOT PAY: best "))
    for heading in ("== Verdict", "== Costs", "== Speedup per k", "== Phases per decode round", "== Prefill, timed apart",
                    "== Context scaling at k=", "== Memory and correctness"):
        assert heading in text
    assert "phase check over 4 calls" in text and "dropped (beyond the pair's 256 positions): [1000]" in text


def test_writes_json_markdown_and_plots(run):
    _, _, out_dir = run
    report = json.loads((out_dir / "profile.json").read_text())
    assert [r["k"] for r in report["model"]["rows"]] == [1, 2]
    assert [r["context"] for r in report["context"]["rows"]] == [8, 16]
    assert report["greedy_mismatches"] == 0 and report["phase_check"]["reported"]
    for key in ("speedup_vs_k", "phases", "speedup_vs_context"):
        path = out_dir / f"profile-{key.replace('speedup_vs_k', 'speedup-k').replace('speedup_vs_context', 'context')}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", key
    md = (out_dir / "profile.md").read_text()
    assert md.startswith("# Speedup profile") and "![phases](profile-phases.png)" in md and report["verdict"] in md
    cli = json.loads((out_dir / "cli.json").read_text())
    assert cli["command"] == "profile" and cli["report"]["verdict"] == report["verdict"] and len(cli["rows"]) == 2


def test_plots_say_what_is_missing(run, monkeypatch):
    _, _, out_dir = run
    report = json.loads((out_dir / "profile.json").read_text())
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotsUnavailable, match=r"pip install -e '.\[plots\]'"):
        write_plots(report, out_dir, "again")


def test_a_report_without_context_sweep_plots_two_pictures(run, tmp_path):
    _, _, out_dir = run
    report = json.loads((out_dir / "profile.json").read_text())
    report["context"] = None  # --contexts none
    assert sorted(write_plots(report, tmp_path, "bare")) == ["phases", "speedup_vs_k"]
