"""The specdec conformance suite: certify a speculative-decoding backend.

With pytest (the plugin is registered on install)::

    python -m pytest --pyargs conformance --specdec-backend=your.module:factory

Without pytest, scikit-learn style::

    from conformance import run_checks, certificate_for_records
    records = run_checks(backend)                  # one CheckRecord per check case
    cert = certificate_for_records(records, backend=backend)
    print(cert["verdict"]["headline"])            # the same verdict the plugin prints

In your own test file::

    from conformance import parametrize_with_checks

    @parametrize_with_checks([MyBackend()])
    def test_conformance(backend, check):
        check(backend)

Names are imported lazily, so loading the pytest plugin stays cheap.
"""
from __future__ import annotations

from typing import Any, Iterable

__all__ = [
    "run_checks",
    "run_case",
    "parametrize_with_checks",
    "certificate_for_records",
    "load_backend",
    "CheckRecord",
    "CheckContext",
    "CHECKS",
    "all_cases",
]

_LAZY = {
    "run_checks": "registry",
    "run_case": "registry",
    "CheckRecord": "registry",
    "CheckContext": "registry",
    "CHECKS": "registry",
    "all_cases": "registry",
    "certificate_for_records": "report",
    "load_backend": "backends",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")


class CaseRunner:
    """``check(backend)`` in a user's test: runs one case through the suite's core and raises its outcome
    (``pytest.skip`` for unclaimed capabilities, an assertion for a failure)."""

    def __init__(self, case, seed: int | None = None, profile: str | None = None):
        self.case, self.seed, self.profile = case, seed, profile

    def __call__(self, backend) -> None:
        __tracebackhide__ = True
        from .plugin import raise_outcome
        from .profiles import DEFAULT_SEED, current_profile_name
        from .registry import CheckContext, run_case

        ctx = CheckContext(seed=DEFAULT_SEED if self.seed is None else self.seed, profile=self.profile or current_profile_name())
        raise_outcome(run_case(self.case, backend, ctx))

    def __repr__(self) -> str:
        return self.case.id


def parametrize_with_checks(backends: Iterable, *, names: Iterable[str] | None = None, seed: int | None = None,
                            profile: str | None = None):
    """A ``pytest.mark.parametrize("backend, check", ...)`` over every check case (or the checks ``names``)
    for each backend; test ids are ``<backend name>-<check id>``."""
    import pytest

    from .registry import all_cases

    params = [
        pytest.param(backend, CaseRunner(case, seed, profile), id=f"{getattr(backend, 'name', 'backend')}-{case.id}",
                     marks=[pytest.mark.xdist_group(case.group)])
        for backend in backends
        for case in all_cases(names)
    ]
    return pytest.mark.parametrize("backend, check", params)
