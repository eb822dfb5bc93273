"""Hypothesis profiles of the suite: ``ci`` (the default), ``dev`` and ``thorough``.

Select one with Hypothesis's own ``--hypothesis-profile``. The profile also
scales the statistical checks' sample sizes (see
``conformance.registry.PROFILE_SAMPLE_SCALE``): ``ci`` is sized for the stated
power, ``dev`` is ten times smaller (its lower power is stated in every
result), ``thorough`` four times larger.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,
    report_multiple_bugs=False,  # one failure per check, shown in full
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

settings.register_profile("ci", max_examples=60, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("dev", max_examples=20, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=600, derandomize=False, print_blob=True, **_COMMON)

PROFILES = ("ci", "dev", "thorough")


def current_profile_name() -> str:
    name = getattr(settings, "_current_profile", None)
    return name if name in PROFILES else "ci"
