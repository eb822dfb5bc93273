"""The suite's run settings, defined once: profiles (Hypothesis settings + sample scale) and the base seed.

A profile is what ``--hypothesis-profile`` names: ``ci`` (the default; derandomised, sized for
the stated power), ``dev`` (ten times fewer samples and examples, lower power stated in every
result) and ``thorough`` (four times the samples, 600 examples, not derandomised). Every way of
running a check (pytest, :func:`conformance.run_checks`, replays, the mutation score, the
benchmarks) runs it under :func:`use_profile` of the context's profile, so a check gives the
same result however it is run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from hypothesis import HealthCheck, settings

#: The base seed of every check (``--specdec-seed`` overrides it); each case derives its own from it.
DEFAULT_SEED = 20261129
#: The profile used when none is named.
DEFAULT_PROFILE = "ci"

_COMMON = dict(
    deadline=None,
    report_multiple_bugs=False,  # one failure per check, shown in full
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


#: Share of a statistical check's alpha spent at its interim look (the final look keeps the full alpha; the
#: family-wise bound adds both). 1e-8 against 1e-6: a correct backend fails an interim look 100x less often.
INTERIM_ALPHA_SCALE = 0.01


@dataclass(frozen=True)
class Profile:
    """One row of the profile table: Hypothesis settings, the multiplier of every statistical sample size, and
    the fraction of the sample a statistical check looks at first (0: no interim look).

    The interim look runs the check on ``interim_fraction`` of its sample with alpha scaled by
    :data:`INTERIM_ALPHA_SCALE`; a rejection there is final (a broken backend fails in a fraction of the time),
    otherwise the check runs in full at its stated alpha and power. The two looks together spend
    ``(1 + INTERIM_ALPHA_SCALE)`` times the per-test alpha, which the certificate's family-wise bound includes.

    After it, a check whose tests are chi-square tests or totals gets *early-pass looks* at each of
    ``early_pass_fractions`` of its sample in turn (:mod:`specdec_properties.early_pass`): it passes at the first where every
    statistic is below the bound that a deviation at the stated alternative exceeds with probability >= 1 -
    ``EARLY_PASS_BETA / len(early_pass_fractions)`` (the futility rule never rejects; a look that rejects does so as the
    interim look, at ``INTERIM_ALPHA_SCALE`` times the alpha, which the family-wise bound adds); otherwise its full
    look draws ``reserve_scale()`` (1.07) times the sample, so that the whole procedure keeps the stated power (union
    bound over the looks). Every look takes a prefix of the same sample (:mod:`conformance.streams`), so a correct
    backend draws about 0.33-0.44 of its sample per such check.
    """

    name: str
    sample_scale: float
    hypothesis: dict
    interim_fraction: float = 0.0
    early_pass_fractions: tuple[float, ...] = ()

    @property
    def derandomized(self) -> bool:
        return bool(self.hypothesis.get("derandomize", False))


#: The shares of the sample at which a statistical check may pass early (ci and thorough profiles), each look on a
#: longer prefix of the same sample; each spends EARLY_PASS_BETA / 4 of power. Chosen for the smallest expected share a
#: correct backend draws (0.33 of the sample at df 1 to 0.44 at df 200, simulated, against 0.50-0.54 with one look at
#: half the sample) while nearly every correct case passes at one of them (>= 0.99 at df <= 200).
EARLY_PASS_FRACTIONS = (0.25, 0.35, 0.5, 0.7)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("ci", 1.0, dict(max_examples=60, derandomize=True, print_blob=True, **_COMMON), interim_fraction=0.05,
                early_pass_fractions=EARLY_PASS_FRACTIONS),
        Profile("dev", 0.1, dict(max_examples=20, derandomize=True, **_COMMON)),
        Profile("thorough", 4.0, dict(max_examples=600, derandomize=False, print_blob=True, **_COMMON), interim_fraction=0.05,
                early_pass_fractions=EARLY_PASS_FRACTIONS),
    )
}

for _profile in PROFILES.values():
    settings.register_profile(_profile.name, **_profile.hypothesis)


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def current_profile_name() -> str:
    """The suite profile Hypothesis has loaded (``ci`` when it runs another one)."""
    name = getattr(settings, "_current_profile", None)
    return name if name in PROFILES else DEFAULT_PROFILE


@contextlib.contextmanager
def use_profile(name: str) -> Iterator[Profile]:
    """Load the suite profile ``name`` into Hypothesis for the duration, then restore the previous one."""
    profile = get_profile(name)
    previous = getattr(settings, "_current_profile", None) or "default"
    settings.load_profile(profile.name)
    try:
        yield profile
    finally:
        settings.load_profile(previous)
