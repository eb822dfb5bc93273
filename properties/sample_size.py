"""How many samples each statistical check draws: computed from the power it must state, not chosen.

The policy, in one place (it serves :mod:`specdec_properties.stats`):

* a verifier scenario's sample is the smallest block count giving *every* test made on it
  :data:`~specdec_properties.stats.TARGET_POWER` against TV :data:`~specdec_properties.stats.TV` at
  :data:`~specdec_properties.stats.ALPHA` (:func:`required_blocks`), times :data:`SAMPLE_MARGIN`;
* events rarer than :data:`MIN_EVENT_PROB` do not drive it (their tests still run and state
  their power);
* a backend that does not claim ``batched`` answers one Python call per block, so its sample is
  capped (:data:`NON_BATCHED_BLOCKS`, :data:`NON_BATCHED_GENERATED_BLOCKS`); alpha is unchanged
  and the lower power is stated in every result (and in the verdict);
* the profile scales every sample (``ci`` 1, ``dev`` 0.1, ``thorough`` 4; see ``conformance.profiles``).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import exact
from .scenarios import Scenario
from .stats import ALPHA, MIN_EXPECTED, TARGET_POWER, power_against_tv, samples_for_power

#: Events rarer than this do not drive the sample size; their checks still run and state their power.
MIN_EVENT_PROB = 0.1
#: Headroom over the computed N, so random fluctuation of a conditional count keeps the power.
SAMPLE_MARGIN = 1.1
#: Block budget per scenario for a verifier that does not claim ``batched``.
NON_BATCHED_BLOCKS = 100_000
#: Per-example sample size and alternative of the Hypothesis-driven generated-distributions check.
GENERATED_BLOCKS = 60_000
GENERATED_TV = 0.03
#: Per-example block budget of that check for a verifier that does not claim ``batched``.
NON_BATCHED_GENERATED_BLOCKS = 2_000
#: The multi-round sequence-law check (``specdec_properties.markov``): the alternative it is sized for and
#: its budget for a verifier that does not claim ``batched`` (one call per sequence and round).
LOSSLESS_TV = 0.005
NON_BATCHED_SEQUENCES = 20_000
#: Alternatives of the tree checks (``conformance.tree_checks``): the law given one drafted tree, the law
#: of one round over the drafting, the sequence law over rounds of trees; and the rows per drafted tree
#: for a backend that does not claim ``batched`` (one B = 1 call per row).
TREE_PATH_TV = 0.02
TREE_ROUND_TV = 0.01
TREE_SEQUENCE_TV = 0.01
NON_BATCHED_TREES = 20_000
#: Alternative of the mixed seeded / unseeded batch laws (per-row generators).
MIXED_BATCH_TV = 0.02


@functools.lru_cache(maxsize=None)
def _samples_for_df(df: int) -> int:
    return samples_for_power(df)


def samples_needed(law: np.ndarray, event_prob: float) -> float:
    """Blocks needed for a test of ``law`` on an event of probability ``event_prob`` (0 for rare events)."""
    if event_prob < MIN_EVENT_PROB:
        return 0.0
    return _samples_for_df(max(int(np.count_nonzero(law)) - 1, 0)) / event_prob


def required_blocks(scenario: Scenario, law: "exact.BlockLaw | None" = None) -> int:
    """Smallest block count giving every statistical check on ``scenario`` the target power.

    ``law``: the scenario's exact laws under the backend's scheme (default: token-wise)."""
    law = law or exact.block_law(exact.TOKEN, scenario.target, scenario.draft)
    k, reach, length = law.k, law.reach, law.length
    needs = [samples_needed(length, 1.0)]
    needs += [samples_needed(law.emitted(j), reach[j]) for j in range(k + (law.bonus is not None))]
    needs += [samples_needed(law.steps[j], reach[j]) for j in range(k)]
    needs += [samples_needed(law.residual(j), length[j]) for j in range(k) if length[j] > 0]
    return with_margin(max(needs))


def with_margin(needed: float) -> int:
    return math.ceil(needed * SAMPLE_MARGIN)


def scaled_blocks(wanted: int, *, batched: bool, scale: float, cap: int = NON_BATCHED_BLOCKS) -> int:
    """The block count to draw: ``wanted`` (capped at ``cap`` for a non-batched backend) times the profile's scale."""
    if not batched:
        wanted = min(wanted, cap)
    return math.ceil(wanted * scale)


def required_samples(law: np.ndarray, tv: float, *, alpha: float = ALPHA, power: float = TARGET_POWER) -> int:
    """Smallest N at which a test of ``law`` states ``power`` against ``tv`` once the cells it
    pools at that N (expected count below ``MIN_EXPECTED``) are discounted, as ``goodness_of_fit`` does."""

    def enough(n: int) -> bool:
        small = (law > 0) & (law * n < MIN_EXPECTED)
        df = int(np.count_nonzero(law > 0) - small.sum()) - (0 if small.any() else 1)
        return power_against_tv(n, df, alpha, tv - float(law[small].sum())) >= power

    lo, hi = 1, 1
    while not enough(hi):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo
