"""Checks as plain functions in one registry, and the one core that runs a check case.

A check is ``func(backend, ctx, **params)``: it raises ``AssertionError`` (or a
subclass) when the backend breaks the contract, :class:`NotApplicable` when its
case does not apply, and records every statistical test it makes with
``ctx.record(result)``. Each check names the bug class it guards against and the
capabilities it needs (scikit-learn's ``parametrize_with_checks`` style).

:func:`run_case` is the only place a check runs: under pytest (the thin adapter
in :mod:`conformance.plugin`), in :func:`run_checks`, in replays, in the
mutation score and in the benchmarks. It loads the context's profile
(:mod:`conformance.profiles`), arms the time limit, and turns every outcome into
a :class:`CheckRecord`, so a check gives the same result however it is run.

Ids (stable; what ``--specdec-xfails`` lines and ``-k`` name):

* a check id is the function name without ``check_``: lowercase words joined by ``_``;
* a case id names *roles*, never tuned values: lowercase words joined by ``_``, parts
  joined by ``-`` (``balanced-j0``, ``llama-greedy``, ``top_p``);
* a test id is ``<check id>`` for a check with one case, else ``<check id>-<case id>``.

Outcomes: ``passed``; ``failed`` (the backend broke the contract); ``error`` (the
backend raised); ``inconclusive`` (a statistical check whose tests cannot detect
even a large deviation, e.g. N = 0: never a pass); ``skipped`` (capability not
claimed, or case not applicable, with the reason).
"""
from __future__ import annotations

import re
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from specdec_properties.sampling import BackendError
from specdec_properties.early_pass import EARLY_PASS_BETA, early_pass, reserve_scale, spend_early_pass_power
from specdec_properties.stats import alpha_spent, failed_tests, is_test, judge_power
from specdec_ref.contract import NotSupportedError, check_requirement

from .heap import freeze_long_lived, keep_freed_memory
from .profiles import DEFAULT_PROFILE, DEFAULT_SEED, INTERIM_ALPHA_SCALE, get_profile, use_profile
from .watchdog import DEFAULT_TIMEOUT, BackendTimeout, time_limit  # noqa: F401  (BackendTimeout re-exported)

CHECK_ID = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
CASE_ID = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*(?:-[a-z0-9]+(?:_[a-z0-9]+)*)*")


class NotApplicable(Exception):
    """Raised by a check whose case does not apply (e.g. a stopping position the scenario never reaches)."""


def exact_scheme(backend, lossy_reason: str):
    """The oracle spec (``specdec_properties.exact.SchemeSpec``) of the backend's declared exact scheme;
    :class:`NotApplicable` with ``lossy_reason`` for a backend declaring ``lossy`` (no exact law)."""
    from specdec_properties.exact import scheme_of

    if getattr(getattr(backend, "capabilities", None), "scheme", "token") == "lossy":
        raise NotApplicable(lossy_reason)
    return scheme_of(backend)


@dataclass
class CheckContext:
    """What a check needs besides the backend: seed, profile, time limit, device, and where results go."""

    seed: int = DEFAULT_SEED
    profile: str = DEFAULT_PROFILE
    results: list = field(default_factory=list)
    findings: list = field(default_factory=list)  # non-failing observations, e.g. classified numerical flips
    replay: str = ""  # the command that re-runs the current check, shown in failures
    timeout: float | None = DEFAULT_TIMEOUT  # per-check limit in seconds (conformance.watchdog); 0 or None: none
    device: str = "cpu"  # where the verifier and tree checks put verify()/verify_tree() inputs and generators (--specdec-device)
    look_fraction: float = 1.0  # the share of the sample this look draws (run_case's interim look sets it)
    streams: dict = field(default_factory=dict, repr=False)  # the case's samples, grown across its looks (conformance.streams)

    @property
    def sample_scale(self) -> float:
        return get_profile(self.profile).sample_scale * self.look_fraction

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
        """The module's concept: ``verifier``, ``decoder``, ``cache``, ``contract``, ``tree``, ``tree_decoder`` or ``batch``
        (one test file each): the module's ``FAMILY`` where it sets one (a family split over modules), else its name
        without ``_checks``."""
        module = sys.modules.get(self.func.__module__)
        return getattr(module, "FAMILY", None) or self.func.__module__.rsplit(".", 1)[-1].removesuffix("_checks")

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
        """Call the check function itself (no profile, limit or outcome handling: use :func:`run_case`)."""
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
    cases = tuple(cases) if cases is not None else (("", {}),)

    def register(func):
        name = func.__name__.removeprefix("check_")
        if name in CHECKS:
            raise ValueError(f"duplicate check name {name!r}")
        if not CHECK_ID.fullmatch(name):
            raise ValueError(f"check id {name!r} must be lowercase words joined by '_'")
        ids = [case_id for case_id, _ in cases]
        for case_id in ids:
            if case_id and not CASE_ID.fullmatch(case_id):
                raise ValueError(f"{name}: case id {case_id!r} must be role names ([a-z0-9_]) joined by '-'")
        if len(set(ids)) != len(ids) or ("" in ids and len(ids) > 1):
            raise ValueError(f"{name}: case ids must be unique (and '' only for a single case): {ids}")
        CHECKS[name] = Check(
            name=name, func=func, guards=guards, requires=requires, cases=cases, group=group, statistical=statistical
        )
        return func

    return register


def all_cases(names: Iterable[str] | None = None) -> list[CheckCase]:
    """Every registered case (or those of the checks ``names``), in registration order."""
    load_check_modules()
    if names is None:
        selected = CHECKS
    else:
        names = list(names)
        unknown = [n for n in names if n not in CHECKS]
        if unknown:
            raise KeyError(f"unknown check(s) {unknown}; registered: {sorted(CHECKS)}")
        selected = {n: CHECKS[n] for n in names}
    return [CheckCase(c, case_id, params) for c in selected.values() for case_id, params in c.cases]


def missing_capabilities(case: CheckCase, backend) -> list[str]:
    return [flag for flag in case.check.requires if not backend.capabilities.has(flag)]


def skip_reason(missing: list[str], backend) -> str:
    return f"backend {getattr(backend, 'name', '?')!r} does not claim capability {', '.join(missing)}"


@dataclass
class CheckRecord:
    """One check case's outcome, as data (for the certificate, ``run_checks`` users and the harness's tests).

    ``power`` is ``"full"``, ``"reduced"`` or ``"inconclusive"`` for a statistical check that ran
    (see :func:`specdec_properties.stats.judge_power`), else None. ``error_type``, ``error_source`` and
    ``traceback`` are set for ``error``: ``error_source`` is ``"backend"`` when the exception came out
    of a backend call (:class:`specdec_properties.sampling.BackendError`), ``"check"`` when nothing attributes
    it to one (a fault of the check itself, or a backend object raising outside the call helpers).
    ``exception`` keeps the raised exception (not serialised).
    """

    id: str
    check: str
    guards: str
    status: str
    message: str = ""
    seconds: float = 0.0
    statistics: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    missing_capabilities: list[str] = field(default_factory=list)
    power: str | None = None
    error_type: str | None = None
    error: str | None = None  # "Type: message" of the raised exception itself (what errors are grouped by)
    error_source: str | None = None
    traceback: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    interim_statistics: list[dict] = field(default_factory=list)  # the interim look's tests (alpha spent there)
    look: str = "full"  # "full", "interim" (rejected there) or "early_pass" (passed at the early-pass look)

    @property
    def rejects(self) -> bool:
        """The check rejected the backend: it failed, or the backend raised during it."""
        return self.status == "failed" or (self.status == "error" and self.error_source == "backend")

    def as_entry(self) -> dict[str, Any]:
        """The certificate's form of this record (JSON-serialisable)."""
        return {
            "check_id": self.id,
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "guards": self.guards,
            "requires": list(self.requires),
            "missing_capabilities": list(self.missing_capabilities),
            "statistics": list(self.statistics),
            "findings": list(self.findings),
            "power": self.power,
            "error_type": self.error_type,
            "error": self.error,
            "error_source": self.error_source,
            "traceback": self.traceback,
            "duration": self.seconds,
            "interim_statistics": list(self.interim_statistics),
        }


def _message(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", None) or []
    return "\n".join([str(exc), *notes]) if notes else str(exc)


def _backend_exception(exc: BaseException) -> BaseException:
    return exc.__cause__ if isinstance(exc, BackendError) and exc.__cause__ is not None else exc


def run_case(case: CheckCase, backend, ctx: CheckContext, timeout: float | None = None) -> CheckRecord:
    """Run one case under ``ctx``'s profile and time limit and turn any outcome into a record; never raises
    (``KeyboardInterrupt`` and ``SystemExit`` pass through).

    ``timeout`` (seconds; default ``ctx.timeout``, 0 disables) limits the case's wall-clock time: a
    backend that does not return gives a ``failed`` record from
    :class:`conformance.watchdog.BackendTimeout`.
    """
    record = CheckRecord(case.id, case.check.name, case.check.guards, "passed", requires=list(case.check.requires))
    missing = missing_capabilities(case, backend)
    if missing:
        record.status, record.message, record.missing_capabilities = "skipped", skip_reason(missing, backend), missing
        return record
    keep_freed_memory()  # the samples' large tensors reuse freed memory (conformance.heap; once per process)
    freeze_long_lived()  # the collector stops walking what the imports built (conformance.heap; after large imports)
    ctx.streams = {}  # every look of this case takes a prefix of the same samples; no other case sees them
    try:
        return _run_looks(case, backend, ctx, timeout)
    finally:
        ctx.streams = {}


def _run_looks(case: CheckCase, backend, ctx: CheckContext, timeout: float | None) -> CheckRecord:
    fraction = get_profile(ctx.profile).interim_fraction
    if case.check.statistical and fraction > 0 and ctx.look_fraction == 1.0:
        look = replace(ctx, look_fraction=fraction)
        interim = _look(case, backend, look, timeout, INTERIM_ALPHA_SCALE)
        if interim.status in ("failed", "error"):  # conclusive at any sample size: stop here
            rejected = replace(interim, statistics=[])
            return _rejected_early(rejected, interim, f"the interim look ({fraction:g} of the sample, alpha x "
                                                      f"{INTERIM_ALPHA_SCALE:g}; the full sample was not drawn)", ctx, look)
        fractions = get_profile(ctx.profile).early_pass_fractions
        scale = 1.0
        for early in fractions:  # the early-pass looks, each on a longer prefix of the same sample (conformance.streams)
            probe_ctx = replace(ctx, look_fraction=early)
            probe = _look(case, backend, probe_ctx, timeout, 1.0)
            interim.seconds += probe.seconds
            # each early-pass look may also reject, as the interim look does, at alpha x INTERIM_ALPHA_SCALE (its
            # tests' alphas, so scaled, join the interim looks' in the family-wise bound)
            interim.statistics = interim.statistics + [_at_interim_alpha(r) for r in probe.statistics if is_test(r)]
            if _conclusive(probe):
                probe.seconds = interim.seconds
                return _rejected_early(probe, interim, f"an early-pass look ({early:g} of the sample, alpha x "
                                                       f"{INTERIM_ALPHA_SCALE:g}; the rest of the sample was not drawn)",
                                       ctx, probe_ctx)
            if probe.status == "passed":
                decision, _ = early_pass(probe.statistics, beta=EARLY_PASS_BETA / len(fractions), scale=reserve_scale() / early,
                                         fits=probe_ctx.results)
            else:  # too few samples at this look: the next one; failed or raised on part of the sample: the full look
                decision = "continue" if probe.status == "inconclusive" else "stop"
            # "ineligible": a test without a futility bound (a TV measurement, one possible cell), so the full look runs
            # at scale 1. Not remembered: whether a backend's records have bounds can depend on the backend, and a
            # result must never depend on which cases or backends a worker ran before.
            if decision == "pass":
                probe.seconds = interim.seconds
                return _passed_early(probe, probe_ctx, ctx, interim, early, EARLY_PASS_BETA / len(fractions))
            if decision == "ineligible":
                break
            scale = reserve_scale()  # the final look makes up for the power the early-pass looks spent
            if decision == "stop":  # above its critical value (or raised) on part of the sample: the full look decides
                break
        final_ctx = replace(ctx, look_fraction=scale) if scale != 1.0 else ctx
        final = _look(case, backend, final_ctx, timeout, 1.0)
        if scale != 1.0:
            ctx.results, ctx.findings = final_ctx.results, final_ctx.findings
            final.statistics = [spend_early_pass_power(r) for r in final.statistics]
            if final.status == "passed":
                final.power, why = judge_power(final.statistics)
                if final.power == "inconclusive":
                    final.status, final.message = "inconclusive", why
        final.interim_statistics = interim.statistics
        final.seconds += interim.seconds
        return final
    return _look(case, backend, ctx, timeout, 1.0)


def _at_interim_alpha(record: dict) -> dict:
    """An early-pass look's test as an interim rejection look: at ``INTERIM_ALPHA_SCALE`` times its alpha."""
    return dict(record, alpha=record.get("alpha", 0.0) * INTERIM_ALPHA_SCALE, passed=not _rejects_at_interim(record))


def _rejects_at_interim(record: dict) -> bool:
    return bool(record.get("impossible")) or (record.get("p_value") is not None and
                                              record["p_value"] < record.get("alpha", 0.0) * INTERIM_ALPHA_SCALE)


def _conclusive(probe: CheckRecord) -> bool:
    """An early-pass look that rejects as the interim look would: a backend error, a failed assertion that is no
    statistical test (structure, stop invariants, greedy rows), or a failed test whose p-value is below alpha x
    ``INTERIM_ALPHA_SCALE`` (an impossible outcome included)."""
    if probe.status == "error":
        return True
    if probe.status != "failed":
        return False
    failed = [r for r in probe.statistics if is_test(r) and not r.get("passed", True)]
    return not failed or any(_rejects_at_interim(r) for r in failed)


def _rejected_early(record: CheckRecord, interim: CheckRecord, where: str, ctx: CheckContext,
                    look_ctx: CheckContext) -> CheckRecord:
    """The record of a case rejected before its full look: its tests there count as interim tests (their alpha is in
    the family-wise bound), none as a final one."""
    ctx.results, ctx.findings = look_ctx.results, look_ctx.findings
    record.interim_statistics, record.statistics = interim.statistics, []
    record.look = "interim"
    record.message = f"rejected at {where}:\n{record.message}"
    return record


def _passed_early(probe: CheckRecord, probe_ctx: CheckContext, ctx: CheckContext, interim: CheckRecord,
                  fraction: float, look_beta: float) -> CheckRecord:
    """The record of a case that passed at its early-pass look: its tests as drawn there, each stating the power of
    the whole procedure (the full look it would have run, sized up by ``reserve_scale``, net of the power spent)."""
    planned = reserve_scale() / fraction
    fits = list(probe_ctx.results)  # the tests' own objects, in the order of their records (the look passed)
    probe.statistics = [
        spend_early_pass_power(r, fit, r["n"] * planned, look_n=r["n"], look_beta=look_beta)
        | {"early_pass": {"look_n": r["n"], "fraction": fraction}}
        for r, fit in zip(probe.statistics, fits)
    ]
    probe.power, why = judge_power(probe.statistics)
    if probe.power == "inconclusive":
        probe.status, probe.message = "inconclusive", why
    else:
        probe.look = "early_pass"
        probe.message = (f"passed at the early-pass look on {fraction:g} of the sample: every statistic is below the "
                         f"bound a deviation at the stated alternative exceeds with probability >= {1 - look_beta:g} "
                         f"(the looks together: >= {1 - EARLY_PASS_BETA:g})")
    probe.interim_statistics = interim.statistics
    ctx.results, ctx.findings = probe_ctx.results, probe_ctx.findings
    return probe


def _look(case: CheckCase, backend, ctx: CheckContext, timeout: float | None, alpha_scale: float) -> CheckRecord:
    """One run of a case at ``ctx``'s sample share, every test at ``alpha_scale`` times its alpha."""
    record = CheckRecord(case.id, case.check.name, case.check.guards, "passed", requires=list(case.check.requires))
    ctx.results, ctx.findings = [], []
    failed: list = []
    start = time.perf_counter()
    try:
        with use_profile(ctx.profile), time_limit(ctx.timeout if timeout is None else timeout, case.id), \
                alpha_spent(alpha_scale), failed_tests() as failed:
            case.run(backend, ctx)
    except NotApplicable as exc:
        record.status, record.message = "skipped", f"not applicable: {exc}"
    except NotSupportedError as exc:
        record.status = "failed"
        record.message = f"backend claims {list(case.check.requires)} but raised NotSupportedError: {exc}"
        record.exception = exc
    except AssertionError as exc:
        record.status, record.message, record.exception = "failed", _message(exc), exc
    except Exception as exc:  # a backend that raises is a named error, never a crashed harness
        raised = _backend_exception(exc)
        record.status, record.exception = "error", exc
        record.error_type = type(raised).__name__
        record.error_source = "backend" if isinstance(exc, BackendError) else "check"
        record.error = f"{record.error_type}: {raised}"
        where = f" (in {exc})" if raised is not exc else " (raised inside the check, not by a backend call)"
        record.message = record.error + where
        record.traceback = "".join(traceback.format_exception(type(raised), raised, raised.__traceback__))
    record.seconds = time.perf_counter() - start
    if record.status == "failed":  # the failed tests the check raised on without recording them
        ctx.results += [r for r in failed if not any(r is x for x in ctx.results)]
    record.statistics = [r.as_record() for r in ctx.results]
    record.findings = list(ctx.findings)
    if case.check.statistical and (record.status == "passed" or (record.status == "failed" and record.statistics)):
        record.power, why = judge_power(record.statistics)
        if record.status == "passed" and record.power == "inconclusive":
            record.status, record.message = "inconclusive", why
    return record


def run_checks(
    backend, ctx: CheckContext | None = None, names: Iterable[str] | None = None, timeout: float | None = None
) -> list[CheckRecord]:
    """Run every registered check (or the checks ``names``) on ``backend``: one record per case."""
    ctx = ctx or CheckContext()
    return [run_case(case, backend, ctx, timeout=timeout) for case in all_cases(names)]


#: The check modules, by name: :func:`load_check_modules` imports them and they register themselves with
#: :func:`check`. The registry never imports them by module (they import it), so there is no import circle;
#: a new check module is added here (in this order, the order checks have always registered in).
CHECK_MODULES = (
    "batch_checks", "batch_efficiency_checks", "cache_checks", "contract_checks", "decoder_checks", "tree_checks", "tree_decoder_checks",
    "verifier_checks", "verifier_output_checks", "proposer_checks", "tree_proposer_checks", "proposer_batch_checks",
)


def load_check_modules() -> None:
    """Import the check modules of :data:`CHECK_MODULES` (they register on import); idempotent."""
    import importlib

    for name in CHECK_MODULES:
        importlib.import_module(f"{__package__}.{name}")
