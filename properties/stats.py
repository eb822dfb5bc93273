"""The statistical oracle: one goodness-of-fit helper with stated N, alpha and power.

Every distributional assertion of the suite goes through :func:`assert_fits`.
It runs Pearson's chi-square test (``scipy.stats.chisquare``) of observed
counts against an *exact* expected distribution and states:

* ``N``: the number of samples behind the counts;
* ``alpha``: the per-test false-alarm probability (default :data:`ALPHA`);
* the alternative it has power against: *every* distribution at total
  variation distance ``>= tv`` from the expected one (default :data:`TV`);
* that power, from the noncentral chi-square with the smallest noncentrality
  any such alternative can have, ``4 N tv^2`` (Pearson's noncentrality
  ``N sum (p1 - p0)^2 / p0`` is minimised, at fixed TV, by moving ``tv`` of mass
  between two halves of the support: ``tv^2 (1/a + 1/(1-a)) >= 4 tv^2``).

Cells whose expected count is below :data:`MIN_EXPECTED` are pooled (the
chi-square approximation needs it); the pooled mass is subtracted from ``tv``
before the power is computed, so the stated power stays a lower bound. A
sample in a cell of expected probability exactly 0 is an *impossible outcome*
and fails the test outright (p-value 0).

Family-wise error: the suite runs a known number of such tests per run
(reported by the plugin); by Bonferroni the probability that a correct
backend fails any of them is at most that number times ``alpha``.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import functools

import numpy as np
from scipy import optimize, stats

#: Per-test false-alarm probability of every statistical check.
ALPHA = 1e-6
#: The total-variation distance every statistical check is sized to detect.
TV = 0.003
#: The power each check is sized to reach against :data:`TV` at :data:`ALPHA`.
TARGET_POWER = 0.99
#: Cells a failed test's record carries (the largest standardised deviations).
RECORDED_CELLS = 40
#: Cells with a smaller expected count are pooled into one.
MIN_EXPECTED = 20.0
#: The pooling of an early-pass look's futility statistic (:mod:`specdec_properties.early_pass`): the same Pearson statistic
#: with cells pooled below this expected count. It only ever lets a case *pass* early (never rejects), so it needs the
#: noncentral approximation's lower tail under alternatives, not the null's extreme upper tail that MIN_EXPECTED
#: protects; ``tests/test_early_pass.py`` checks that lower tail by simulation.
FUTILITY_MIN_EXPECTED = 5.0
#: A test that cannot detect a law this far (in TV, or a rate shift) from the exact one with
#: :data:`TARGET_POWER` is *inconclusive*: it would pass a backend that moves half the mass.
INCONCLUSIVE_TV = 0.5


_ALPHA_SCALE = contextvars.ContextVar("specdec_alpha_scale", default=1.0)


@contextlib.contextmanager
def alpha_spent(scale: float) -> Iterator[None]:
    """Every test run inside uses ``scale * alpha`` (an interim look spends a small share of the alpha).

    The scaled alpha is what the results state (``FitResult.alpha``, ``TotalResult.alpha``), so the power
    and the family-wise bound are computed from what was actually spent.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"alpha scale must be in (0, 1], got {scale!r}")
    token = _ALPHA_SCALE.set(scale)
    try:
        yield
    finally:
        _ALPHA_SCALE.reset(token)


_FAILED = contextvars.ContextVar("specdec_failed_tests", default=None)


@contextlib.contextmanager
def failed_tests() -> Iterator[list]:
    """Collect every test that fails inside (the results an ``assert_*`` helper raises on, which never reach the
    caller's ``record``), so a report can show what failed, cell by cell."""
    collected: list = []
    token = _FAILED.set(collected)
    try:
        yield collected
    finally:
        _FAILED.reset(token)


def _note_failure(result) -> None:
    collected = _FAILED.get()
    if collected is not None:
        collected.append(result)


def spent(alpha: float) -> float:
    """``alpha`` scaled by the enclosing :func:`alpha_spent` (itself outside one)."""
    return alpha * _ALPHA_SCALE.get()


def power_against_tv(n: float, df: int, alpha: float, tv: float) -> float:
    """Lower bound on the chi-square test's power against any alternative at TV >= tv."""
    if n <= 0 or tv <= 0:
        return 0.0
    if df <= 0:
        # one possible cell: any alternative at TV >= tv puts >= tv outside it,
        # and a single sample there is an impossible outcome
        return float(-math.expm1(n * math.log1p(-min(tv, 1.0))))
    critical = stats.chi2.isf(alpha, df)
    return float(stats.ncx2.sf(critical, df, 4.0 * n * tv * tv))


@functools.lru_cache(maxsize=None)
def _noncentrality_for_power(df: int, alpha: float, power: float) -> float:
    """Smallest noncentrality at which the level-``alpha`` chi-square test on ``df`` df has ``power``."""
    critical = stats.chi2.isf(alpha, df)
    hi = 1.0
    while stats.ncx2.sf(critical, df, hi) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 0.0, hi, xtol=1e-10))


def detectable_tv(n: float, df: int, alpha: float, *, pooled_mass: float = 0.0, power: float = TARGET_POWER) -> float:
    """Smallest TV that :func:`power_against_tv` detects with ``power`` (``inf`` for N = 0): the inverse of it."""
    if n <= 0:
        return math.inf
    if df <= 0:
        return pooled_mass - math.expm1(math.log1p(-power) / n)
    return pooled_mass + math.sqrt(_noncentrality_for_power(df, alpha, power) / (4.0 * n))


def _finite_or_none(x: float) -> float | None:
    """Records are JSON: a TV no sample size can detect (N = 0) is ``None``, not ``inf``."""
    return float(x) if math.isfinite(x) else None


def judge_power(records: Sequence[dict]) -> tuple[str, str]:
    """``("full" | "reduced" | "inconclusive", why)`` for the statistical records one check made.

    *full*: every test has :data:`TARGET_POWER` against the alternative it states. *reduced*: some
    test has less, but each still detects TV (or rate shift) :data:`INCONCLUSIVE_TV` with that power.
    *inconclusive*: no test at all, or one that cannot (N = 0 included). ``records`` are
    :meth:`FitResult.as_record` / :meth:`TotalResult.as_record` dicts.
    """
    measured = any(not is_test(r) for r in records)
    records = [r for r in records if is_test(r)]
    if not records:
        if measured:
            return "full", ""  # a measurement states its own confidence interval; nothing to power
        return "inconclusive", "the check made no statistical test"
    level, why = "full", ""
    for r in records:
        if r["detects"] is None or not r["detects"] <= INCONCLUSIVE_TV:
            detects = "none" if r["detects"] is None else f"{r['detects']:.3g}"
            return "inconclusive", (
                f"inconclusive: {r['what']}: N={r['n']} samples cannot detect even TV {INCONCLUSIVE_TV:g} "
                f"(smallest TV detected with power {TARGET_POWER:g}: {detects}); too few samples, not a pass"
            )
        if r["power"] < TARGET_POWER and level == "full":
            level, why = "reduced", f"{r['what']}: detects TV >= {r['detects']:.3g} (power {r['power']:.4f} at TV {r['tv']:g})"
    return level, why


def samples_for_power(df: int, *, alpha: float = ALPHA, tv: float = TV, power: float = TARGET_POWER) -> int:
    """Smallest N whose :func:`power_against_tv` reaches ``power``."""
    lo, hi = 1, 1
    while power_against_tv(hi, df, alpha, tv) < power:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if power_against_tv(mid, df, alpha, tv) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class FitResult:
    """Outcome of one goodness-of-fit test; readable with :meth:`report`."""

    what: str
    n: int
    alpha: float
    tv: float
    power: float
    statistic: float
    df: int
    p_value: float
    labels: list[str]
    observed: np.ndarray
    expected: np.ndarray  # probabilities
    pooled: list[str] = field(default_factory=list)
    pooled_mass: float = 0.0
    impossible: list[tuple[str, int]] = field(default_factory=list)
    seed: int | None = None
    replay: str | None = None
    min_expected: float = MIN_EXPECTED
    grouped: bool = False  # a product-multinomial test (conditional_goodness_of_fit): cells pooled per group
    rare_bin: bool = False  # one big cell and a pooled bin of expected count < min_expected, tested by its exact upper tail
    group_counts: tuple[int, ...] = ()  # a grouped test's visits per group (its cells: one block of labels per group)

    @property
    def passed(self) -> bool:
        return not self.impossible and self.p_value > self.alpha

    def pooling_at(self, n: float) -> tuple[int, float]:
        """``(df, pooled mass)`` the same test would have on ``n`` samples (cells pool where ``p n < min_expected``,
        as :func:`goodness_of_fit` pools them); a grouped test keeps its own (its groups' counts are random)."""
        if self.grouped:
            return self.df, self.pooled_mass
        possible = self.expected > 0
        small = possible & (self.expected * n < self.min_expected)
        big = int((possible & ~small).sum())
        pooled = float(self.expected[small].sum())
        extra = 1 if small.any() and (pooled * n >= self.min_expected or big <= 1) else 0  # big == 1: the rare bin
        return big + extra - 1, pooled

    def projected_pooling(self, n: float) -> tuple[int, float]:
        """``(df, pooled mass)`` on ``n`` samples; for a grouped test, projected from its groups' visits (each group's
        count scaled by ``n / self.n``, each group pooled as :func:`goodness_of_fit` pools it), where
        :meth:`pooling_at` keeps the test's own."""
        if not self.grouped or not self.group_counts or not self.n:
            return self.pooling_at(n)
        width = len(self.labels) // len(self.group_counts)
        df, weighted = 0, 0.0
        for g, nc in enumerate(self.group_counts):
            probs = self.expected[g * width:(g + 1) * width] * self.n / nc
            m = nc * n / self.n
            possible = probs > 0
            small = possible & (probs * m < self.min_expected)
            big = int((possible & ~small).sum())
            pooled = float(probs[small].sum())
            extra = 1 if small.any() and (pooled * m >= self.min_expected or big <= 1) else 0
            df += max(big + extra - 1, 0)
            weighted += nc * pooled
        return df, weighted / self.n

    def futility(self) -> dict | None:
        """The early-pass look's statistic (:data:`FUTILITY_MIN_EXPECTED` pooling) of the same counts, as
        ``{statistic, df, pooled_mass, min_expected}``; None for a grouped or rare-bin test, an impossible outcome, or
        when the finer pooling leaves no degree of freedom."""
        if self.grouped or self.rare_bin or self.impossible or self.min_expected <= FUTILITY_MIN_EXPECTED or not self.n:
            return None
        fine = goodness_of_fit(self.observed, self.expected, what=self.what, labels=self.labels, alpha=self.alpha,
                               tv=self.tv, min_expected=FUTILITY_MIN_EXPECTED)
        if fine.rare_bin or fine.df < 1 or (fine.df, fine.pooled_mass) == (self.df, self.pooled_mass):
            return None
        return {"statistic": fine.statistic, "df": fine.df, "pooled_mass": fine.pooled_mass,
                "min_expected": FUTILITY_MIN_EXPECTED}

    def power_at(self, n: float, power: float = TARGET_POWER, *, project_groups: bool = False) -> tuple[float, float]:
        """``(power against the stated TV, TV detected with power ``power``)`` of the same test on ``n`` samples
        (``project_groups``: a grouped test's pooling projected, :meth:`projected_pooling`)."""
        df, pooled = self.projected_pooling(n) if project_groups else self.pooling_at(n)
        return power_against_tv(n, df, self.alpha, max(self.tv - pooled, 0.0)), detectable_tv(n, df, self.alpha, pooled_mass=pooled, power=power)

    @property
    def detects(self) -> float:
        """The smallest TV this test detects with :data:`TARGET_POWER`."""
        return detectable_tv(self.n, self.df, self.alpha, pooled_mass=self.pooled_mass)

    def headline(self) -> str:
        verdict = "consistent with" if self.passed else "NOT consistent with"
        return (
            f"{self.what}: N={self.n} samples are {verdict} the exact distribution "
            f"(chi-square {self.statistic:.1f} on {self.df} df, p={self.p_value:.3g}, alpha={self.alpha:g}; "
            f"power {self.power:.4f} against any TV >= {self.tv:g})"
        )

    def table(self, max_rows: int = 40) -> str:
        """Observed vs expected per cell, largest standardised deviations first."""
        expected_counts = self.expected * self.n
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(expected_counts > 0, (self.observed - expected_counts) / np.sqrt(expected_counts), np.inf)
        order = np.argsort(-np.abs(np.where(self.observed + expected_counts > 0, z, 0)))
        lines = [f"{'cell':>14} {'observed':>10} {'expected':>12} {'obs freq':>9} {'exp prob':>9} {'z':>8}"]
        for i in order[:max_rows]:
            if self.observed[i] == 0 and expected_counts[i] == 0:
                continue
            lines.append(
                f"{self.labels[i]:>14} {int(self.observed[i]):>10} {expected_counts[i]:>12.1f} "
                f"{self.observed[i] / max(self.n, 1):>9.5f} {self.expected[i]:>9.5f} {z[i]:>8.2f}"
            )
        if len(order) > max_rows:
            lines.append(f"... {len(order) - max_rows} more cells")
        return "\n".join(lines)

    def report(self) -> str:
        parts = [self.headline()]
        if self.impossible:
            cells = ", ".join(f"{label} ({count}x)" for label, count in self.impossible)
            parts.append(f"impossible outcomes (expected probability 0) were observed: {cells}")
        if self.pooled:
            parts.append(f"pooled {len(self.pooled)} cells of total expected mass {self.pooled_mass:.2e}")
        parts.append(self.table())
        if self.seed is not None:
            parts.append(f"seed: {self.seed}")
        if self.replay:
            parts.append(f"replay: {self.replay}")
        return "\n".join(parts)

    def as_record(self) -> dict:
        return {
            "what": self.what,
            "n": self.n,
            "alpha": self.alpha,
            "tv": self.tv,
            "power": self.power,
            "detects": _finite_or_none(self.detects),
            "statistic": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "passed": self.passed,
            "impossible": [list(x) for x in self.impossible],
            "pooled_mass": self.pooled_mass,
            "seed": self.seed,
            "kind": "chi_square",
            **({"rare_bin": True} if self.rare_bin else {}),
            **({"futility": fine} if (fine := self.futility()) else {}),
            **({} if self.passed else {"cells": self.cell_records()}),
        }

    def cell_records(self, max_cells: int = RECORDED_CELLS) -> list[list]:
        """``[label, observed, expected count, standardised residual]`` of the cells deviating most (a failed test's
        record carries them, for plots and readers; impossible cells first, residual ``None``)."""
        expected_counts = self.expected * self.n
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(expected_counts > 0, (self.observed - expected_counts) / np.sqrt(expected_counts), np.inf)
        score = np.where(self.observed + expected_counts > 0, np.abs(z), -1.0)
        order = [int(i) for i in np.argsort(-score, kind="stable") if score[i] >= 0][:max_cells]
        return [[self.labels[i], int(self.observed[i]), float(expected_counts[i]), None if not np.isfinite(z[i]) else float(z[i])]
                for i in order]


def goodness_of_fit(
    observed: Sequence[int] | np.ndarray,
    expected: Sequence[float] | np.ndarray,
    *,
    what: str,
    labels: Sequence[str],
    alpha: float = ALPHA,
    tv: float = TV,
    seed: int | None = None,
    replay: str | None = None,
    min_expected: float = MIN_EXPECTED,
) -> FitResult:
    """Chi-square test of ``observed`` counts against exact probabilities ``expected``."""
    alpha = spent(alpha)
    observed = np.asarray(observed, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.float64)
    if observed.shape != expected.shape or observed.ndim != 1:
        raise ValueError(f"observed {observed.shape} and expected {expected.shape} must be 1-d of equal length")
    if (expected < 0).any() or not np.isfinite(expected).all():
        raise ValueError("expected probabilities must be finite and non-negative")
    total = expected.sum()
    if not 0.999 < total < 1.001:
        raise ValueError(f"expected probabilities must sum to 1, got {total!r}")
    expected = expected / total
    labels = [str(x) for x in labels]
    if len(labels) != len(observed):
        raise ValueError(f"{what}: {len(labels)} labels for {len(observed)} cells: every cell needs a label")
    n = int(observed.sum())
    impossible = [(labels[i], int(observed[i])) for i in np.flatnonzero((expected == 0) & (observed > 0))]

    possible = expected > 0
    counts = expected * n
    small = possible & (counts < min_expected)
    big = np.flatnonzero(possible & ~small)
    obs_cells = list(observed[big])
    exp_cells = list(counts[big])
    pooled_idx = np.flatnonzero(small)
    pooled_mass = float(expected[pooled_idx].sum())
    # rare bin: one big cell and pooled cells too small even pooled, which folded into it would hide any excess there
    rare = bool(len(pooled_idx)) and len(exp_cells) == 1 and counts[pooled_idx].sum() < min_expected
    if len(pooled_idx):
        if counts[pooled_idx].sum() >= min_expected or len(exp_cells) <= 1:
            obs_cells.append(observed[pooled_idx].sum())
            exp_cells.append(counts[pooled_idx].sum())
        else:  # too small even pooled: fold into the smallest cell
            j = int(np.argmin(exp_cells))
            obs_cells[j] += observed[pooled_idx].sum()
            exp_cells[j] += counts[pooled_idx].sum()
    df = len(exp_cells) - 1
    if n == 0 or sum(obs_cells) == 0:  # nothing observed in a possible cell (impossible outcomes decide)
        statistic, p_value = 0.0, 1.0
    elif df <= 0:
        statistic, p_value = 0.0, 1.0
    elif rare:  # exact upper tail of the rare bin's count (its chi-square equivalent as the statistic)
        p_value = float(stats.binom.sf(int(obs_cells[-1]) - 1, sum(obs_cells), pooled_mass))
        statistic = float(stats.chi2.isf(p_value, 1)) if p_value < 1 else 0.0
    else:
        exp_arr = np.asarray(exp_cells, dtype=np.float64)
        obs_arr = np.asarray(obs_cells, dtype=np.float64)
        exp_arr *= obs_arr.sum() / exp_arr.sum()  # impossible cells are outside; keep totals equal
        res = stats.chisquare(obs_arr, exp_arr)
        statistic, p_value = float(res.statistic), float(res.pvalue)
    if impossible:
        p_value = 0.0
    power = power_against_tv(n, df, alpha, max(tv - pooled_mass, 0.0))
    return FitResult(
        what=what,
        n=n,
        alpha=alpha,
        tv=tv,
        power=power,
        statistic=statistic,
        df=df,
        p_value=p_value,
        labels=labels,
        observed=observed,
        expected=expected,
        pooled=[labels[i] for i in pooled_idx],
        pooled_mass=pooled_mass,
        impossible=impossible,
        seed=seed,
        replay=replay,
        min_expected=min_expected,
        rare_bin=rare,
    )


def conditional_goodness_of_fit(
    groups: Sequence[tuple[str, Sequence[int] | np.ndarray, Sequence[float] | np.ndarray]],
    *,
    what: str,
    labels: Sequence[str],
    alpha: float = ALPHA,
    tv: float = TV,
    min_expected: float = MIN_EXPECTED,
) -> FitResult:
    """Product-multinomial chi-square: per group ``(name, counts, exact probabilities)``, one statistic.

    Each group is a *context class*: outcomes each drawn from that class's exact law given everything
    before them (a Markov chain's transitions out of one state, say). The statistic is the sum of the
    groups' Pearson statistics (each with its cells pooled as :func:`goodness_of_fit` pools them), on
    the sum of their degrees of freedom; under the null it is asymptotically chi-square even though the
    visit counts are random, because every outcome is a fresh draw from its class's law given the past
    (the goodness-of-fit test of a Markov chain's transition law). ``labels`` names the outcomes (shared by
    every group); cells read ``"<group> -> <label>"``. The alternative: the law of *every* outcome at
    TV >= ``tv`` from its class's law; the smallest noncentrality is then ``4 sum_c n_c (tv - m_c)_+^2 >=
    4 N (tv - m)_+^2`` (convexity), with ``m_c`` the mass a class pools and ``m`` their visit-weighted
    mean, which is stated as ``pooled_mass`` so that ``power`` and ``detects`` keep their meaning.
    """
    alpha = spent(alpha)
    stat, df, n = 0.0, 0, 0
    all_labels, observed, expected, pooled, impossible, visits = [], [], [], [], [], []
    weighted_pool = 0.0
    for name, counts, probs in groups:
        counts = np.asarray(counts, dtype=np.int64)
        nc = int(counts.sum())
        if nc == 0:
            continue
        cell_labels = [f"{name} -> {lab}" for lab in labels]
        fit = goodness_of_fit(counts, probs, what=f"{what}: {name}", labels=cell_labels, alpha=alpha, tv=tv,
                              min_expected=min_expected)
        stat += fit.statistic
        df += fit.df
        n += nc
        visits.append(nc)
        weighted_pool += nc * fit.pooled_mass
        all_labels.extend(cell_labels)
        observed.append(counts)
        expected.append(fit.expected * nc)  # counts now; normalised below
        pooled.extend(fit.pooled)
        impossible.extend(fit.impossible)
    pooled_mass = weighted_pool / n if n else 0.0
    p_value = float(stats.chi2.sf(stat, df)) if df > 0 and n > 0 else 1.0
    if impossible:
        p_value = 0.0
    obs = np.concatenate(observed) if observed else np.zeros(0, dtype=np.int64)
    exp = np.concatenate(expected) / n if n else np.zeros(0, dtype=np.float64)
    return FitResult(
        what=what, n=n, alpha=alpha, tv=tv, power=power_against_tv(n, df, alpha, max(tv - pooled_mass, 0.0)),
        statistic=float(stat), df=df, p_value=p_value, labels=all_labels, observed=obs, expected=exp,
        pooled=pooled, pooled_mass=pooled_mass, impossible=impossible, grouped=True, group_counts=tuple(visits),
    )


def assert_fits(observed, expected, *, what: str, **kwargs) -> FitResult:
    """Assert that counts follow the exact distribution; the failure shows every cell.

    Returns the :class:`FitResult` (N, alpha, power, p-value) so callers can record it.
    """
    __tracebackhide__ = True
    result = goodness_of_fit(observed, expected, what=what, **kwargs)
    if not result.passed:
        _note_failure(result)
        raise AssertionError(result.report())
    return result


@dataclass
class TotalResult:
    """Outcome of :func:`assert_total`: an observed total of independent trials against its exact
    expectation (``unit`` names what is counted)."""

    what: str
    n: int
    observed: int
    expected: float
    std: float
    z: float
    alpha: float
    shift: float
    power: float
    p_value: float
    detects: float = math.inf  # the rate shift detected with TARGET_POWER
    unit: str = "successes"

    @property
    def passed(self) -> bool:
        return self.p_value > self.alpha

    def report(self) -> str:
        verdict = "consistent with" if self.passed else "NOT consistent with"
        return (
            f"{self.what}: {self.observed} {self.unit} in N={self.n} trials are {verdict} the exact expectation "
            f"{self.expected:.1f} (rate {self.observed / max(self.n, 1):.4f} vs {self.expected / max(self.n, 1):.4f}, "
            f"sd {self.std:.1f}, z={self.z:.2f}, two-sided p={self.p_value:.3g}, alpha={self.alpha:g}; "
            f"power {self.power:.4f} against a rate shift of {self.shift:g})"
        )

    def as_record(self) -> dict:
        return {
            "what": self.what,
            "n": self.n,
            "alpha": self.alpha,
            "tv": self.shift,
            "power": self.power,
            "detects": _finite_or_none(self.detects),
            "statistic": self.z,
            "df": 1,
            "p_value": self.p_value,
            "passed": self.passed,
            "observed": self.observed,
            "expected": self.expected,
            "std": self.std,
            "unit": self.unit,
            "kind": "total",
        }


def assert_total(
    observed: int, means, variances, *, what: str, alpha: float = ALPHA, shift: float | None = None, unit: str = "successes"
) -> TotalResult:
    """Assert that a total of independent bounded trials with exact ``means`` and ``variances`` is as expected.

    Normal approximation of the total (N is hundreds or more); the power is stated against a shift of
    the mean per trial by ``shift`` (default: the shift detected with :data:`TARGET_POWER`).
    """
    __tracebackhide__ = True
    alpha = spent(alpha)
    means = np.asarray(means, dtype=np.float64)
    n = len(means)
    expected = float(means.sum())
    std = float(np.sqrt(np.asarray(variances, dtype=np.float64).sum()))
    z = (observed - expected) / std if std > 0 else (0.0 if observed == expected else math.copysign(math.inf, observed - expected))
    p_value = float(2 * stats.norm.sf(abs(z)))
    crit = stats.norm.isf(alpha / 2)
    detects = float((crit + stats.norm.isf(1 - TARGET_POWER)) * std / n) if n else math.inf
    if shift is None:
        shift = detects
    delta = shift * n / std if std > 0 else math.inf
    power = float(stats.norm.sf(crit - delta) + stats.norm.cdf(-crit - delta)) if n else 0.0
    result = TotalResult(what, n, int(observed), expected, std, z, alpha, shift, power, p_value, detects, unit)
    if not result.passed:
        _note_failure(result)
        raise AssertionError(result.report())
    return result


# ----------------------------------------------------------------------------- measuring a lossy law: specdec_properties.tv_estimate

from .tv_estimate import TV_CONFIDENCE, TVEstimate, estimate_tv, is_test  # noqa: E402,F401  (importable from here as before)
