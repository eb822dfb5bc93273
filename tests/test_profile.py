"""The profile's machinery on fake decoders with injected, known costs: the measured costs, the paired ratio, the fitted
overheads, the phase check, the batch tail and the verdict come out as the injected costs say.

The fakes' forwards and host work advance a virtual clock by known amounts, and the tool reads the same clock
(``specdec_bench.profile_timing.CLOCK``), so every figure is exact and no result depends on how loaded the machine is
(busy-waits on a shared 2-core machine overshoot by a scheduler slice whenever the deadline falls while the process
is descheduled). The real clock is exercised end to end by tests/test_profile_cli.py. Nothing here asserts how
fast real decoding is.
"""
from __future__ import annotations

import pytest
import torch

import specdec_bench.profile_timing
from specdec_bench.profile import profile
from specdec_bench.profile_model import Costs, breakeven_alpha, verdict
from specdec_bench.profile_stats import bootstrap_median, paired_ratio
from specdec_ref.contract import Capabilities, DecodeResult, RoundRecord
from specdec_ref.models import tiny_lm


class VirtualClock:
    """Seconds that pass only when a fake spends them."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


CLOCK = VirtualClock()


@pytest.fixture(scope="module", autouse=True)
def virtual_time():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(specdec_bench.profile_timing, "CLOCK", CLOCK)
        yield


MS = 1e-3
T, D = 3.0 * MS, 0.3 * MS  # target forward of one token, draft forward
V_STEP = 0.3 * MS  # each extra token of a target block
O_AR, O_D, O_V, O_R, O_O = 0.3 * MS, 0.2 * MS, 0.5 * MS, 0.3 * MS, 0.3 * MS
PATTERN = (2, 0, 3, 1)  # accepted drafts per round, cut at k


def spin(seconds: float) -> None:
    CLOCK.t += seconds


def target_forward(n: int) -> None:
    spin(T + V_STEP * (n - 1))


def draft_forward() -> None:
    spin(D)


class FakeDecoder:
    """A speculative decoder whose forwards and host work are busy-waits of known length; accepts PATTERN."""

    name = "fake-delays"
    version = "0"
    capabilities = Capabilities(decoder=True, greedy=True, sampling=True, phase_timings=True)

    def decode(self, target, draft, prompt, *, k, max_new_tokens, sampling, eos_id=None, generator=None, on_round=None):
        clock = CLOCK
        result = DecodeResult(tokens=[], prompt_len=prompt.shape[1], finished_by="max_new_tokens")
        tick = clock()
        target_forward(prompt.shape[1])
        draft_forward()
        seconds = {"prefill": clock() - tick}
        tick = clock()
        i = 0
        while len(result.tokens) < max_new_tokens:
            m = min(k, PATTERN[i % len(PATTERN)])
            for _ in range(k):
                draft_forward()
                spin(O_D)
            now = clock()
            seconds["draft"], tick = now - tick, now
            target_forward(k + 1)
            spin(O_V)
            now = clock()
            seconds["verify"], tick = now - tick, now
            if m == k:
                draft_forward()
            spin(O_R)
            now = clock()
            seconds["repair"], tick = now - tick, now
            emitted = min(m + 1, max_new_tokens - len(result.tokens))
            start = prompt.shape[1] + len(result.tokens)
            result.tokens.extend([0] * emitted)
            record = RoundRecord(round=i, start=start, proposed=k, accepted=m, emitted=emitted, target_len=start + emitted - 1,
                                 draft_len=start + emitted - 1, committed_len=start + emitted, target_calls=i + 2, draft_calls=0,
                                 seconds=seconds)
            result.rounds.append(record)
            if on_round is not None:
                on_round(record, None, None)
            spin(O_O)
            now = clock()
            seconds["other"], tick = now - tick, now
            seconds = {}
            i += 1
        return result


class FakeBatchedDecoder(FakeDecoder):
    """The same costs for a batch: one forward serves every row; row b accepts PATTERN shifted by b, rows leave when done."""

    name = "fake-delays-batched"
    capabilities = Capabilities(decoder=True, batched_decoder=True, greedy=True, phase_timings=True)

    def decode_batch(self, target, draft, requests, *, k, on_round=None):
        clock = CLOCK
        results = [DecodeResult(tokens=[], prompt_len=1, finished_by="max_new_tokens") for _ in requests]
        tick = clock()
        target_forward(2)
        seconds = {"prefill": clock() - tick}
        tick = clock()
        i = 0
        while any(len(res.tokens) < r.max_new_tokens for res, r in zip(results, requests)):
            live = [b for b, (res, r) in enumerate(zip(results, requests)) if len(res.tokens) < r.max_new_tokens]
            ms = {b: min(k, PATTERN[(i + b) % len(PATTERN)]) for b in live}
            for _ in range(k):
                draft_forward()
                spin(O_D)
            now = clock()
            seconds["draft"], tick = now - tick, now
            target_forward(k + 1)
            spin(O_V)
            now = clock()
            seconds["verify"], tick = now - tick, now
            if any(m == k for m in ms.values()):
                draft_forward()
            spin(O_R)
            now = clock()
            seconds["repair"], tick = now - tick, now
            for b in live:
                res, m = results[b], ms[b]
                emitted = min(m + 1, requests[b].max_new_tokens - len(res.tokens))
                res.tokens.extend([0] * emitted)
                record = RoundRecord(round=i, start=0, proposed=k, accepted=m, emitted=emitted, target_len=0, draft_len=0,
                                     committed_len=1, target_calls=i + 2, draft_calls=0, row=b, seconds=seconds)
                res.rounds.append(record)
                if on_round is not None:
                    on_round(record, None, None)
            spin(O_O)
            now = clock()
            seconds["other"], tick = now - tick, now
            seconds = {}
            i += 1
        return results


def fake_batched_ar(target, requests, on_step):
    results = [DecodeResult(tokens=[], prompt_len=1, finished_by="max_new_tokens") for _ in requests]
    target_forward(2)
    for step in range(requests[0].max_new_tokens):
        target_forward(1)
        spin(O_AR)
        for res in results:
            res.tokens.append(0)
        on_step(step)
    return results


def fake_ar(target, requests, on_step):
    out = []
    for r in requests:
        res = DecodeResult(tokens=[], prompt_len=1, finished_by="max_new_tokens")
        target_forward(2)  # prefill
        for step in range(r.max_new_tokens):
            target_forward(1)
            spin(O_AR)
            res.tokens.append(0)
            on_step(step)
        out.append(res)
    return out


def fake_costs(target, draft, prompts, ks, *, context, seconds):
    """Measured, like the real ones: each fake forward timed on the clock."""
    def timed(fn):
        start = CLOCK()
        fn()
        return CLOCK() - start

    return Costs(target=timed(lambda: target_forward(1)), draft=timed(draft_forward),
                 verify={k: timed(lambda k=k: target_forward(k + 1)) for k in ks}, context=context)


def pattern_rounds(k: int, new_tokens: int) -> list[tuple[int, int]]:
    """(accepted, emitted) of every round of one fake decode."""
    total, rounds, i = 0, [], 0
    while total < new_tokens:
        m = min(k, PATTERN[i % len(PATTERN)])
        rounds.append((m, min(m + 1, new_tokens - total)))
        total += m + 1
        i += 1
    return rounds


def expected_speedup(k: int, new_tokens: int) -> float:
    """AR seconds per token over the fake's, from its pattern (the rounds after the first, as the profile counts)."""
    later = pattern_rounds(k, new_tokens)[1:]
    # the first round ends at its on_round call: its own "other" falls after, in the decode time
    seconds = O_O + sum(k * (D + O_D) + T + V_STEP * k + O_V + (m == k) * D + O_R + O_O for m, _ in later)
    return (T + O_AR) / (seconds / sum(e for _, e in later))


@pytest.fixture(scope="module")
def report():
    tiny = tiny_lm("llama", vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, max_positions=256, seed=0)
    prompts = lambda n, length, seed: [torch.zeros(1, length, dtype=torch.long) for _ in range(n)]  # noqa: E731
    return profile(FakeDecoder(), target=tiny, draft=tiny, make_prompts=prompts, description="fake", ks=(1, 3), prompts=3,
                   prompt_length=4, new_tokens=24, repeats=5, baseline=fake_ar, measure=fake_costs, log=None)


def test_measured_costs_are_the_injected_ones(report):
    costs = report["costs"]
    assert costs["C_T"] == pytest.approx(T, rel=1e-9)
    assert costs["C_D"] == pytest.approx(D, rel=1e-9)
    assert costs["C_V"]["3"] == pytest.approx(T + 3 * V_STEP, rel=1e-9)


def test_paired_ratio_is_the_known_speedup(report):
    for row in report["model"]["rows"]:
        assert row["measured"] == pytest.approx(expected_speedup(row["k"], 24), rel=1e-9)
        assert row["low"] <= row["measured"] <= row["high"]


def test_fit_recovers_the_injected_overheads_and_predicts_within_tolerance(report):
    fit = report["model"]["fit"]
    assert fit["source"] == "backend-reported phases"
    assert fit["o_ar"] == pytest.approx(O_AR, rel=1e-6), fit
    assert fit["o_d"] == pytest.approx(O_D, rel=1e-6), fit
    # f_k (rounds feeding d_k to the draft) counts every round, the repair phases the rounds after the first: 1e-4 off
    assert fit["o_0"] == pytest.approx(O_V + O_R + O_O, rel=1e-3), fit
    assert (fit["o_verify"], fit["o_repair"], fit["o_other"]) == pytest.approx((O_V, O_R, O_O), rel=1e-3)
    first = [m >= 1 for k in (1, 3) for m, _ in pattern_rounds(k, 24)]  # draft 1 accepted, pooled over k
    assert fit["acceptance_by_position"][0] == pytest.approx(sum(first) / len(first))
    for row in report["model"]["rows"]:
        assert abs(row["gap"]) < 0.10 and row["term_off"] is None, row


def test_phases_add_up_to_the_measured_wall(report):
    check = report["phase_check"]
    assert check["reported"] and check["within"] and check["calls"] == 2 * 3 * 5
    assert report["declares_phase_timings"]


def test_verdict_line(report):
    line = report["verdict"]
    best = max(report["model"]["rows"], key=lambda r: r["measured"])
    assert line.startswith("PAYS: " if best["low"] > 1 else "DOES NOT PAY: best ")
    assert f"at k={best['k']}" in line


def test_verdict_does_not_pay_names_the_remedies():
    costs = Costs(target=1.0, draft=0.56, verify={1: 1.1, 2: 1.2}, context=8)
    fit = {"o_d": 0.0, "o_0": 0.1, "o_verify": None}
    rows = [dict(k=k, measured=m, low=m - 0.02, high=m + 0.02, breakeven_alpha=breakeven_alpha(1.0, costs, fit, k),
                 draft_threshold=t) for k, m, t in ((1, 0.70, 0.15), (2, 0.75, 0.2))]
    line = verdict({"rows": rows, "fit": fit}, costs)
    assert line.startswith("DOES NOT PAY: best 0.75x [0.73, 0.77] at k=2; the draft costs 0.56 target forwards; it would pay from alpha >= ")
    assert line.endswith("or with a draft below 0.2 target forwards")


def test_breakeven_alpha_solves_the_model():
    costs = Costs(target=1.0, draft=0.1, verify={2: 1.0}, context=8)
    fit = {"o_d": 0.0, "o_0": 0.0}
    a = breakeven_alpha(1.0, costs, fit, 2)
    assert 1.0 * (1 + a + a * a) == pytest.approx(2 * 0.1 + 1.0 + a * a * 0.1, abs=1e-9)
    assert breakeven_alpha(1.0, Costs(1.0, 2.0, {2: 1.0}, 8), fit, 2) is None  # a draft dearer than the target never pays


def test_bootstrap_interval():
    constant = bootstrap_median([[2.0, 2.0], [2.0]])
    assert (constant.value, constant.low, constant.high) == (2.0, 2.0, 2.0)
    spread = bootstrap_median([[1.0, 1.2], [0.9, 1.1], [1.3, 1.0]], seed=1)
    assert spread.low <= spread.value <= spread.high and spread.low >= 0.9 and spread.high <= 1.3
    assert paired_ratio([[2.0, 4.0]], [[1.0, 2.0]]).value == 2.0
    with pytest.raises(ValueError):
        paired_ratio([[1.0]], [[1.0, 2.0]])


def test_batch_needs_batched_decoder():
    tiny = tiny_lm("llama", vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, max_positions=64, seed=0)
    with pytest.raises(ValueError, match="batched_decoder"):
        profile(FakeDecoder(), target=tiny, draft=tiny, make_prompts=lambda n, length, seed: [], batch=2, log=None)


def expected_batched_speedup(k: int, batch: int, new_tokens: int) -> tuple[float, float]:
    """(speedup, tail) of FakeBatchedDecoder: every batch round costs the same, rows emit by their shifted PATTERN."""
    done, rounds, tokens, emitted_rows, i = [0] * batch, [], 0, [], 0
    while any(n < new_tokens for n in done):
        live = [b for b in range(batch) if done[b] < new_tokens]
        ms = [min(k, PATTERN[(i + b) % len(PATTERN)]) for b in live]
        out = [min(m + 1, new_tokens - done[b]) for m, b in zip(ms, live)]
        for b, e in zip(live, out):
            done[b] += e
        rounds.append((any(m == k for m in ms), sum(out), ms))
        i += 1
    later = rounds[1:]
    seconds = O_O + sum(k * (D + O_D) + T + V_STEP * k + O_V + full * D + O_R + O_O for full, _, _ in later)
    per_row_tokens = sum(t for _, t, _ in later) / batch
    row_rounds = [m for _, _, ms in rounds for m in ms]  # the acceptance counts every round, the first one too
    tail = (sum(m + 1 for m in row_rounds) / len(row_rounds)) / (per_row_tokens / len(later))
    return (T + O_AR) / (seconds / per_row_tokens), tail


def test_batched_profile_per_row_tokens_and_tail():
    tiny = tiny_lm("llama", vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, max_positions=256, seed=0)
    prompts = lambda n, length, seed: [torch.zeros(1, length, dtype=torch.long) for _ in range(n)]  # noqa: E731
    report = profile(FakeBatchedDecoder(), target=tiny, draft=tiny, make_prompts=prompts, description="fake", ks=(3,), batch=4,
                     prompts=2, prompt_length=4, new_tokens=24, repeats=3, baseline=fake_batched_ar, measure=fake_costs, log=None)
    (row,) = report["model"]["rows"]
    speedup, tail = expected_batched_speedup(3, 4, 24)
    assert row["measured"] == pytest.approx(speedup, rel=1e-9)
    assert row["tail"] == pytest.approx(tail, rel=1e-9) and tail > 1.05  # rows finish in different rounds
    assert abs(row["gap"]) < 0.10
    assert report["phase_check"]["within"] and report["phase_check"]["calls"] == 2 * 3


class FakeWithoutHook(FakeDecoder):
    """The same decoder calling no on_round and reporting no phases (allowed without ``cache``)."""

    name = "fake-no-hook"
    capabilities = Capabilities(decoder=True, greedy=True)

    def decode(self, target, draft, prompt, **kwargs):
        kwargs["on_round"] = None
        result = super().decode(target, draft, prompt, **kwargs)
        for rec in result.rounds:
            rec.seconds = None
        return result


def test_a_backend_without_on_round_is_timed_as_whole_calls():
    tiny = tiny_lm("llama", vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, max_positions=256, seed=0)
    prompts = lambda n, length, seed: [torch.zeros(1, length, dtype=torch.long) for _ in range(n)]  # noqa: E731
    report = profile(FakeWithoutHook(), target=tiny, draft=tiny, make_prompts=prompts, description="fake", ks=(1, 2, 3), prompts=2,
                     prompt_length=4, new_tokens=24, repeats=2, baseline=fake_ar, measure=fake_costs, log=None)
    assert report["timing"].startswith("whole calls") and report["ar"]["first"] is None
    assert not report["phase_check"]["reported"] and report["model"]["fit"]["source"].startswith("least squares")
    for row in report["model"]["rows"]:
        k = row["k"]
        rounds = pattern_rounds(k, 24)
        spec = T + 3 * V_STEP + D + sum(k * (D + O_D) + T + V_STEP * k + O_V + (m == k) * D + O_R + O_O for m, _ in rounds)
        ar = T + V_STEP + 24 * (T + O_AR)  # prefill of the fake AR, then 24 steps
        assert row["measured"] == pytest.approx(ar / spec, rel=1e-9)


def test_negative_host_work_is_noted_not_reported_as_host_work():
    """A fitted host term below zero (forwards timed apart dearer than in the decodes) gets a note naming it."""
    from specdec_bench.profile_report import _negative_host_work

    assert _negative_host_work({"o_ar": 1e-4, "o_d": 0.0, "o_0": 2e-4, "o_verify": None}) == []
    (note,) = _negative_host_work({"o_ar": -1.173e-3, "o_d": 1e-4, "o_0": -3.3e-5, "o_verify": -2.2e-4})
    assert "o_ar -1.173 ms" in note and "o_0 -0.033 ms" in note and "o_verify -0.220 ms" in note and "o_d" not in note
