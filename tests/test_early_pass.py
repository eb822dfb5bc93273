"""The early-pass look of ``conformance.registry.run_case`` (ci / thorough profiles), on synthetic checks.

Invariants: a case whose chi-square statistics all lie below their futility bound at half the sample passes there,
stating the power of the full look it replaced net of the power spent; a law at the stated TV does not pass early
(it fails); a case with a test that has no futility bound never gets an early-pass look; a probe that is not
conclusive sizes the full look up by ``reserve_scale`` and states its power net of what the probe spent.
"""
import math

import numpy as np
import pytest

from conformance.registry import Check, CheckCase, CheckContext, run_case
from properties.early_pass import EARLY_PASS_BETA, reserve_scale
from properties.stats import TARGET_POWER, assert_total, goodness_of_fit, samples_for_power

P = np.full(8, 1 / 8)
TV = 0.05
N = samples_for_power(7, tv=TV)


def _law_at_tv(tv: float) -> np.ndarray:
    q = P.copy()
    q[:4] += tv / 4
    q[4:] -= tv / 4
    return q


def _case(func, name: str) -> CheckCase:
    return CheckCase(Check(name=name, func=func, guards="test", requires=(), cases=(("", {}),), statistical=True), "", {})


def _draw(ctx: CheckContext, law: np.ndarray):
    n = math.ceil(N * ctx.sample_scale)
    counts = np.random.default_rng(ctx.seed_for("early-pass-test")).multinomial(n, law)
    result = goodness_of_fit(counts, P, what="synthetic law", labels=[str(i) for i in range(8)], tv=TV)
    ctx.record(result)
    assert result.passed, result.report()


def _run(func, name: str, backend):
    return run_case(_case(func, name), backend, CheckContext(profile="ci"))


@pytest.fixture(scope="module")
def backend():
    from specdec_ref.backend import reference_backend

    return reference_backend()


def test_the_exact_law_passes_at_half_the_sample_with_the_full_power_stated(backend):
    record = _run(lambda b, ctx: _draw(ctx, P), "synthetic_exact", backend)
    assert (record.status, record.look, record.power) == ("passed", "early_pass", "full"), record.message
    (stat,) = record.statistics
    assert stat["n"] == math.ceil(N * 0.5) and stat["early_pass"] == {"look_n": stat["n"], "fraction": 0.5}
    assert TARGET_POWER <= stat["power"] and stat["detects"] <= TV
    assert "early-pass look" in record.message and record.interim_statistics  # the 5% look ran first


@pytest.mark.parametrize("tv, look", [(TV, "full"), (8 * TV, "interim")])
def test_a_law_at_the_stated_tv_never_passes_early(tv, look, backend):
    record = _run(lambda b, ctx: _draw(ctx, _law_at_tv(tv)), f"synthetic_shifted_{int(tv * 100)}", backend)
    assert (record.status, record.look) == ("failed", look), record.message


def test_a_check_with_a_test_without_futility_bound_always_runs_in_full(backend):
    def check(b, ctx):
        _draw(ctx, P)
        n = math.ceil(100 * ctx.sample_scale)  # one possible cell: df 0, no chi-square bound
        ctx.record(goodness_of_fit([n, 0], [1.0, 0.0], what="one cell", labels=["a", "b"], tv=TV))

    record = _run(check, "synthetic_with_one_cell", backend)
    assert record.status == "passed" and record.look == "full"
    assert record.statistics[0]["n"] == N  # the plain full look: no probe spent power, nothing sized up
    again = _run(check, "synthetic_with_one_cell", backend)  # the same full look, the same result, whatever ran before
    assert again.statistics == record.statistics and again.look == "full"


@pytest.mark.parametrize("shift, status, look", [(0.0, "passed", "early_pass"), (0.03, "failed", "full")])
def test_a_total_passes_early_at_its_exact_mean_and_fails_when_shifted(shift, status, look, backend):
    def check(b, ctx):
        n = math.ceil(20_000 * ctx.sample_scale)
        successes = np.random.default_rng(ctx.seed_for("total")).binomial(n, 0.4 + shift)
        ctx.record(assert_total(int(successes), [0.4] * n, [0.24] * n, what="successes"))

    record = _run(check, f"synthetic_total_{int(shift * 100)}", backend)
    assert (record.status, record.look) == (status, look), record.message
    if status == "passed":
        assert record.power == "full" and record.statistics[0]["power"] >= TARGET_POWER


def test_an_inconclusive_probe_sizes_the_full_look_up_and_states_its_power_net_of_beta(backend):
    def check(b, ctx):  # bad luck at the probe only
        _draw(ctx, _law_at_tv(0.04) if ctx.look_fraction == 0.5 else P)

    record = _run(check, "synthetic_unlucky_probe", backend)
    assert record.status == "passed" and record.look == "full", record.message
    (stat,) = record.statistics
    assert stat["n"] == math.ceil(N * reserve_scale())
    fit = goodness_of_fit(np.random.default_rng(0).multinomial(stat["n"], P), P, what="x", labels=list("abcdefgh"), tv=TV)
    assert stat["power"] == pytest.approx(fit.power - EARLY_PASS_BETA) and stat["power"] >= TARGET_POWER
