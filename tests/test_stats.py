"""Tests of the statistical oracle itself: power formula, pooling, impossible outcomes, sizing of the ci profile."""
import math

import numpy as np
import pytest

from specdec_properties import exact
from specdec_properties.sample_size import required_blocks
from specdec_properties.scenarios import STAT_SCENARIOS, balanced_scenario, mix_for_acceptance
from specdec_properties.stats import (
    assert_total,
    ALPHA,
    TARGET_POWER,
    TV,
    assert_total,
    assert_fits,
    detectable_tv,
    goodness_of_fit,
    judge_power,
    power_against_tv,
    samples_for_power,
)


def test_power_grows_with_n_and_tv():
    assert power_against_tv(1e5, 15, ALPHA, TV) < power_against_tv(1e6, 15, ALPHA, TV) < power_against_tv(3e6, 15, ALPHA, TV)
    assert power_against_tv(1e6, 15, ALPHA, 0.001) < power_against_tv(1e6, 15, ALPHA, 0.003)
    n = samples_for_power(15)
    assert power_against_tv(n, 15, ALPHA, TV) >= TARGET_POWER > power_against_tv(n - 1000, 15, ALPHA, TV)


def test_single_cell_power_is_the_chance_of_one_impossible_sample():
    assert power_against_tv(1000, 0, ALPHA, 0.003) == pytest.approx(1 - (1 - 0.003) ** 1000)


def test_impossible_outcome_fails_with_p_zero():
    result = goodness_of_fit([10, 0, 1], [0.5, 0.5, 0.0], what="x", labels=["a", "b", "c"])
    assert not result.passed and result.p_value == 0.0 and result.impossible == [("c", 1)]
    assert "impossible outcomes" in result.report()


def test_small_cells_are_pooled_and_power_discounted():
    expected = np.array([0.5, 0.5 - 2e-6, 1e-6, 1e-6])
    result = goodness_of_fit([500_000, 500_000, 1, 3], expected, what="x", labels=["0", "1", "2", "3"])
    assert result.pooled == ["2", "3"] and result.df == 1
    assert result.power == pytest.approx(power_against_tv(result.n, 1, ALPHA, TV - 2e-6))


def test_failure_message_states_n_alpha_power_and_every_cell():
    with pytest.raises(AssertionError) as info:
        assert_fits([600, 400], [0.5, 0.5], what="coin", labels=["heads", "tails"], seed=7, replay="pytest -k coin")
    text = str(info.value)
    for fragment in ("coin", "N=1000", "alpha=1e-06", "power", "TV >= 0.003", "observed", "expected", "seed: 7",
                     "replay: pytest -k coin", "heads", "tails"):
        assert fragment in text


def test_passing_result_is_a_record():
    rng = np.random.default_rng(0)
    p = np.full(8, 1 / 8)
    result = assert_fits(rng.multinomial(100_000, p), p, what="uniform", labels=[f"token {i}" for i in range(8)])
    record = result.as_record()
    assert record["passed"] and record["n"] == 100_000 and record["alpha"] == ALPHA and 0 < record["power"] < 1


@pytest.mark.parametrize("bad", [([1, 2], [0.5]), ([1, 2], [0.5, 0.6]), ([1, 2], [1.5, -0.5]), ([1, 2], [np.nan, 1.0])])
def test_bad_expected_distributions_are_rejected(bad):
    with pytest.raises(ValueError):
        goodness_of_fit(*bad, what="x", labels=["a", "b"][: len(bad[0])])


def test_ci_sample_sizes_reach_the_target_power_for_every_sizing_event():
    """Every check whose conditioning event has probability >= 0.1 gets >= TARGET_POWER at TV 0.003 (expected counts)."""
    for scenario in STAT_SCENARIOS.values():
        n = required_blocks(scenario)
        p, q, k = scenario.target, scenario.draft, scenario.k
        reach, law = exact.reach_probs(p, q), exact.length_law(p, q)
        events = [(exact.length_law(p, q), 1.0)]
        events += [(exact.emitted_law(p, j), reach[j]) for j in range(k + 1)]
        events += [(exact.step_law(p, q, j), reach[j]) for j in range(k)]
        events += [(exact.residual_law(p, q, j), law[j]) for j in range(k) if law[j] > 0]
        for law_j, prob in events:
            if prob >= 0.1:
                df = int(np.count_nonzero(law_j)) - 1
                assert power_against_tv(n * prob, df, ALPHA, TV) >= TARGET_POWER, (scenario.name, df, prob)


def test_balanced_scenario_stops_uniformly_and_rows_differ():
    sc = balanced_scenario()
    assert np.allclose(exact.length_law(sc.target, sc.draft), 1 / (sc.k + 1), atol=1e-6)
    for i in range(sc.k + 1):
        for j in range(i + 1, sc.k + 1):
            assert 0.5 * np.abs(sc.target[i] - sc.target[j]).sum() > 0.2, "rows must be distinct for alignment checks"


def test_mix_for_acceptance_hits_the_target_and_rejects_unreachable():
    rng = np.random.default_rng(1)
    p, o = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    q = mix_for_acceptance(p, o, 0.9)
    assert np.minimum(p, q).sum() == pytest.approx(0.9, abs=1e-9)
    with pytest.raises(ValueError):
        mix_for_acceptance(p, o, np.minimum(p, o).sum() / 2)


def test_exact_laws_are_consistent():
    """Accepted plus rejected mass at a step gives p; the length law sums to 1."""
    sc = STAT_SCENARIOS["edges"]
    for j in range(sc.k):
        step = exact.step_law(sc.target, sc.draft, j)
        v = sc.vocab
        assert np.allclose(step[:v] + step[v:], exact.emitted_law(sc.target, j))
    assert math.isclose(exact.length_law(sc.target, sc.draft).sum(), 1.0)


def test_every_cell_needs_a_label():
    with pytest.raises(TypeError):
        goodness_of_fit([1, 2], [0.5, 0.5], what="x")  # labels are required
    with pytest.raises(ValueError, match="every cell needs a label"):
        goodness_of_fit([1, 2], [0.5, 0.5], what="x", labels=["only one"])


def test_detectable_tv_inverts_the_power():
    for n, df in ((12_346_775, 15), (100_000, 3), (2_000, 10), (50, 0)):
        tv = detectable_tv(n, df, ALPHA)
        assert power_against_tv(n, df, ALPHA, tv) == pytest.approx(TARGET_POWER, abs=1e-6)
    assert detectable_tv(0, 4, ALPHA) == math.inf
    assert detectable_tv(10_000, 4, ALPHA, pooled_mass=0.01) == pytest.approx(0.01 + detectable_tv(10_000, 4, ALPHA))


def _record(n, df=4, tv=TV, alpha=ALPHA):
    counts = np.full(df + 1, n // (df + 1))
    counts[0] += n - counts.sum()
    return goodness_of_fit(counts, np.full(df + 1, 1 / (df + 1)), what=f"N={n}", labels=[str(i) for i in range(df + 1)],
                           tv=tv, alpha=alpha).as_record()


def test_judge_power_full_reduced_inconclusive():
    assert judge_power([_record(10_000_000)])[0] == "full"
    level, why = judge_power([_record(10_000_000), _record(50_000)])
    assert level == "reduced" and "N=50000" in why and "detects TV >=" in why
    level, why = judge_power([_record(10_000_000), _record(0)])
    assert level == "inconclusive" and "N=0" in why and "not a pass" in why
    assert judge_power([_record(40)])[0] == "inconclusive"  # cannot detect even TV 0.5
    assert judge_power([])[0] == "inconclusive"


def test_total_states_what_it_detects():
    result = assert_total(50, [0.5] * 100, [0.25] * 100, what="coin flips")
    record = result.as_record()
    assert record["detects"] == pytest.approx(record["tv"]) and record["power"] == pytest.approx(TARGET_POWER)
    with pytest.raises(AssertionError, match="70 successes in N=100 trials are NOT consistent"):
        assert_total(70, [0.5] * 100, [0.25] * 100, what="coin flips", alpha=1e-3)
    empty = assert_total(0, [], [], what="nothing judged").as_record()
    assert empty["detects"] is None and judge_power([empty])[0] == "inconclusive"


# ----------------------------------------------------------------------------- transitions (product multinomial)


def _chain(rng, table, start, n, steps):
    """``n`` paths of a Markov chain with transition rows ``table`` from state ``start``: counts per (state, next)."""
    states = np.full(n, start)
    counts = np.zeros_like(table, dtype=np.int64)
    cum = table.cumsum(1)
    for _ in range(steps):
        nxt = (rng.random(n)[:, None] > cum[states]).sum(1)
        np.add.at(counts, (states, nxt), 1)
        states = nxt
    return counts


def test_transition_test_holds_its_level_on_a_chain_and_states_its_power():
    """Visit counts are random, each step a fresh draw given the past: the pooled statistic is chi-square under the
    null (false alarms near alpha over 400 chains), and a chain 0.05 off in every row is caught as stated."""
    from specdec_properties.stats import conditional_goodness_of_fit

    rng = np.random.default_rng(0)
    table = rng.dirichlet(np.ones(4) * 3, size=4)
    labels = [str(t) for t in range(4)]
    fails = 0
    for _ in range(400):
        counts = _chain(rng, table, 0, 500, 4)
        fit = conditional_goodness_of_fit([(f"s{i}", counts[i], table[i]) for i in range(4)], what="null",
                                          labels=labels, alpha=0.05, tv=0.05)
        fails += not fit.passed
        assert fit.n == 2_000 and fit.df == 12
    assert 8 <= fails <= 35  # binomial(400, 0.05): mean 20, sd 4.4
    off = table.copy()
    off[:, 0] += 0.05
    off[:, 1] -= 0.05  # TV 0.05 in every row (every row has mass >= 0.05 there for this seed)
    assert (off > 0).all()
    fit = conditional_goodness_of_fit([(f"s{i}", c, table[i]) for i, c in enumerate(_chain(rng, off, 0, 5_000, 4))],
                                      what="biased", labels=labels, alpha=1e-6, tv=0.05)
    assert fit.power > 0.99 and not fit.passed
    assert "s0 -> 0" in fit.report()  # cells name their class and outcome


# ----------------------------------------------------------------------------- the early-pass look


def test_reserve_scale_raises_the_power_by_beta_at_every_df():
    """Sizing the full look up by reserve_scale() gives power >= TARGET + beta for any df (the union bound then keeps
    the procedure's power >= TARGET): checked where the ratio is largest (df 1) and far out."""
    from specdec_properties.early_pass import EARLY_PASS_BETA, reserve_scale
    from specdec_properties.stats import ALPHA, TARGET_POWER, _noncentrality_for_power

    scale = reserve_scale()
    assert 1.0 < scale < 1.1
    for df in (1, 2, 3, 7, 20, 100, 1000):
        lam = _noncentrality_for_power(df, ALPHA, TARGET_POWER)
        assert _noncentrality_for_power(df, ALPHA, TARGET_POWER + EARLY_PASS_BETA) <= lam * scale * (1 + 1e-9), df


def _fit(observed, expected, tv=0.05):
    from specdec_properties.stats import goodness_of_fit

    return goodness_of_fit(observed, expected, what="t", labels=[str(i) for i in range(len(expected))], tv=tv)


def test_futility_bound_is_exceeded_by_a_law_at_the_stated_tv_with_probability_one_minus_beta():
    """Simulated: samples from a law at TV 0.05 (the stated TV) fall at or below the early-pass bound in at most
    about beta of the draws; samples from the exact law fall there in most draws (the saving)."""
    from specdec_properties.early_pass import EARLY_PASS_BETA, futility_bound

    rng = np.random.default_rng(7)
    p = np.full(8, 1 / 8)
    q = p.copy()
    q[:4] += 0.0125
    q[4:] -= 0.0125  # TV 0.05
    n = 6000
    below = {"exact": 0, "shifted": 0}
    trials = 2000
    for name, law in (("exact", p), ("shifted", q)):
        for _ in range(trials):
            record = _fit(rng.multinomial(n, law), p).as_record()
            below[name] += record["statistic"] <= futility_bound(record)
    assert below["shifted"] / trials <= EARLY_PASS_BETA + 3 * math.sqrt(EARLY_PASS_BETA / trials)
    assert below["exact"] / trials > 0.5


def test_early_pass_decisions():
    from specdec_properties.early_pass import early_pass, futility_bound

    p = np.full(8, 1 / 8)
    calm = _fit(np.full(8, 750), p).as_record()
    assert early_pass([calm]) == ("pass", "")
    rough = _fit(np.array([900, 600] + [750] * 6), p).as_record()
    assert rough["statistic"] > futility_bound(rough) and early_pass([calm, rough])[0] == "continue"
    impossible = _fit(np.array([750] * 7 + [1]), np.r_[np.full(7, 1 / 7), 0.0]).as_record()
    assert early_pass([impossible])[0] == "continue"
    total = {"what": "a total", "kind": "total", "df": 1, "n": 100, "tv": 0.1, "statistic": 0.0}
    assert early_pass([calm, total])[0] == "ineligible" and early_pass([])[0] == "ineligible"
    # one possible cell (df 0): passes once a law with the stated TV outside it would have shown there w.p. >= 1 - beta
    few = _fit(np.array([100, 0]), np.array([1.0, 0.0])).as_record()
    many = _fit(np.array([5000, 0]), np.array([1.0, 0.0])).as_record()
    assert (1 - few["tv"]) ** 100 > 0.005 and early_pass([many])[0] == "pass"
    assert early_pass([few])[0] == "ineligible" and early_pass([few], scale=50)[0] == "continue"  # a larger look bounds it
    measurement = {"what": "a TV estimate", "kind": "tv_estimate", "n": 100}
    assert early_pass([calm, measurement])[0] == "ineligible"


def test_early_pass_power_is_the_full_looks_net_of_beta():
    """A case that passed early states the power of the full look it replaced (pooling recomputed at that N) minus
    beta; a full look after a probe states its own power minus beta."""
    from specdec_properties.early_pass import EARLY_PASS_BETA, spend_early_pass_power
    from specdec_properties.stats import power_against_tv

    p = np.r_[np.full(6, 0.16), 0.03, 0.01]
    fit = _fit(np.round(p * 400).astype(int), p)
    record = fit.as_record()
    assert record["pooled_mass"] > 0  # at N=400 the two small cells pool
    planned = spend_early_pass_power(record, fit, 4000)
    df, pooled = fit.pooling_at(4000)
    assert pooled == 0 and df == 7
    assert planned["power"] == pytest.approx(power_against_tv(4000, 7, record["alpha"], 0.05) - EARLY_PASS_BETA)
    own = spend_early_pass_power(record)
    assert own["power"] == pytest.approx(max(record["power"] - EARLY_PASS_BETA, 0.0))
    measurement = {"kind": "tv_estimate", "tv": 0.01}
    assert spend_early_pass_power(measurement) == measurement


def test_a_total_passes_early_only_when_its_z_is_small():
    """A total test's early-pass bound on |z|: a shift of the full look's detectable shift per trial exceeds it with
    probability >= 1 - beta at the probe (normal approximation), and the exact mean lies well inside it."""
    from specdec_properties.early_pass import EARLY_PASS_BETA, early_pass, futility_bound, planned_shift, spend_early_pass_power
    from scipy import stats as st

    rng = np.random.default_rng(3)
    means, variances = np.full(2000, 0.4), np.full(2000, 0.24)
    calm = assert_total(800, means, variances, what="calm").as_record()
    assert calm["kind"] == "total" and early_pass([calm], scale=2.14) == ("pass", "")
    bound = futility_bound(calm, planned_n=2000 * 2.14)
    shift = planned_shift(calm, 2000 * 2.14)
    mean_z = shift * 2000 / calm["std"]
    assert st.norm.cdf(bound - mean_z) - st.norm.cdf(-bound - mean_z) <= EARLY_PASS_BETA + 1e-12
    drawn = rng.binomial(2000, 0.4 + shift, size=4000)
    assert np.mean(np.abs((drawn - 800) / calm["std"]) <= bound) <= EARLY_PASS_BETA + 3 * math.sqrt(EARLY_PASS_BETA / 4000)
    stated = spend_early_pass_power(calm, planned_n=2000 * 2.14)
    assert stated["tv"] == pytest.approx(shift) and stated["power"] >= 0.99


@pytest.mark.parametrize("n", [200, 2_000, 15_000, 1_000_000])
@pytest.mark.parametrize("rare_expected", [1e-3, 1.0, 4.9])
def test_a_rare_bin_is_tested_exactly_and_its_stated_power_holds(n, rare_expected):
    """One big cell and rare cells (expected count < MIN_EXPECTED even pooled): folding them into the big cell would
    leave df 0 and hide any excess there (a law moving TV 0.067 into a cell of probability 5e-8 passed, stating power
    1). They form their own bin, tested by its exact upper tail; the power stated (the df-1 chi-square bound, against
    TV beyond the rare mass) is a lower bound on that test's power against the worst law at the TV it states it
    detects: mass a on impossible cells (one draw there rejects) and the rest moved into the rare bin."""
    from scipy import stats as st

    m = rare_expected / n
    fit = goodness_of_fit(np.array([n, 0]), np.array([1 - m, m]), what="rare", labels=["big", "rare"], tv=0.03)
    assert fit.rare_bin and fit.df == 1 and fit.passed
    x_crit = int(st.binom.isf(fit.alpha, n, m)) + 1  # the smallest count whose upper tail is below alpha
    assert st.binom.sf(x_crit - 1, n, m) < fit.alpha <= st.binom.sf(x_crit - 2, n, m)
    flooded = goodness_of_fit(np.array([n - x_crit, x_crit]), np.array([1 - m, m]), what="rare", labels=["big", "rare"])
    assert not flooded.passed and "rare_bin" in flooded.as_record()
    t = fit.detects
    worst_miss = max((1 - a) ** n * st.binom.cdf(x_crit - 1, n, max(t - m - a, 0.0)) for a in np.linspace(0, t - m, 401))
    assert worst_miss <= 1 - TARGET_POWER, (t, x_crit, worst_miss)
