"""Checks as plain functions, collected in one registry (scikit-learn's parametrize_with_checks style).

A check is ``func(backend, ctx, **params)``: it raises ``AssertionError`` (or a
subclass) when the backend breaks the contract and returns nothing or a list of
:class:`properties.stats.FitResult` it computed. Each check names the bug class
it guards against and the capabilities it needs. The pytest layer
(``conformance/test_*.py``) parametrises over :func:`all_cases`; without pytest,
:func:`run_checks` returns one record per case.
"""
from __future__ import annotations

import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from specdec_ref.contract import NotSupportedError, check_requirement

from .watchdog import DEFAULT_TIMEOUT, BackendTimeout, time_limit  # noqa: F401  (BackendTimeout re-exported)

DEFAULT_SEED = 20261129

#: Sample-size multiplier per Hypothesis profile name; ``ci`` is sized for the stated power.
PROFILE_SAMPLE_SCALE = {"dev": 0.1, "default": 1.0, "ci": 1.0, "thorough": 4.0}


@dataclass
class CheckContext:
    """What a check needs besides the backend: seed, sample scale, and where results go."""

    seed: int = DEFAULT_SEED
    profile: str = "ci"
    results: list = field(default_factory=list)
    findings: list = field(default_factory=list)  # non-failing observations, e.g. classified numerical flips
    replay: str = ""  # the command that re-runs the current check, shown in failures
    timeout: float | None = DEFAULT_TIMEOUT  # per-check limit in seconds (conformance.watchdog); 0 or None: none

    @property
    def sample_scale(self) -> float:
        return PROFILE_SAMPLE_SCALE.get(self.profile, 1.0)

    def seed_for(self, *parts: Any) -> int:
        """A seed that depends only on the base seed and ``parts`` (never on worker or order)."""
        return (self.seed ^ zlib.crc32(repr(parts).encode())) & 0x7FFFFFFF

    def record(self, result) -> None:
        self.results.append(result)


@dataclass(frozen=True)
class Check:
    name: str
    func: Callable[..., Any]
    guards: str
    requires: tuple[str, ...]
    cases: tuple[tuple[str, dict], ...]  # (case id, params)
    group: Callable[[dict], str] | None = None
    statistical: bool = False

    @property
    def family(self) -> str:
        """The module's concept: ``verifier``, ``decoder`` or ``cache`` (one conformance test file each)."""
        return self.func.__module__.rsplit(".", 1)[-1].removesuffix("_checks")

    @property
    def doc(self) -> str:
        return (self.func.__doc__ or "").strip()


@dataclass(frozen=True)
class CheckCase:
    check: Check
    case_id: str
    params: dict

    @property
    def id(self) -> str:
        return f"{self.check.name}-{self.case_id}" if self.case_id else self.check.name

    @property
    def group(self) -> str:
        return self.check.group(self.params) if self.check.group else self.id

    def run(self, backend, ctx: CheckContext):
        __tracebackhide__ = True
        return self.check.func(backend, ctx, **self.params)


CHECKS: dict[str, Check] = {}


def check(
    *,
    guards: str,
    requires: Iterable[str] = (),
    cases: Iterable[tuple[str, dict]] | None = None,
    group: Callable[[dict], str] | None = None,
    statistical: bool = False,
):
    """Register a check function; ``guards`` names the bug class it exists to catch."""
    requires = tuple(requires)
    for flag in requires:
        check_requirement(flag)

    def register(func):
        name = func.__name__.removeprefix("check_")
        if name in CHECKS:
            raise ValueError(f"duplicate check name {name!r}")
        CHECKS[name] = Check(
            name=name,
            func=func,
            guards=guards,
            requires=requires,
            cases=tuple(cases) if cases is not None else (("", {}),),
            group=group,
            statistical=statistical,
        )
        return func

    return register


def all_cases(names: Iterable[str] | None = None) -> list[CheckCase]:
    _load_check_modules()
    selected = CHECKS if names is None else {n: CHECKS[n] for n in names}
    return [CheckCase(c, case_id, params) for c in selected.values() for case_id, params in c.cases]


def missing_capabilities(case: CheckCase, backend) -> list[str]:
    return [flag for flag in case.check.requires if not backend.capabilities.has(flag)]


@dataclass
class CheckRecord:
    """One check case's outcome, as data (for reports and for tests of the harness)."""

    id: str
    check: str
    guards: str
    status: str  # "passed" | "failed" | "skipped" | "error"
    message: str = ""
    seconds: float = 0.0
    statistics: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)


def run_case(case: CheckCase, backend, ctx: CheckContext, timeout: float | None = None) -> CheckRecord:
    """Run one case and turn any outcome into a record; never raises.

    ``timeout`` (seconds; default ``ctx.timeout``, 0 disables) limits the case's wall-clock
    time: a backend that does not return gives a "failed" record whose message comes from
    :class:`conformance.watchdog.BackendTimeout` (see that module for the limitations).
    """
    missing = missing_capabilities(case, backend)
    if missing:
        return CheckRecord(case.id, case.check.name, case.check.guards, "skipped", f"backend does not claim {missing}")
    ctx.results, ctx.findings = [], []
    start = time.perf_counter()
    try:
        with time_limit(ctx.timeout if timeout is None else timeout, case.id):
            case.run(backend, ctx)
        status, message = "passed", ""
    except AssertionError as exc:
        status, message = "failed", str(exc)
    except NotSupportedError as exc:
        status, message = "failed", f"backend claims {list(case.check.requires)} but raised NotSupportedError: {exc}"
    except Exception as exc:  # a misbehaving backend is a named failure, never a crashed harness
        status, message = "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
    return CheckRecord(
        case.id,
        case.check.name,
        case.check.guards,
        status,
        message,
        time.perf_counter() - start,
        [r.as_record() for r in ctx.results],
        list(ctx.findings),
    )


def run_checks(backend, ctx: CheckContext | None = None, names: Iterable[str] | None = None) -> list[CheckRecord]:
    """Run every registered check (or ``names``) on ``backend``: one record per case."""
    ctx = ctx or CheckContext()
    return [run_case(case, backend, ctx) for case in all_cases(names)]


def _load_check_modules() -> None:
    from . import cache_checks, contract_checks, decoder_checks, verifier_checks  # noqa: F401  (registers on import)
