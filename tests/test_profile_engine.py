"""``specdec-bench profile-engine``'s pure part on a fake engine with known costs on a virtual clock (no vLLM): the
interleaving, the shared seeds, the paired ratios and their intervals, the acceptance from per-request counters,
the verdict lines, the report files and the command line. The real engine is exercised by
engine_tests/test_vllm_profile.py (vLLM stage). Nothing here asserts how fast a real engine is.
"""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

import specdec_bench.profile_engine as pe
import specdec_bench.profile_timing
from specdec_bench.cli import main
from specdec_bench.profile_report import markdown_report, text_report
from specdec_bench import vllm_profile

MS = 1e-3
PREFILL = 30 * MS
#: seconds per token after the first, per variant: k=1 pays 1.25x, k=2 2x, ngram k=3 loses (0.8x) in decode time
COST = {"ar": 10 * MS, "k=1": 8 * MS, "k=2": 5 * MS, "ngram k=3": 12.5 * MS}
#: per request: 10 rounds with drafts, accepted-draft histogram -> accepted_per_pos
COUNTERS = {"k=1": dict(drafts=10, draft_tokens=10, accepted=8, accepted_per_pos=[8]),
            "k=2": dict(drafts=10, draft_tokens=20, accepted=15, accepted_per_pos=[8, 7]),
            "ngram k=3": dict(drafts=10, draft_tokens=30, accepted=3, accepted_per_pos=[2, 1, 0])}
NEW = 16


class VirtualClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeEngine:
    """Spends PREFILL + (tokens - 1) x COST[variant] on the virtual clock per request, times a load factor that
    changes with every (unit, repeat) but is the same for every variant of it (the pairing must cancel it)."""

    def __init__(self, clock: VirtualClock, *, wrong: str | None = None):
        self.clock, self.wrong, self.calls = clock, wrong, []

    def generate(self, variant, prompts, seeds):
        self.calls.append((variant.label, [list(p) for p in prompts], seeds))
        load = 1.0 + 0.37 * (sum(map(sum, prompts)) % 5) + 0.11 * ((seeds or [0])[0] % 7)
        out = []
        for p in prompts:
            first = self.clock.t + PREFILL * load
            self.clock.t = first + (NEW - 1) * COST[variant.label] * load
            tokens = [(t + len(p)) % 8 for t in range(NEW)]
            if variant.label == self.wrong:
                tokens[-1] += 1
            out.append(pe.Completion(tokens, first, self.clock.t, COUNTERS.get(variant.label)))
        return out


@pytest.fixture
def clock(monkeypatch):
    c = VirtualClock()
    monkeypatch.setattr(specdec_bench.profile_timing, "CLOCK", c)
    return c


UNITS = [[[1, 2, 3]], [[4, 0, 2]], [[5, 5, 1]]]
VARIANTS = pe.variants_for([2, 1, 2], ngram_k=3)


def _run(clock, *, sampled=True, repeats=4, wrong=None, units=UNITS):
    engine = FakeEngine(clock, wrong=wrong)
    runs = pe.run_interleaved(engine, VARIANTS, units, repeats=repeats, sampled=sampled, seed=3, warmup=2)
    return engine, runs


def test_variants_and_labels():
    assert [v.label for v in VARIANTS] == ["ar", "k=1", "k=2", "ngram k=3"]
    assert [v.label for v in pe.variants_for([4])] == ["ar", "k=4"]


def test_interleaving_rotation_and_shared_seeds(clock):
    engine, runs = _run(clock)
    labels = [v.label for v in VARIANTS]
    warm, timed = engine.calls[: 2 * len(labels)], engine.calls[2 * len(labels):]
    assert [c[0] for c in warm] == [lab for lab in labels for _ in range(2)] and len(runs["warmup"]) == 8
    assert len(timed) == 4 * len(UNITS) * len(labels)
    firsts = []
    for i in range(0, len(timed), len(labels)):  # every (repeat, unit) block runs every variant once, rotated
        block = timed[i : i + len(labels)]
        assert sorted(c[0] for c in block) == sorted(labels)
        assert len({json.dumps(c[1]) for c in block}) == 1 and len({json.dumps(c[2]) for c in block}) == 1
        firsts.append(block[0][0])
    assert len(set(firsts)) == len(labels)
    seeds = [c[2][0] for c in timed[:: len(labels)]]
    assert len(set(seeds)) == len(seeds)  # a new seed per (unit, repeat)
    _, greedy = _run(clock, sampled=False, repeats=1)
    assert all(c.counters is None for c in greedy["ar"])


def test_paired_ratios_cancel_the_load_and_match_the_costs(clock):
    _, runs = _run(clock)
    s = pe.summarise(runs, VARIANTS, len(UNITS), seed=0, greedy=True)
    rows = {r["variant"]: r for r in s["rows"]}
    for label in ("k=1", "k=2", "ngram k=3"):
        wall = (PREFILL + (NEW - 1) * COST["ar"]) / (PREFILL + (NEW - 1) * COST[label])
        r = rows[label]
        assert r["measured"] == pytest.approx(wall, rel=1e-9)
        assert r["low"] == pytest.approx(wall, rel=1e-9) and r["high"] == pytest.approx(wall, rel=1e-9)  # the load cancels
        assert r["decode"]["value"] == pytest.approx(COST["ar"] / COST[label], rel=1e-9)
        assert r["calls"] == 12 and r["greedy_mismatches"] == 0
    assert s["ar"]["calls"] == 12
    assert rows["k=2"]["tokens_per_second"] > s["ar"]["tokens_per_second"]
    assert s["verdict"] == f"PAYS: {rows['k=2']['measured']:.2f}x [{rows['k=2']['low']:.2f}, {rows['k=2']['high']:.2f}] at k=2"


def test_unpaired_noise_gives_an_interval(clock):
    _, runs = _run(clock)
    for i, call in enumerate(runs["k=2"]):  # noise the pairing cannot cancel: the interval opens around the value
        call.wall *= 1 + 0.2 * ((i * 7) % 5 - 2) / 2
    s = pe.summarise(runs, VARIANTS, len(UNITS))
    r = {r["variant"]: r for r in s["rows"]}["k=2"]
    assert r["low"] < r["measured"] < r["high"]


def test_acceptance_from_per_request_counters(clock):
    _, runs = _run(clock)
    acc = pe.acceptance(runs["k=2"])
    assert acc["drafts"] == 120 and acc["draft_tokens"] == 240 and acc["accepted_per_pos"] == [96, 84]
    assert acc["alpha"] == pytest.approx(0.75) and acc["conditional"] == pytest.approx([0.8, 0.875])
    assert acc["tokens_per_round"] == pytest.approx(2.5) and acc["full"] == pytest.approx(0.7)
    assert pe.acceptance(runs["ar"]) is None


def test_request_counters_from_vllm_histogram():
    metrics = SimpleNamespace(histogram=[2, 3, 5], num_draft_tokens=20)  # 10 rounds: 2 accepted none, 3 one, 5 both
    assert vllm_profile.request_counters(metrics) == {"drafts": 10, "draft_tokens": 20, "accepted": 13, "accepted_per_pos": [8, 5]}
    assert vllm_profile.request_counters(None) is None


def test_verdict_lines():
    row = dict(variant="k=2", measured=0.8, low=0.75, high=0.86, acceptance=dict(alpha=0.5, tokens_per_round=2.0))
    assert pe.engine_verdict([row]) == ("DOES NOT PAY: best 0.80x [0.75, 0.86] at k=2; acceptance 0.50 per drafted token, "
                                        "2.00 tokens per round (engine counters)")
    wide = dict(row, variant="ngram k=3", measured=1.1, low=0.95, high=1.3, acceptance=None)
    assert pe.engine_verdict([row, wide]) == "DOES NOT PAY: best 1.10x [0.95, 1.30] at ngram k=3 (the interval reaches 1)"
    assert pe.engine_verdict([dict(wide, low=1.02)]) == "PAYS: 1.10x [1.02, 1.30] at ngram k=3"


def test_greedy_mismatch_counted(clock):
    _, runs = _run(clock, wrong="k=1", repeats=2)
    rows = {r["variant"]: r for r in pe.summarise(runs, VARIANTS, len(UNITS), greedy=True)["rows"]}
    assert rows["k=1"]["greedy_mismatches"] == 6 and rows["k=2"]["greedy_mismatches"] == 0


def _report(clock) -> dict:
    _, runs = _run(clock, repeats=2)
    s = pe.summarise(runs, VARIANTS, len(UNITS), greedy=False)
    s["rows"][0]["efficiency"] = {"passed": False, "expected_acceptance_per_token": 0.9, "positions": [
        {"position": 1, "observed": 0.8, "expected": 0.9, "z": -6.5}]}
    s["rows"][1]["efficiency"] = {"passed": True, "expected_acceptance_per_token": 0.76}
    return {"title": "fake on the test pair, B=1, sampling", "engine": "fake", "engine_version": "0", "pair": "test pair",
            "pair_reason": "asked for", "design": "design: fake", "settings": dict(batch=1, prompts=3, prompt_length=3, new_tokens=NEW,
                                                                                   mode="sampling", repeats=2, warmup=2, threads=1),
            **s, "load_seconds": {"ar": 1.0}, "load_average": {"before": [0.1, 0.1, 0.1], "after": [0.2, 0.1, 0.1]}, "seconds": 3.0,
            "counter_check": {"variant": "ngram k=3", "agree": True, "registry": {}, "per_request": {}}}


def test_report_text_markdown_and_files(clock, tmp_path):
    report = _report(clock)
    text = text_report(report, sections_of=pe.sections)
    for heading in ("== Verdict", "== Setup", "== Speed", "== Acceptance"):
        assert heading in text
    assert report["verdict"] in text and "agree with the per-request counters" in text
    assert "FAILS: below at position(s) 1 (worst 0.800 < 0.900, -6.5 SE)" in text and " matches " in text
    md = markdown_report(report, sections_of=pe.sections)
    assert md.startswith("# Speedup profile: fake on the test pair") and f"`{report['verdict']}`" in md
    files = pe.write_engine_report(report, tmp_path, "eng")
    assert json.loads((tmp_path / "eng.json").read_text())["verdict"] == report["verdict"]
    assert set(files) == {"markdown", "json"} and (tmp_path / "eng.md").read_text() == md


def test_cli_profile_engine(clock, tmp_path, monkeypatch):
    report = _report(clock)
    seen = {}

    def fake_run_engine(engine, kwargs, *, python=None):
        seen.update(engine=engine, kwargs=kwargs, python=python)
        return json.loads(json.dumps(report))  # what the child process hands back

    monkeypatch.setattr(pe, "run_engine", fake_run_engine)
    buffer = io.StringIO()
    status = main(["profile-engine", "--k", "1,2", "--ngram-k", "3", "--mode", "sampling", "--out", str(tmp_path), "--stem", "v",
                   "--json", str(tmp_path / "cli.json")], out=buffer)
    assert status == 0 and seen["engine"] == "vllm" and seen["kwargs"]["ks"] == [1, 2] and seen["kwargs"]["ngram_k"] == 3
    assert report["verdict"] in buffer.getvalue() and (tmp_path / "v.md").exists()
    assert json.loads((tmp_path / "cli.json").read_text())["summary"] == [report["verdict"]]


def test_exact_pair_and_head_size_fallback(tmp_path, monkeypatch):
    chosen = vllm_profile.prepare_pair("exact:order1-close", tmp_path, prompts=3, length=5, seed=1)
    assert len(chosen["prompts"]) == 3 and all(len(p) == 5 and max(p) < 8 for p in chosen["prompts"])
    assert chosen["efficiency_pair"] == "order1-close" and chosen["positions"] == 128
    import specdec_bench.profile

    fake = SimpleNamespace(config=SimpleNamespace(head_dim=48, max_position_embeddings=4096))
    monkeypatch.setattr(specdec_bench.profile, "load_pair", lambda name: (fake, fake, None, "wide", None))
    monkeypatch.setattr(vllm_profile, "_cpu_head_sizes", lambda: [32, 64])
    fell = vllm_profile.prepare_pair("wide-exact", tmp_path, prompts=2, length=4, seed=0)
    assert fell["target"] == chosen["target"] and "head sizes {'target': 48, 'draft': 48}" in fell["reason"]
    assert fell["reason"].endswith("fell back to exact:order1-close")
    with pytest.raises(ValueError, match="unknown pair"):
        vllm_profile.prepare_pair("trained", tmp_path, prompts=1, length=4, seed=0)


def test_importing_the_profile_and_the_runner_never_imports_vllm():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, specdec_bench.cli, specdec_bench.profile_engine, specdec_bench.vllm_profile; sys.exit(1 if 'vllm' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_profile_takes_any_adapter_the_same_way():
    """``profile-engine --engine NAME --configs control,...``: the adapter's configurations are the variants, through
    the engine-neutral sessions (here the fake engine of fixtures/engines.py, whose sampler reports drafts)."""
    from specdec_bench.adapter_profile import profile_adapter

    report = profile_adapter(engine="specdec_fixtures.engines:FAKE", configs=["spec", "control"], prompts=2, repeats=2,
                             prompt_length=4, new_tokens=6, mode="sampling", log=None)
    (row,) = report["rows"]
    assert row["variant"] == "spec k=3" and row["calls"] == 4 and report["settings"]["configs"] == ["control", "spec"]
    assert row["acceptance"]["alpha"] == 0.5 and row["acceptance"]["tokens_per_round"] is None  # totals only
    assert report["verdict"].startswith(("PAYS", "DOES NOT PAY"))
    with pytest.raises(ValueError, match="exactly one configuration without speculation"):
        profile_adapter(engine="specdec_fixtures.engines:FAKE", configs=["spec", "silent"], log=None)
    with pytest.raises(ValueError, match="exceeds"):
        profile_adapter(engine="specdec_fixtures.engines:FAKE", configs=["control", "spec"], prompt_length=100, new_tokens=40,
                        log=None)


def _context_report(length: int, verify: float, draft: float) -> dict:
    """A profile report whose rounds cost exactly ``verify + draft * k`` AR steps (AR slower at longer contexts)."""
    ar = 10 * MS * (1 + length / 1000)
    rows = []
    for k, per_round in ((1, 1.8), (2, 2.5), (4, 3.2)):
        per_token = (verify + draft * k) * ar / per_round
        ratio = ar / per_token
        rows.append({"variant": f"k={k}", "method": "draft_model", "k": k, "measured": ratio, "low": 0.95 * ratio,
                     "high": 1.05 * ratio, "decode": {"value": ratio, "low": 0.95 * ratio, "high": 1.05 * ratio},
                     "per_token": per_token, "decode_per_token": per_token, "greedy_mismatches": 0,
                     "acceptance": {"alpha": (per_round - 1) / k, "tokens_per_round": per_round}})
    return {"title": f"fake at {length}", "pair": "test pair", "design": "design: fake", "verdict": pe.engine_verdict(rows),
            "ar": {"per_token": ar, "decode_per_token": ar}, "rows": rows}


def test_contexts_give_one_profile_each_and_the_fitted_cost_terms(tmp_path, monkeypatch):
    """--contexts runs one profile per prompt length and fits each context's round times to v + c k (in AR steps):
    the terms the synthetic engine was built with come back, and the table says per context whether it pays."""
    from specdec_bench.profile_contexts import cost_terms

    made = {256: (1.1, 0.2), 4000: (1.6, 0.45)}
    fit = cost_terms(_context_report(256, *made[256]))
    assert fit["verify"] == pytest.approx(1.1) and fit["draft"] == pytest.approx(0.2) and fit["basis"] == "decode"
    one_k = _context_report(256, 1.1, 0.2)
    one_k["rows"] = one_k["rows"][:1]
    assert cost_terms(one_k) is None  # one k: nothing to fit

    asked = []

    def fake_run_engine(engine, kwargs, *, python=None):
        asked.append(kwargs["prompt_length"])
        return _context_report(kwargs["prompt_length"], *made[kwargs["prompt_length"]])

    monkeypatch.setattr(pe, "run_engine", fake_run_engine)
    buffer = io.StringIO()
    status = main(["profile-engine", "--pair", "exact:long-close", "--k", "1,2,4", "--contexts", "256,4000",
                   "--out", str(tmp_path), "--stem", "ctx"], out=buffer)
    assert status == 0 and asked == [256, 4000]
    text = buffer.getvalue()
    assert "== Contexts" in text and "verify cost v" in text and "256 prompt tokens: PAYS" in text
    assert "4000 prompt tokens: DOES NOT PAY" in text  # 3.2 tokens per round against 1.6 + 0.45 k: never
    saved = json.loads((tmp_path / "ctx.json").read_text())
    assert [round(r["verify"], 6) for r in saved["context_rows"]] == [1.1, 1.6]
