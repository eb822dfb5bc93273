"""Calibration of the statistical oracle: measured false-alarm rate and measured power.

* False alarms: the reference verifier over many independent seeds; every
  statistical test of the balanced scenario is run on each seed's sample. The
  p-values of a correct implementation must be uniform (Kolmogorov-Smirnov), and
  failures at the suite's alpha must be as rare as stated.
* Power: synthetic samplers whose law is at a controlled total-variation
  distance from the exact law (the worst direction for the chi-square test,
  a mixture with the draft distribution, and mass moved between two cells),
  sampled at the ci profile's N, tested at the suite's alpha; the detection
  rate is compared with the power the oracle states.

``python -m conformance.calibration`` prints both tables (the README's) at the ``ci`` profile's looks (the profile
is the suite's: this module imports nothing of ``conformance``).
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from . import exact
from .sampling import BlockCounts, BlockSampler, count_blocks, sum_counts
from .scenarios import STAT_SCENARIOS
from .stats import ALPHA, goodness_of_fit


def scenario_tests(counts: BlockCounts, name: str = "balanced") -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Every (test name, observed, expected) the verifier checks run on one scenario sample."""
    sc = STAT_SCENARIOS[name]
    p, q, k = sc.target, sc.draft, sc.k
    law = exact.length_law(p, q)
    tests = [("length", counts.length, law)]
    tests += [(f"emitted@{j}", counts.emitted(j), exact.emitted_law(p, j)) for j in range(k + 1)]
    tests += [(f"step@{j}", counts.steps[j], exact.step_law(p, q, j)) for j in range(k)]
    tests += [(f"residual@{j}", counts.residual(j), exact.residual_law(p, q, j)) for j in range(k) if law[j] > 0]
    return tests


def _cell_labels(expected: np.ndarray) -> list[str]:
    return [f"cell {i}" for i in range(len(expected))]


#: Prefix of the interim looks' tests in :func:`false_alarms`' result: ``"interim@<fraction>:<test>"``.
INTERIM = "interim@"


def false_alarms(backend, *, seeds: int = 200, blocks: int = 100_000, scenario: str = "balanced", first_seed: int = 10_000,
                 interim_fractions: tuple[float, ...] = ()):
    """p-values of every scenario test over ``seeds`` independent samples of a correct backend.

    ``interim_fractions`` also runs the suite's looks before the full one on each seed: the same tests on the first
    ``fraction * blocks`` blocks of the seed's sample (each look a prefix of one stream, as ``run_case`` draws them),
    keyed ``"interim@<fraction>:<test>"``. The suite rejects at such a look at 1/100 of the test's alpha: the interim
    look and every early-pass look.
    """
    pvalues: dict[str, list[float]] = {}
    labels = {max(1, int(blocks * f)): f"{INTERIM}{f:g}:" for f in interim_fractions if 0 < f < 1}  # look size -> key
    sizes = sorted(labels)
    for seed in range(first_seed, first_seed + seeds):
        sampler, parts = BlockSampler(backend, STAT_SCENARIOS[scenario], seed), []
        for n in sizes + [blocks]:
            parts.append(sampler.draw(n - sampler.done))
            counts = sum_counts(parts)
            for test, observed, expected in scenario_tests(counts, scenario):
                fit = goodness_of_fit(observed, expected, what=test, labels=_cell_labels(expected))
                pvalues.setdefault(labels.get(n, "") + test, []).append(fit.p_value)
    return {test: np.asarray(v) for test, v in pvalues.items()}


def summarise_false_alarms(pvalues: dict[str, np.ndarray], interim_alpha_scale: float = 0.01) -> dict:
    """Failure counts at the suite's alpha, 0.01 and 0.05 and the uniformity of the p-values. With looks before the
    full one, ``all_looks_at_<level>`` counts (seed, test) pairs rejected by any look: an earlier look at
    ``interim_alpha_scale * level`` or the full look at ``level`` (the suite's procedure, whose early passes can only
    remove rejections; at most ``(1 + looks * interim_alpha_scale) * level`` expected)."""
    interim: dict[str, list[np.ndarray]] = {}
    for t, v in pvalues.items():
        if t.startswith(INTERIM):
            interim.setdefault(t.split(":", 1)[1], []).append(v)
    pvalues = {t: v for t, v in pvalues.items() if not t.startswith(INTERIM)}
    every = np.concatenate(list(pvalues.values()))
    ks = {test: float(stats.kstest(v, "uniform").pvalue) for test, v in pvalues.items()}
    looks = {}
    if interim:
        first = {t: np.minimum.reduce(v) for t, v in interim.items()}  # the smallest p-value over the earlier looks
        looks["earlier_looks"] = len(next(iter(interim.values())))
        for level in (ALPHA, 0.01, 0.05):
            looks[f"all_looks_at_{level:g}"] = int(sum(
                ((pvalues[t] <= level) | (first[t] <= interim_alpha_scale * level)).sum() for t in pvalues))
        looks["interim_ks_min"] = min(float(stats.kstest(p, "uniform").pvalue) for v in interim.values() for p in v)
    return {
        **looks,
        "tests": len(every),
        "failures_at_alpha": int((every <= ALPHA).sum()),
        "expected_failures_at_alpha": len(every) * ALPHA,
        "failures_at_0.01": int((every <= 0.01).sum()),
        "expected_at_0.01": len(every) * 0.01,
        "failures_at_0.05": int((every <= 0.05).sum()),
        "expected_at_0.05": len(every) * 0.05,
        "min_ks_pvalue": min(ks.values()),
        "ks_pvalues": ks,
    }


def worst_direction(p: np.ndarray, tv: float) -> np.ndarray:
    """A law at TV ``tv`` from ``p`` with the smallest chi-square noncentrality: mass moved pro rata between two halves."""
    order = np.argsort(p)
    half = np.zeros(len(p), dtype=bool)
    half[order[np.searchsorted(np.cumsum(p[order]), 0.5) :]] = True
    a = p[half].sum()
    moved = p.copy()
    moved[half] *= 1 + tv / a
    moved[~half] *= 1 - tv / (1 - a)
    return moved


def mixture_direction(p: np.ndarray, q: np.ndarray, tv: float) -> np.ndarray:
    """``(1-l) p + l q`` at TV ``tv`` from ``p`` (a verifier that sometimes keeps the draft's choice)."""
    lam = tv / (0.5 * np.abs(p - q).sum())
    return (1 - lam) * p + lam * q


def two_cells_direction(p: np.ndarray, tv: float) -> np.ndarray:
    """``tv`` of mass moved from the largest cell to the second largest."""
    order = np.argsort(-p)
    moved = p.copy()
    moved[order[0]] -= tv
    moved[order[1]] += tv
    return moved


def power_table(n: int, *, tvs=(0.001, 0.003, 0.01), repeats: int = 200, seed: int = 0, scenario: str = "balanced"):
    """Detection rate vs stated power for synthetic biased samplers of row 0 (the first-token test) at ``n`` samples."""
    sc = STAT_SCENARIOS[scenario]
    p = exact.emitted_law(sc.target, 0)
    q = sc.draft[0] / sc.draft[0].sum()
    rng = np.random.default_rng(seed)
    rows = []
    for tv in tvs:
        for direction, law in (
            ("worst case", worst_direction(p, tv)),
            ("mixture with q", mixture_direction(p, q, tv)),
            ("two cells", two_cells_direction(p, tv)),
        ):
            detected, stated = 0, None
            for _ in range(repeats):
                result = goodness_of_fit(rng.multinomial(n, law), p, what="first token", labels=_cell_labels(p), tv=tv)
                detected += not result.passed
                stated = result.power
            rows.append(
                {"tv": tv, "direction": direction, "n": n, "stated_power": stated, "detection_rate": detected / repeats, "repeats": repeats}
            )
    return rows


def early_pass_table(n: int, fractions: tuple[float, ...], *, tvs=(0.0, 0.001, 0.003, 0.01), repeats: int = 200,
                     seed: int = 1, scenario: str = "balanced") -> list[dict]:
    """The suite's procedure with its early-pass looks (``conformance.registry.run_case``) on the first-token test:
    looks at each of ``fractions`` of the sample in turn, each on a prefix of the same draws (``conformance.streams``),
    passing at the first whose statistic is below its futility bound (``EARLY_PASS_BETA / len(fractions)`` each);
    otherwise the full look on ``reserve_scale()`` times ``n``, the same draws and fresh ones after them. Per law (TV
    0: the exact law): the share passed early, the mean share of ``n`` drawn, the detection rate of the whole
    procedure, and the power it states against the suite's TV (the full look's, net of the power the looks spend;
    None below that TV, where the futility bounds promise nothing)."""
    from .early_pass import EARLY_PASS_BETA, early_pass, reserve_scale, spend_early_pass_power
    from .stats import TV

    sc = STAT_SCENARIOS[scenario]
    p = exact.emitted_law(sc.target, 0)
    labels = _cell_labels(p)
    scale = reserve_scale()
    sizes = [int(round(n * f)) for f in fractions]
    n_full = int(round(n * scale))
    beta = EARLY_PASS_BETA / len(fractions)
    rng = np.random.default_rng(seed)
    rows = []
    for tv in tvs:
        law = worst_direction(p, tv) if tv > 0 else p
        stated_tv = TV  # the check's stated alternative decides the futility bound, whatever the law
        early = detected = 0
        drawn = 0.0
        for _ in range(repeats):
            counts, have = np.zeros(len(p), dtype=np.int64), 0
            passed = False
            for size, fraction in zip(sizes, fractions):
                counts, have = counts + rng.multinomial(size - have, law), size
                fit = goodness_of_fit(counts, p, what="first token", labels=labels, tv=stated_tv)
                if not fit.passed:
                    break
                if early_pass([fit.as_record()], beta=beta, scale=scale / fraction)[0] == "pass":
                    passed = True
                    break
            if passed:
                early += 1
                drawn += have / n
                continue
            full = goodness_of_fit(counts + rng.multinomial(n_full - have, law), p, what="first token", labels=labels, tv=stated_tv)
            drawn += n_full / n
            detected += not full.passed
        # what a record states: the full look's power (pooling at its N, not the sample) net of the looks' beta
        stated = spend_early_pass_power(fit.as_record(), fit, n_full)["power"] if tv >= stated_tv else None
        rows.append({"tv": tv, "n_looks": sizes, "n_full": n_full, "repeats": repeats, "passed_early": early / repeats,
                     "mean_share_drawn": drawn / repeats, "detection_rate": detected / repeats, "stated_power": stated})
    return rows
