"""The early-pass look: a statistical check may pass on part of its sample when the evidence already excludes
every deviation it states power against (a group-sequential futility rule).

``conformance.registry.run_case`` probes a case on each of the profile's ``early_pass_fractions`` of its sample in
turn (ci / thorough profiles: 0.25, 0.35, 0.5, 0.7, each a prefix of the same sample). The case passes at the first
look where every test's statistic is at or below its :func:`futility_bound`: a deviation at the stated alternative
exceeds that bound with probability >= ``1 - EARLY_PASS_BETA / looks``. The futility rule never rejects, so it spends
no alpha (``run_case`` lets a look reject as the interim look does, at 1/100 of alpha, counted with the interim
looks); together the looks spend up to ``EARLY_PASS_BETA`` of power (union bound over the looks), which the full look
(sized up by :func:`reserve_scale`) makes up: by the union bound the whole procedure keeps the stated power, and
every record states that net power (:func:`spend_early_pass_power`).

A chi-square test's look is judged on its *futility statistic* (the record's ``futility``, from
:meth:`specdec_properties.stats.FitResult.futility`): Pearson's statistic of the same counts with cells pooled below
``FUTILITY_MIN_EXPECTED`` (5) instead of ``MIN_EXPECTED`` (20). The test's own pooling exists for the null's upper
tail at alpha 1e-6; a look that can only pass needs the lower tail under alternatives, where the noncentral
approximation holds at 5 (``tests/test_early_pass.py`` simulates it), and a law with many small cells no longer loses
its whole TV budget to pooled mass at the early looks.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Sequence

from scipy import stats

from .stats import ALPHA, TARGET_POWER, _finite_or_none, _noncentrality_for_power, detectable_tv, power_against_tv

if TYPE_CHECKING:
    from .stats import FitResult

#: A futility statistic's bound is the noncentral quantile at this share of the look's beta: the approximation's margin
#: at small expected counts (simulated at beta itself, the least favourable laws pass a look with probability up to
#: 0.96 beta; at half of it they stay below 0.6 beta: ``tests/test_early_pass.py``).
FUTILITY_BETA_SHARE = 0.5
#: The power an early-pass look may spend: a law at the stated TV lets a case pass there with probability at most
#: this (conformance.registry.run_case; the final look is sized up by :func:`reserve_scale` to make up for it).
EARLY_PASS_BETA = 0.005


@functools.lru_cache(maxsize=None)
def reserve_scale(alpha: float = ALPHA, beta: float = EARLY_PASS_BETA, power: float = TARGET_POWER) -> float:
    """Factor on a chi-square test's N that raises its power from ``power`` to ``power + beta`` at ``alpha``, for every
    df: the noncentrality ratio at df = 1, where it is largest (it falls with df: 1.070 at df 1, 1.042 at df 1000 for
    alpha 1e-6; tests/test_stats.py checks df 1..1000)."""
    return _noncentrality_for_power(1, alpha, power + beta) / _noncentrality_for_power(1, alpha, power)


def planned_shift(record: dict, planned_n: float, beta: float = EARLY_PASS_BETA) -> float:
    """The rate shift a total test's full look of ``planned_n`` trials detects with power ``TARGET_POWER + beta`` (its
    variance scaled from the record's ``n`` trials; the alternative an early pass of that test is stated against)."""
    std = record["std"] * math.sqrt(planned_n / record["n"])
    power = TARGET_POWER + beta + 1e-9  # a hair above, so that the power stated net of beta is not below the target by rounding
    return float((stats.norm.isf(record["alpha"] / 2) + stats.norm.isf(1 - power)) * std / planned_n)


def futility_bound(record: dict, beta: float = EARLY_PASS_BETA, planned_n: float | None = None) -> float | None:
    """The largest statistic at which a test's ``record`` lets its case pass early, or None (no bound: it cannot); the
    statistic it applies to (the test's own, or its futility statistic) and the bound: :func:`futility_look`."""
    look = futility_look(record, beta, planned_n)
    return None if look is None else look[1]


def futility_look(record: dict, beta: float = EARLY_PASS_BETA, planned_n: float | None = None) -> tuple[float, float] | None:
    """``(statistic, bound)`` of a test's early-pass look: the case may pass there when the statistic is at or below
    the bound; None when the test has no bound.

    Chi-square: every law at TV >= ``t`` puts the statistic above the bound with probability >= ``1 - beta`` at the
    record's N (the noncentral chi-square with ``4 N (t - pooled_mass)^2``, as :func:`power_against_tv` bounds the
    power), capped below the critical value at its df; df >= 1 only. ``t`` is the record's stated ``tv``, or the
    smaller TV that the full look of ``planned_n`` samples detects with :data:`TARGET_POWER` (an over-powered test
    keeps its power against the deviations its full look sees). The statistic is the test's own (its pooling) or, when
    the record has one, its futility statistic (finer pooling, module docstring; quantile at
    :data:`FUTILITY_BETA_SHARE` of ``beta``): whichever a correct backend passes more often (the null's chi-square
    probability below each bound, a choice made before the data are seen, so ``beta`` holds either way). Total (a
    normal z): the bound on ``|z|`` that a shift of :func:`planned_shift` per trial (the full look's alternative;
    ``planned_n`` needed) exceeds with probability >= ``1 - beta`` at the record's N. ``beta`` is one look's share of
    :data:`EARLY_PASS_BETA`."""
    if record.get("kind") == "total":
        if planned_n is None or not record.get("n") or not record.get("std"):
            return None
        mean_z = planned_shift(record, planned_n) * record["n"] / record["std"]  # the procedure's alternative, whatever this look's beta
        bound = float(min(max(mean_z + stats.norm.ppf(beta), 0.0), stats.norm.isf(record["alpha"] / 2)))
        return abs(record["statistic"]), bound
    if record.get("rare_bin"):  # an exact binomial test of a rare bin: its statistic is not noncentral chi-square
        return None
    if record.get("kind") == "chi_square" and record.get("df") == 0 and record.get("n") and _one_possible_cell(record):
        # it rejects on any draw outside its one cell: a law putting >= tv there escapes n draws w.p. <= (1 - tv)^n
        return (record["statistic"], 0.0) if (1.0 - record["tv"]) ** record["n"] <= beta else None
    options = chi_square_futility_options(record, beta, planned_n)
    if not options:
        return None
    _, statistic, bound = max(options.values(), key=lambda o: o[0])
    return statistic, bound


def chi_square_futility_options(record: dict, beta: float = EARLY_PASS_BETA, planned_n: float | None = None) -> dict:
    """``{"own" | "futility": (null pass probability, statistic, bound)}``: the early-pass bounds of a chi-square
    test's own statistic and of its futility statistic (:func:`futility_look` takes the first of the larger null pass
    probability); empty when neither has a bound."""
    if record.get("kind") != "chi_square" or not record.get("df") or record["df"] < 1 or not record.get("n"):
        return {}
    tv = record["tv"]
    if planned_n:
        tv = min(tv, detectable_tv(planned_n, record["df"], record["alpha"], pooled_mass=record.get("pooled_mass", 0.0)))

    def bound(df: int, pooled: float, quantile: float) -> float | None:
        lam = 4.0 * record["n"] * max(tv - pooled, 0.0) ** 2
        if lam <= 0:
            return None
        return float(min(stats.ncx2.ppf(quantile, df, lam), stats.chi2.isf(record["alpha"], df)))

    options = {}
    own = bound(record["df"], record.get("pooled_mass", 0.0), beta)
    if own is not None:
        options["own"] = (float(stats.chi2.cdf(own, record["df"])), record["statistic"], own)
    fine = record.get("futility")
    if fine:
        finer = bound(fine["df"], fine["pooled_mass"], beta * FUTILITY_BETA_SHARE)
        if finer is not None:
            options["futility"] = (float(stats.chi2.cdf(finer, fine["df"])), fine["statistic"], finer)
    return options


def _one_possible_cell(record: dict) -> bool:
    """A df-0 chi-square test with nothing pooled: the exact law has one possible cell, any other outcome rejects."""
    return record.get("df") == 0 and not record.get("pooled_mass")


def _may_bound_later(record: dict, planned_n: float, fit=None) -> bool:
    """A chi-square test without a bound at this look that a larger look (up to ``planned_n``) would bound: its one
    cell's escape probability falls below beta by then (df 0), or its pooled cells no longer carry the stated TV at
    ``planned_n`` (df >= 1; needs the test's ``fit`` to recompute the pooling, else no)."""
    if record.get("kind") != "chi_square" or not record.get("n") or record.get("rare_bin"):
        return False
    if _one_possible_cell(record):
        return (1.0 - record["tv"]) ** planned_n <= EARLY_PASS_BETA / 4
    if (record.get("df") or 0) < 1 or fit is None or not hasattr(fit, "pooling_at"):
        return False
    return fit.pooling_at(planned_n)[1] < record["tv"]


def early_pass(records: Sequence[dict], beta: float = EARLY_PASS_BETA, scale: float = 1.0,
               fits: Sequence | None = None) -> tuple[str, str]:
    """``("pass" | "continue" | "ineligible", why)`` for the statistical records of an early-pass look that drew
    ``1 / scale`` of the full look's sample.

    *pass*: every record is at or below its :func:`futility_bound` (no impossible outcome), so a deviation at the
    stated alternative in any of them would have been seen with probability >= ``1 - beta``. *ineligible*: some
    record has no such bound (a measurement, one possible cell) or there is none: the case always runs in full.
    *continue*: eligible, but some statistic is above its bound, or a test has no bound at this look's N that a
    larger look would have (:func:`_may_bound_later`; ``fits``: the tests' own objects, in the records' order).
    """
    if not records:
        return "ineligible", "no statistical test"
    worst = None
    for i, r in enumerate(records):
        look = futility_look(r, beta, planned_n=r.get("n", 0) * scale)
        fit = fits[i] if fits is not None and i < len(fits) else None
        if look is None and _may_bound_later(r, r.get("n", 0) * scale, fit):  # a larger look may have one
            worst = worst or f"{r['what']}: no futility bound at N = {r['n']} (pooled cells carry the stated TV)"
            continue
        if look is None:
            return "ineligible", f"{r.get('what')}: no futility bound (a measurement, or one possible cell)"
        statistic, bound = look
        if r.get("impossible") or statistic > bound:
            worst = worst or f"{r['what']}: statistic {statistic:.2f} above the early-pass bound {bound:.2f}"
    if worst:
        return "continue", worst
    return "pass", ""


def spend_early_pass_power(record: dict, fit: FitResult | None = None, planned_n: float | None = None,
                           beta: float = EARLY_PASS_BETA, look_n: int | None = None, look_beta: float = EARLY_PASS_BETA,
                           project_groups: bool = False) -> dict:
    """``record`` (of the test ``fit``) stating the power of the whole procedure: its full look's power net of the
    ``beta`` an early-pass look spent (union bound: a law at the stated TV escapes both with probability <= ``1 -
    P + beta``). ``planned_n``: the full look's N, for a case that passed early (its pooling recomputed at that N
    from ``fit``); default the record's own N. ``look_n``, ``look_beta``: the early-pass look a df-0 test passed at
    (its draws and its share of beta), which bound the TV the procedure detects from below. ``project_groups``: a
    grouped test's pooling at ``planned_n`` projected from its groups' visits
    (:meth:`specdec_properties.stats.FitResult.projected_pooling`) instead of kept as at the look."""
    if record.get("kind") == "total":
        n = record["n"] if planned_n is None else planned_n
        shift = planned_shift(record, n, beta)
        std = record["std"] * math.sqrt(n / record["n"])
        crit, delta = stats.norm.isf(record["alpha"] / 2), shift * n / std
        out = dict(record)
        out["tv"] = out["detects"] = shift
        out["power"] = max(float(stats.norm.sf(crit - delta) + stats.norm.cdf(-crit - delta)) - beta, 0.0)
        return out
    if record.get("kind") != "chi_square":
        return record
    target = min(TARGET_POWER + beta, 1 - 1e-12)
    if fit is not None and planned_n is not None:
        power, detects = fit.power_at(planned_n, target, project_groups=project_groups)
    else:
        tv = max(record["tv"] - record.get("pooled_mass", 0.0), 0.0)
        power = power_against_tv(record["n"], record["df"], record["alpha"], tv)
        detects = detectable_tv(record["n"], record["df"], record["alpha"], pooled_mass=record.get("pooled_mass", 0.0),
                                power=target)
    out = dict(record)
    out["power"] = max(power - beta, 0.0)
    out["detects"] = _finite_or_none(detects)
    if look_n and _one_possible_cell(record) and out["detects"] is not None:
        # passed early on look_n draws: a law escaping the one cell with mass t did so w.p. (1 - t)^look_n, which is
        # below the look's beta only from t = -log(beta) / look_n on (the full look alone would detect less)
        out["detects"] = max(out["detects"], -math.log(look_beta) / look_n)
    return out
