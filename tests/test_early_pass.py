"""The early-pass look of ``conformance.registry.run_case`` (ci / thorough profiles), on synthetic checks.

Invariants: a case whose chi-square statistics all lie below their futility bound at one of the early-pass looks
passes there, stating the power of the full look it replaced net of the power spent; a law at the stated TV does not
pass early (it fails); a case with a test that has no futility bound never passes early; looks that are not
conclusive size the full look up by ``reserve_scale`` and state its power net of what the looks spent; every look
takes a prefix of one sample (``conformance.streams``), so a case draws its largest look once.
"""
import math

import numpy as np
import pytest

from conformance import streams
from conformance.profiles import get_profile
from conformance.registry import Check, CheckCase, CheckContext, run_case
from specdec_properties.early_pass import EARLY_PASS_BETA, reserve_scale
from specdec_properties.stats import TARGET_POWER, assert_total, estimate_tv, goodness_of_fit, samples_for_power

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


LOOKS = get_profile("ci").early_pass_fractions


def test_the_exact_law_passes_early_with_the_full_power_stated(backend):
    record = _run(lambda b, ctx: _draw(ctx, P), "synthetic_exact", backend)
    assert (record.status, record.look, record.power) == ("passed", "early_pass", "full"), record.message
    (stat,) = record.statistics
    fraction = stat["early_pass"]["fraction"]
    assert fraction in LOOKS and stat["n"] == math.ceil(N * fraction) and stat["early_pass"]["look_n"] == stat["n"]
    assert TARGET_POWER <= stat["power"] and stat["detects"] <= TV
    assert "early-pass look" in record.message and record.interim_statistics  # the 5% look ran first


@pytest.mark.parametrize("tv, look", [(TV, "full"), (8 * TV, "interim")])
def test_a_law_at_the_stated_tv_never_passes_early(tv, look, backend):
    record = _run(lambda b, ctx: _draw(ctx, _law_at_tv(tv)), f"synthetic_shifted_{int(tv * 100)}", backend)
    assert (record.status, record.look) == ("failed", look), record.message


def test_a_check_with_a_test_without_futility_bound_always_runs_in_full(backend):
    def check(b, ctx):
        _draw(ctx, P)
        ctx.record(estimate_tv(np.array([5, 5]), np.array([0.5, 0.5]), what="a measurement"))  # no bound: a TV estimate

    record = _run(check, "synthetic_with_a_measurement", backend)
    assert record.status == "passed" and record.look == "full"
    assert record.statistics[0]["n"] == N  # the plain full look: no probe spent power, nothing sized up
    again = _run(check, "synthetic_with_a_measurement", backend)  # the same full look, the same result, whatever ran before
    assert again.statistics == record.statistics and again.look == "full"


@pytest.mark.parametrize("escape", [0.0, 0.01])
def test_a_one_cell_test_passes_early_only_without_an_outcome_outside_it(escape, backend):
    """A df-0 test (one possible cell) rejects on any draw outside it; it passes early when none came out there and a
    law with the stated TV outside would have shown one with probability >= 1 - beta; the TV it then states as detected
    is bounded by that look's draws."""
    def check(b, ctx):
        _draw(ctx, P)
        n = math.ceil(20_000 * ctx.sample_scale)
        outside = np.random.default_rng(ctx.seed_for("one-cell")).binomial(n, escape)
        fit = goodness_of_fit([n - outside, outside], [1.0, 0.0], what="one cell", labels=["a", "b"], tv=TV)
        ctx.record(fit)
        assert fit.passed, fit.report()

    record = _run(check, f"synthetic_one_cell_{escape}", backend)
    if escape:
        assert (record.status, record.look) == ("failed", "interim"), record.message
        return
    assert (record.status, record.look) == ("passed", "early_pass"), record.message
    one_cell = record.statistics[1]
    assert one_cell["df"] == 0 and one_cell["power"] >= TARGET_POWER
    assert one_cell["detects"] >= -math.log(EARLY_PASS_BETA / len(LOOKS)) / one_cell["n"]


@pytest.mark.parametrize("shift, status, look", [(0.0, "passed", "early_pass"), (0.03, "failed", "interim")])
def test_a_total_passes_early_at_its_exact_mean_and_fails_when_shifted(shift, status, look, backend):
    def check(b, ctx):
        n = math.ceil(20_000 * ctx.sample_scale)
        successes = np.random.default_rng(ctx.seed_for("total")).binomial(n, 0.4 + shift)
        ctx.record(assert_total(int(successes), [0.4] * n, [0.24] * n, what="successes"))

    record = _run(check, f"synthetic_total_{int(shift * 100)}", backend)
    assert (record.status, record.look) == (status, look), record.message
    if status == "failed":  # not at the 5% look; at an early-pass look, at 1/100 of its alpha, as the interim look
        assert record.message.startswith("rejected at an early-pass look") and not record.statistics
        assert any(not r["passed"] and r["alpha"] == pytest.approx(1e-8) for r in record.interim_statistics)
    if status == "passed":
        assert record.power == "full" and record.statistics[0]["power"] >= TARGET_POWER


def test_an_inconclusive_probe_sizes_the_full_look_up_and_states_its_power_net_of_beta(backend):
    def check(b, ctx):  # bad luck at every early-pass look (not at the 5% interim look)
        _draw(ctx, _law_at_tv(0.04) if ctx.look_fraction in LOOKS else P)

    record = _run(check, "synthetic_unlucky_probe", backend)
    assert record.status == "passed" and record.look == "full", record.message
    (stat,) = record.statistics
    assert stat["n"] == math.ceil(N * reserve_scale())
    fit = goodness_of_fit(np.random.default_rng(0).multinomial(stat["n"], P), P, what="x", labels=list("abcdefgh"), tv=TV)
    assert stat["power"] == pytest.approx(fit.power - EARLY_PASS_BETA) and stat["power"] >= TARGET_POWER


@pytest.mark.parametrize("unlucky", [False, True])
def test_the_looks_take_prefixes_of_one_sample_drawn_once(unlucky, backend):
    """Every look of a case extends the same stream: each draw is made once, by the largest look (the early-pass look
    it passed at, or the full look sized up after every early-pass look continued), and each look tests a prefix."""
    made: list[int] = []

    def check(b, ctx):
        n = math.ceil(N * ctx.sample_scale)
        counts = np.zeros(8, dtype=np.int64)
        seen = np.zeros(8, dtype=np.int64)
        if unlucky and ctx.look_fraction in LOOKS:  # the early-pass looks see a shifted law and continue
            seen = np.random.default_rng(2).multinomial(n, _law_at_tv(0.04)) - np.random.default_rng(2).multinomial(n, P)

        def draw(rng, index, size):
            made.append(index)
            return list(rng.choice(8, size=size, p=P))

        for x in streams.draws(ctx.streams, "tokens", n, start=lambda: np.random.default_rng(1), draw=draw, chunk=64):
            counts[x] += 1
        result = goodness_of_fit(np.maximum(counts + seen, 0), P, what="synthetic law", labels=[str(i) for i in range(8)], tv=TV)
        ctx.record(result)
        assert result.passed, result.report()

    record = _run(check, f"synthetic_stream_{unlucky}", backend)
    largest = reserve_scale() if unlucky else record.statistics[0]["early_pass"]["fraction"]
    assert record.look == ("full" if unlucky else "early_pass"), record.message
    assert made == list(range(len(made))) and len(made) == -(-math.ceil(N * largest) // 64)


def test_a_stream_is_canonical_and_forgets_a_chunk_that_raised():
    """The first n draws do not depend on the looks taken before; a chunk that raises is not kept, and the stream is
    redrawn from its start rather than continued from a half-advanced state."""
    def draw(rng, index, size):
        return list(rng.integers(0, 1000, size=size))

    direct = streams.draws({}, "k", 1000, start=lambda: np.random.default_rng(5), draw=draw, chunk=7)
    memo: dict = {}
    for n in (3, 50, 400, 1000):
        grown = streams.draws(memo, "k", n, start=lambda: np.random.default_rng(5), draw=draw, chunk=7)
        assert grown == direct[:n]
    parts, covered = streams.chunks({}, "k", 15, start=lambda: np.random.default_rng(5), draw=draw, chunk=7)
    assert covered == 21 and [x for p in parts for x in p] == direct[:21]

    calls = []

    def flaky(rng, index, size):
        calls.append(index)
        if len(calls) == 2:
            rng.integers(0, 1000, size=3)  # advances the state, then raises
            raise RuntimeError("backend crashed")
        return draw(rng, index, size)

    memo = {}
    with pytest.raises(RuntimeError):
        streams.draws(memo, "k", 20, start=lambda: np.random.default_rng(5), draw=flaky, chunk=7)
    assert "k" not in memo
    assert streams.draws(memo, "k", 20, start=lambda: np.random.default_rng(5), draw=flaky, chunk=7) == direct[:20]


def _futility_counts_statistic(counts: np.ndarray, expected: np.ndarray, n: int, min_expected: float) -> np.ndarray:
    """Pearson's statistic of each row of ``counts`` with ``goodness_of_fit``'s pooling at ``min_expected`` (laws whose
    pooled cells carry an expected count >= min_expected together, so no folding)."""
    e = expected * n
    small = e < min_expected
    x = ((counts[:, ~small] - e[~small]) ** 2 / e[~small]).sum(1)
    if small.any():
        x = x + (counts[:, small].sum(1) - e[small].sum()) ** 2 / e[small].sum()
    return x


def _visible_alternatives(p: np.ndarray, unpooled: np.ndarray, v: float, rng) -> dict:
    """Laws that move ``v`` of mass among the unpooled cells (the pooled cells untouched: the part of the stated TV a
    law may hide inside them is granted in full), in shapes that stress the lower tail differently."""
    cells = np.flatnonzero(unpooled)
    out = {}

    def moved(up, down):
        q = p.copy()
        q[up] += p[up] / p[up].sum() * v
        q[down] -= p[down] / p[down].sum() * v
        return q if (q >= 0).all() else None

    for share in (0.5, 0.25):  # the noncentrality-minimising split (1/2) and a lopsided one
        order = rng.permutation(cells)
        up = order[np.cumsum(p[order]) <= share * p[cells].sum()]
        out[f"split {share}"] = moved(up, np.setdiff1d(cells, up))
    by_size = cells[np.argsort(p[cells])]
    up = by_size[: np.searchsorted(np.cumsum(p[by_size]), 2 * v) + 1]  # the smallest unpooled cells, doubled or so
    out["smallest cells up"] = moved(up, np.setdiff1d(cells, up))
    return {k: q for k, q in out.items() if q is not None}


@pytest.mark.parametrize("law_name", ["medusa_tree", "min_new_tokens"])
def test_the_futility_statistic_keeps_every_look_beta_under_alternatives(law_name):
    """The early-pass rule's guarantee for the futility statistic (cells pooled below 5, not 20): a law whose visible
    part is the stated TV less the futility pooling's mass (the most a law can hide in pooled cells) passes a look
    with probability <= beta (EARLY_PASS_BETA / looks), simulated at every ci look on two of the suite's many-cell
    laws: the Medusa trees' 64-cell law (TV 0.1) and the batch law with min_new_tokens (about 190 cells, TV 0.03)."""
    from specdec_properties.early_pass import chi_square_futility_options
    from specdec_properties.stats import FUTILITY_MIN_EXPECTED

    if law_name == "medusa_tree":
        from conformance.tree_proposer_checks import TREE_LAW_TV as tv, _tree_law as law_of
        law, n_full, reps = law_of(), 6365, 60_000
    else:
        from conformance.batch_checks import BATCH_SEQUENCE_TV as tv, history_law

        law, n_full, reps = history_law("min_new_tokens"), 92965, 12_000
    p = np.array([x for x in law.values() if x > 0], dtype=np.float64)
    p /= p.sum()
    beta = EARLY_PASS_BETA / len(LOOKS)
    rng = np.random.default_rng(20261205)
    worst = {}
    for fraction in LOOKS:
        n = math.ceil(n_full * reserve_scale() * fraction)
        fit = goodness_of_fit(rng.multinomial(n, p), p, what=law_name, labels=[str(i) for i in range(len(p))], tv=tv)
        record = fit.as_record()
        fine = record["futility"]
        option = chi_square_futility_options(record, beta, planned_n=n * reserve_scale() / fraction).get("futility")
        if option is None:
            continue
        bound = option[2]
        unpooled = p * n >= FUTILITY_MIN_EXPECTED
        v = record["tv"] - fine["pooled_mass"]
        for shape, q in _visible_alternatives(p, unpooled, v, rng).items():
            x = _futility_counts_statistic(rng.multinomial(n, q, size=reps), p, n, FUTILITY_MIN_EXPECTED)
            worst[(fraction, shape)] = float(np.mean(x <= bound))
    assert len(worst) >= 8, worst
    assert max(worst.values()) <= beta, {k: v for k, v in worst.items() if v > beta / 2}
