"""Calibration of the statistical oracle (slow, part of CI): measured false alarms and measured power.

The numbers behind the README's calibration table (``python -m conformance.calibration``).
"""
import numpy as np
import pytest
from scipy import stats

from conformance.verifier_checks import required_blocks
from specdec_properties.calibration import false_alarms, power_table, summarise_false_alarms
from specdec_properties.scenarios import STAT_SCENARIOS
from specdec_properties.stats import ALPHA
from specdec_ref.backend import reference_backend

pytestmark = pytest.mark.slow


def test_false_alarm_rate_of_the_reference_matches_alpha():
    """200 independent seeds x 14 tests: p-values uniform, failure counts within binomial bounds."""
    looks = (0.05, 0.25, 0.35, 0.5, 0.7)  # the ci profile's interim and early-pass looks
    summary = summarise_false_alarms(false_alarms(reference_backend(), seeds=200, blocks=50_000, interim_fractions=looks))
    n = summary["tests"]
    assert summary["failures_at_alpha"] <= 1, summary  # expected 0.003
    assert summary["earlier_looks"] == len(looks)
    assert summary["all_looks_at_1e-06"] <= 1, summary  # the suite's procedure: every look rejects at alpha/100
    for level in (0.01, 0.05):
        lo, hi = stats.binom.ppf([1e-4, 1 - 1e-4], n, level)
        assert lo <= summary[f"failures_at_{level}"] <= hi, (level, summary)
        assert summary[f"all_looks_at_{level:g}"] <= stats.binom.ppf(1 - 1e-4, n, 1.05 * level), (level, summary)
    assert summary["min_ks_pvalue"] > 1e-4 / len(summary["ks_pvalues"]), summary["ks_pvalues"]


def test_detection_rate_matches_stated_power():
    """Synthetic samplers at TV 0.001 / 0.003 / 0.01 are detected at least as often as the stated power says."""
    n = required_blocks(STAT_SCENARIOS["balanced"])
    for row in power_table(n, repeats=100):
        sd = np.sqrt(row["stated_power"] * (1 - row["stated_power"]) / row["repeats"])
        assert row["detection_rate"] >= row["stated_power"] - 4 * sd - 1e-9, row
        if row["tv"] >= 0.003:
            assert row["stated_power"] >= 0.99 and row["detection_rate"] == 1.0, row


def test_alpha_is_the_documented_one():
    assert ALPHA == 1e-6


def test_the_early_pass_looks_keep_the_power_and_pass_the_exact_law_early():
    """The procedure with the ci profile's early-pass looks (0.25, 0.35, 0.5, 0.7 of the sample, nested, else the full
    look sized up): the exact law passes early in nearly every repeat on less than half the sample, a law at the
    stated TV is always detected, and one at a third of it (below the stated TV, where the full look alone detects
    about 0.68) is detected about as often as without the looks."""
    from conformance.profiles import get_profile
    from specdec_properties.calibration import early_pass_table

    n = required_blocks(STAT_SCENARIOS["balanced"])
    rows = {row["tv"]: row for row in early_pass_table(n, get_profile("ci").early_pass_fractions, repeats=200)}
    assert rows[0.0]["passed_early"] >= 0.95 and rows[0.0]["detection_rate"] == 0.0
    assert rows[0.0]["mean_share_drawn"] <= 0.47, rows[0.0]  # 0.52 with one look at half the sample
    assert rows[0.003]["detection_rate"] == 1.0 and rows[0.003]["stated_power"] >= 0.99
    full_only = {row["tv"]: row for row in power_table(n, tvs=(0.001,), repeats=200) if row["direction"] == "worst case"}
    expected = full_only[0.001]["stated_power"]
    assert rows[0.001]["detection_rate"] >= expected - 4 * np.sqrt(expected * (1 - expected) / 200), (rows[0.001], expected)


def test_the_black_box_looks_keep_their_alpha_and_reject_the_stated_alternative():
    """The black-box tool's planned looks (conformance.samples.looks) on the engine matrix's cases: exact files at
    alpha 0.05 fail about as often as the looks' family-wise alpha allows (the whole procedure, each rejection look at
    alpha / 100), and files at TV 0.03 (the stated alternative, the direction the test sees least) are rejected.
    ``python -m conformance.engines.calibration`` measures it on every case and more seeds (docs/statistics.md)."""
    from conformance.engines.calibration import calibrate

    rows = calibrate(seeds=10, alphas=(0.05,), tvs=(0.03,), cases=("warp", "position"), first_seed=90_000)
    exact = [r for r in rows if r["tv"] == 0]
    fails = sum(r["level"] == "not_certified" for r in exact)
    assert fails <= stats.binom.ppf(1 - 1e-4, len(exact), 0.05 * 1.05), fails
    assert all(r["level"] != "inconclusive" for r in exact)
    biased = [r for r in rows if r["tv"] > 0]
    assert all(r["level"] == "not_certified" for r in biased), [r for r in biased if r["level"] != "not_certified"]
