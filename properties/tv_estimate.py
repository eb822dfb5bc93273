"""Measuring a lossy law: the total variation between observed counts and an exact law, with a confidence interval
that holds whatever the observed law (a measurement, never a test; records of kind ``tv_estimate``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

#: Confidence of the total-variation interval reported for a backend declared ``lossy``.
TV_CONFIDENCE = 0.99


@dataclass
class TVEstimate:
    """The total variation between the law behind ``observed`` counts and an exact law, with an interval.

    ``estimate`` is the plug-in ``1/2 sum |n_i/N - p_i|`` (clipped into the interval). ``[lo, hi]``
    holds the true TV with probability >= ``confidence`` whatever the observed law: every cell's
    probability gets a Clopper-Pearson interval at level ``(1 - confidence) / cells`` (Bonferroni,
    every cell including the ones never observed), so with that probability the true law lies in
    the box they form, and ``lo`` / ``hi`` are the smallest / largest ``1/2 sum |r_i - p_i|`` over
    that box's corners (a valid, conservative bound). A measurement, not a test: it never fails.
    """

    what: str
    n: int
    cells: int
    confidence: float
    estimate: float
    lo: float
    hi: float
    extra: dict = field(default_factory=dict)

    def covers(self, tv: float) -> bool:
        return self.lo <= tv <= self.hi

    def report(self) -> str:
        return (
            f"{self.what}: total variation from the exact law {self.estimate:.4f}, "
            f"{self.confidence:.0%} interval [{self.lo:.4f}, {self.hi:.4f}] (N={self.n}, {self.cells} cells)"
        )

    def as_record(self) -> dict:
        return {
            "kind": "tv_estimate",
            "what": self.what,
            "n": self.n,
            "cells": self.cells,
            "confidence": self.confidence,
            "estimate": self.estimate,
            "lo": self.lo,
            "hi": self.hi,
            **self.extra,
        }


def is_test(record: dict) -> bool:
    """Whether a statistics record is a hypothesis test (with alpha and power), not a measurement."""
    return record.get("kind") != "tv_estimate"


def estimate_tv(observed, expected, *, what: str, confidence: float = TV_CONFIDENCE, extra: dict | None = None) -> TVEstimate:
    """:class:`TVEstimate` of the law behind ``observed`` counts against the exact law ``expected``."""
    observed = np.asarray(observed, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.float64)
    if observed.shape != expected.shape:
        raise ValueError(f"observed has shape {observed.shape}, expected {expected.shape}")
    n = int(observed.sum())
    if n == 0:
        return TVEstimate(what, 0, observed.size, confidence, math.nan, 0.0, 1.0, dict(extra or {}))
    expected = expected / expected.sum()
    level = (1.0 - confidence) / observed.size
    lower = np.where(observed > 0, stats.beta.ppf(level / 2, observed, n - observed + 1), 0.0)
    upper = np.where(observed < n, stats.beta.isf(level / 2, observed + 1, n - observed), 1.0)
    lower, upper = np.nan_to_num(lower, nan=0.0), np.nan_to_num(upper, nan=1.0)
    gap_below = np.clip(lower - expected, 0.0, None)
    gap_above = np.clip(expected - upper, 0.0, None)
    lo = 0.5 * float((gap_below + gap_above).sum())
    hi = min(1.0, 0.5 * float(np.maximum(np.abs(lower - expected), np.abs(upper - expected)).sum()))
    plug_in = 0.5 * float(np.abs(observed / n - expected).sum())
    return TVEstimate(what, n, observed.size, confidence, min(max(plug_in, lo), hi), lo, hi, dict(extra or {}))
