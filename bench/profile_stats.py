"""Statistics of a paired profile: medians and bootstrap confidence intervals of paired ratios.

A *unit* is one prompt (B = 1) or one group of B prompts decoded together; every unit has one ratio per
repeat (baseline seconds per token over candidate seconds per token, measured back to back). The unit's
ratio is the median of its repeats; the profile's ratio is the median over units. Its 95 % interval is a
two-level percentile bootstrap: resample units with replacement, then each chosen unit's repeats, and take
the median of the resampled unit medians. Deterministic for a given ``seed``.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import median
from typing import Sequence

from .kit import percentile

__all__ = ["Interval", "bootstrap_median", "paired_ratio"]


@dataclass(frozen=True)
class Interval:
    """A point estimate and its ``level`` confidence interval ``[low, high]``."""

    value: float
    low: float
    high: float
    level: float = 0.95

    def text(self, digits: int = 2, suffix: str = "x") -> str:
        """``"1.42x [1.37, 1.47]"``."""
        return f"{self.value:.{digits}f}{suffix} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def as_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "level": self.level}


def bootstrap_median(groups: Sequence[Sequence[float]], *, resamples: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """Median over groups of each group's median, with a two-level percentile bootstrap interval (module docstring)."""
    groups = [list(g) for g in groups if len(g)]
    if not groups:
        return Interval(math.nan, math.nan, math.nan, level)
    value = median(median(g) for g in groups)
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        picked = [groups[rng.randrange(len(groups))] for _ in groups]
        stats.append(median(median(rng.choice(g) for _ in g) for g in picked))
    tail = 100 * (1 - level) / 2
    return Interval(value, percentile(stats, tail), percentile(stats, 100 - tail), level)


def paired_ratio(baseline: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]], **kwargs) -> Interval:
    """``baseline[u][r] / candidate[u][r]`` (seconds per token: > 1 means the candidate is faster), summarised by
    :func:`bootstrap_median`. Both are indexed [unit][repeat] and were measured in the same repeat."""
    if len(baseline) != len(candidate) or any(len(a) != len(b) for a, b in zip(baseline, candidate)):
        raise ValueError("paired_ratio needs the same units and repeats on both sides")
    return bootstrap_median([[a / b for a, b in zip(au, bu)] for au, bu in zip(baseline, candidate)], **kwargs)
