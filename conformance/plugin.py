"""pytest plugin of the conformance suite (registered through the ``pytest11`` entry point).

Options: ``--specdec-backend=module:factory`` (or ``SPECDEC_BACKEND``) picks the
backend under test, resolved once per session; ``--specdec-seed`` the base seed.
Hypothesis's ``--hypothesis-profile`` picks ``ci`` (default), ``dev`` or ``thorough``.
At the end the plugin prints the verdict and the family-wise false-alarm bound.

``--specdec-report=PATH`` writes a JSON certificate (and ``PATH`` with an ``.md``
suffix, a Markdown summary) at session end; see :mod:`conformance.report` for
what ``certified`` means. Under xdist only the controller writes it, from the
reports the workers send. ``--specdec-xfails=FILE`` lists known failures, one
``<test-id prefix> <reason...>`` per line: matching items (by nodeid or check
id) are marked ``xfail(strict=True)``; prefixes matching nothing warn. ``--specdec-replay=PATH`` runs only the check
case saved in a replay file (:mod:`conformance.replay`), with its seed and profile.
"""
from __future__ import annotations

import importlib
import os
import shlex
import warnings

import pytest

# Register the suite's Hypothesis profiles at import, before Hypothesis's own plugin reads --hypothesis-profile.
from properties import profiles as _profiles  # noqa: E402,F401

DEFAULT_BACKEND = "specdec_ref.backend:reference_backend"
ENV_BACKEND = "SPECDEC_BACKEND"


def pytest_addoption(parser):
    group = parser.getgroup("specdec", "speculative-decoding conformance")
    group.addoption(
        "--specdec-backend",
        default=None,
        metavar="MODULE:FACTORY",
        help=f"backend under test: a factory returning the backend object (default ${ENV_BACKEND} or {DEFAULT_BACKEND})",
    )
    group.addoption("--specdec-seed", type=int, default=None, help="base seed of every check (default 20261129)")
    group.addoption(
        "--specdec-report",
        default=None,
        metavar="PATH",
        help="write a JSON conformance certificate to PATH and a Markdown summary next to it (PATH with .md suffix)",
    )
    group.addoption(
        "--specdec-xfails",
        default=None,
        metavar="FILE",
        help="known failures: one '<test-id prefix> <reason...>' per line; matching items are xfail(strict=True)",
    )
    group.addoption(
        "--specdec-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per-check time limit (default 300; 0 disables): a check whose backend does not return fails with "
        "BackendTimeout. SIGALRM-based, main thread only; a backend stuck inside one long C call is interrupted "
        "only when it returns to Python (see conformance.watchdog)",
    )
    group.addoption(
        "--specdec-replay",
        default=None,
        metavar="PATH",
        help="run only the check case saved in the replay file PATH (fixtures/replays/NAME.json, see "
        "conformance.replay), with the file's seed and profile",
    )


def backend_spec(config) -> str:
    return config.getoption("specdec_backend") or os.environ.get(ENV_BACKEND) or DEFAULT_BACKEND


#: Entry-point group under which packages register backend factories by name (``--specdec-backend=NAME``).
ENTRY_POINT_GROUP = "specdec_ref.backends"


def registered_backends() -> dict:
    """Backend factories registered by installed packages under :data:`ENTRY_POINT_GROUP`."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_backend(spec: str):
    """Resolve ``module:factory`` (or a registered backend name) and call the factory; errors name the spec."""
    from specdec_ref.contract import Capabilities

    module_name, sep, attr = spec.partition(":")
    if not sep:
        registered = registered_backends()
        if spec not in registered:
            raise pytest.UsageError(
                f"--specdec-backend {spec!r} is neither 'package.module:factory' nor a registered backend name; "
                f"registered ({ENTRY_POINT_GROUP}): {', '.join(sorted(registered)) or 'none'}"
            )
        module_name, _, attr = registered[spec].value.partition(":")
    if not module_name or not attr:
        raise pytest.UsageError(f"--specdec-backend must look like 'package.module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise pytest.UsageError(f"--specdec-backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise pytest.UsageError(f"--specdec-backend {spec!r}: module {module_name!r} has no attribute {attr!r}")
    backend = factory() if callable(factory) and not hasattr(factory, "capabilities") else factory
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise pytest.UsageError(
            f"backend from {spec!r} must declare `capabilities` as specdec_ref.contract.Capabilities, got {type(caps).__name__}"
        )
    return backend


def pytest_configure(config):
    from properties import profiles

    config.addinivalue_line("markers", "requires(*capabilities): backend capabilities the check needs")
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        settings.load_profile("ci")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one torch thread per xdist worker: oversubscribed OpenMP threads spin and run several times slower
        import torch

        torch.set_num_threads(1)
    config._specdec = {
        "passed": 0, "failed": [], "skipped": 0, "xfailed": 0, "stat_tests": 0, "min_power": {}, "alpha": None,
    }
    config._specdec_profile = profiles.current_profile_name()
    config._specdec_xfails = load_xfails(config)
    config._specdec_replay = load_replay_option(config)
    report_path = config.getoption("specdec_report", None)
    if report_path and not hasattr(config, "workerinput"):  # only the xdist controller (or a serial run) writes
        path = os.path.join(str(config.invocation_params.dir), report_path)
        config.pluginmanager.register(CertificateCollector(config, path), "specdec-certificate")


def load_xfails(config) -> list[tuple[str, str]]:
    """Parse --specdec-xfails; a missing file or a line without a reason is a UsageError."""
    from .report import parse_xfails

    path = config.getoption("specdec_xfails", None)
    if not path:
        return []
    path = os.path.join(str(config.invocation_params.dir), path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise pytest.UsageError(f"--specdec-xfails: cannot read {path!r}: {exc}") from exc
    try:
        return parse_xfails(text, source=path)
    except ValueError as exc:
        raise pytest.UsageError(f"--specdec-xfails: {exc}") from exc


def load_replay_option(config):
    """Parse --specdec-replay: the Replay, or None; a bad file is a UsageError. The file's seed and profile win."""
    from .replay import load_replay

    path = config.getoption("specdec_replay", None)
    if not path:
        return None
    try:
        replay = load_replay(os.path.join(str(config.invocation_params.dir), path))
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"--specdec-replay: {exc}") from exc
    seed = config.getoption("specdec_seed")
    if seed is not None and seed != replay.seed:
        raise pytest.UsageError(f"--specdec-seed={seed} conflicts with the replay's seed {replay.seed}: drop one")
    config.option.specdec_seed = replay.seed
    config._specdec_profile = replay.profile
    return replay


_REPLAY_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_replay.py")


def pytest_ignore_collect(collection_path, config):
    """conformance/test_replay.py exists only for --specdec-replay."""
    if str(collection_path) == _REPLAY_TEST and not config.getoption("specdec_replay", None):
        return True
    return None


def item_case(item):
    """The CheckCase a conformance item runs, or None for other tests."""
    from .registry import CheckCase

    case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
    return case if isinstance(case, CheckCase) else None


def pytest_collection_modifyitems(config, items):
    from specdec_ref.contract import check_requirement

    for item in items:
        for mark in item.iter_markers("requires"):
            for flag in mark.args:
                try:
                    check_requirement(flag)
                except ValueError as exc:
                    raise pytest.UsageError(f"{item.nodeid}: {exc}") from None
        case = item_case(item)
        if case is not None:
            # item-level properties travel with every phase's report (also to the xdist controller)
            item.user_properties.append(("specdec_check", case.id))
            item.user_properties.append(("specdec_requires", list(case.check.requires)))
    if getattr(config, "_specdec_replay", None) is not None:  # --specdec-replay: only the replay item runs
        keep = [item for item in items if str(item.path) == _REPLAY_TEST]
        if not keep:
            raise pytest.UsageError("--specdec-replay needs the conformance suite collected: pytest conformance/ --specdec-replay=...")
        config.hook.pytest_deselected(items=[item for item in items if str(item.path) != _REPLAY_TEST])
        items[:] = keep
    apply_xfails(config, items)


def apply_xfails(config, items) -> None:
    xfails = getattr(config, "_specdec_xfails", [])
    if not xfails:
        return
    matched = set()
    for item in items:
        case = item_case(item)
        ids = (item.nodeid,) + ((case.id,) if case is not None else ())
        for prefix, reason in xfails:
            if any(i.startswith(prefix) for i in ids):
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
                matched.add(prefix)
                break  # the first matching line gives the reason
    unmatched = [prefix for prefix, _ in xfails if prefix not in matched]
    worker = getattr(config, "workerinput", {}).get("workerid")
    if unmatched and worker in (None, "gw0"):  # every xdist worker collects the same items: warn once
        warnings.warn(
            pytest.PytestWarning(
                f"--specdec-xfails: {len(unmatched)} prefix(es) match no collected test: {', '.join(unmatched)}"
            )
        )


@pytest.fixture(scope="session")
def specdec_backend(pytestconfig):
    """The backend under test, resolved once per session from --specdec-backend."""
    return load_backend(backend_spec(pytestconfig))


@pytest.fixture
def specdec_ctx(request, pytestconfig):
    from .registry import DEFAULT_SEED, CheckContext

    seed = pytestconfig.getoption("specdec_seed")
    seed = DEFAULT_SEED if seed is None else seed
    replay = (
        f"pytest {shlex.quote(request.node.nodeid)} --specdec-backend={backend_spec(pytestconfig)} "
        f"--specdec-seed={seed} --hypothesis-profile={pytestconfig._specdec_profile}"
    )
    return CheckContext(seed=seed, profile=pytestconfig._specdec_profile, replay=replay)


def case_params(family: str) -> list:
    """pytest params for every registered check case of ``family`` (verifier, decoder, cache), with id, xdist group and requires marks."""
    from .registry import all_cases

    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xdist_group(c.group), pytest.mark.requires(*c.check.requires)])
        for c in all_cases()
        if c.check.family == family
    ]


def run_case_in_pytest(request, case, backend, ctx) -> None:
    """Skip on unclaimed capabilities, run the check, attach its statistics to the report."""
    __tracebackhide__ = True
    from .registry import missing_capabilities

    missing = missing_capabilities(case, backend)
    if missing:
        pytest.skip(f"backend {backend.name!r} does not claim capability {', '.join(missing)}")
    ctx.results, ctx.findings = [], []
    from .watchdog import time_limit

    timeout = request.config.getoption("specdec_timeout", None)
    try:
        with time_limit(ctx.timeout if timeout is None else timeout, case.id):
            case.run(backend, ctx)
    finally:
        stats = [r.as_record() for r in ctx.results]
        request.node.user_properties.append(("specdec_statistics", stats))
        request.node.user_properties.append(("specdec_findings", list(ctx.findings)))
        request.node.user_properties.append(("specdec_guards", case.check.guards))


def pytest_report_header(config):
    try:
        backend = load_backend(backend_spec(config))
    except pytest.UsageError as exc:
        return [f"specdec backend: {exc}"]
    caps = {k: v for k, v in backend.capabilities.as_dict().items()}
    seed = config.getoption("specdec_seed")
    return [
        f"specdec backend: {backend.name} {getattr(backend, 'version', '?')} ({backend_spec(config)})",
        f"specdec capabilities: {caps}",
        f"specdec profile: {config._specdec_profile}, base seed: {seed if seed is not None else 20261129}",
    ]


def pytest_runtest_logreport(report):
    config = _CONFIG.get("config")
    if config is None or not hasattr(config, "_specdec"):
        return
    props = dict(report.user_properties)
    if "specdec_guards" not in props and not report.skipped:
        return
    state = config._specdec
    if report.when == "call":
        if report.skipped and hasattr(report, "wasxfail"):
            state["xfailed"] += 1
        elif report.passed:
            state["passed"] += 1
        elif report.failed:
            state["failed"].append(report.nodeid)
        elif report.skipped and "specdec_check" in props:  # capability skips happen in the call phase
            state["skipped"] += 1
        for record in props.get("specdec_statistics", []):
            state["stat_tests"] += 1
            state["alpha"] = max(state["alpha"] or 0.0, record["alpha"])
            tv = round(record["tv"], 4)
            state["min_power"][tv] = min(state["min_power"].get(tv, 1.0), record["power"])
    elif report.skipped and report.when == "setup" and ("specdec_check" in props or "conformance" in report.nodeid):
        state["skipped"] += 1


_CONFIG: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _CONFIG["config"] = session.config


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = getattr(config, "_specdec", None)
    if not state or (state["passed"] == 0 and not state["failed"]):
        return
    tr = terminalreporter
    backend = backend_spec(config)
    tr.section("specdec verdict")
    if state["stat_tests"]:
        tr.write_line(
            f"{state['stat_tests']} statistical tests at per-test alpha <= {state['alpha']:g}: "
            f"family-wise false-alarm probability <= {state['stat_tests'] * state['alpha']:.2g} (Bonferroni)"
        )
        powers = ", ".join(f"{power:.4f} against TV (or rate shift) {tv:g}" for tv, power in sorted(state["min_power"].items()))
        tr.write_line(f"smallest stated power per alternative: {powers}")
    if state["failed"]:
        tr.write_line(f"NOT CERTIFIED: {backend} failed {len(state['failed'])} conformance check(s):", red=True, bold=True)
        for nodeid in state["failed"]:
            tr.write_line(f"  FAILED {nodeid}", red=True)
    else:
        tr.write_line(
            f"CERTIFIED: {backend} passed all {state['passed']} conformance checks it claims "
            f"({state['skipped']} skipped for unclaimed capabilities"
            + (f", {state['xfailed']} listed as expected failures)" if state["xfailed"] else ")"),
            green=True,
            bold=True,
        )


class CertificateCollector:
    """Controller-side plugin: one entry per conformance item from its phase reports, written at session end."""

    def __init__(self, config, path: str):
        self.config = config
        self.path = path
        self.entries: dict[str, dict] = {}
        self.written: tuple[str, str, bool] | None = None
        self.error: str | None = None

    def pytest_runtest_logreport(self, report):
        from . import report as rep

        props = dict(report.user_properties)
        if "specdec_check" not in props:
            return  # not a conformance item
        entry = self.entries.setdefault(report.nodeid, rep.new_entry(report.nodeid))
        if report.failed:
            message = rep.failure_message(report.longrepr)
        elif report.skipped and not hasattr(report, "wasxfail"):
            message = rep.skip_message(report.longrepr)
        else:
            message = ""
        rep.merge_phase(
            entry,
            when=report.when,
            outcome=report.outcome,
            props=props,
            duration=report.duration,
            longrepr_message=message,
            wasxfail=getattr(report, "wasxfail", None),
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        import specdec_ref

        from . import report as rep
        from .registry import DEFAULT_SEED

        spec = backend_spec(self.config)
        backend_info, backend_error = None, None
        try:
            backend = load_backend(spec)
            backend_info = {
                "name": getattr(backend, "name", None),
                "version": getattr(backend, "version", None),
                "capabilities": backend.capabilities.as_dict(),
            }
        except pytest.UsageError as exc:
            backend_error = str(exc)
        seed = self.config.getoption("specdec_seed")
        cert = rep.build_certificate(
            self.entries.values(),
            suite_version=specdec_ref.__version__,
            backend_spec=spec,
            backend=backend_info,
            profile=self.config._specdec_profile,
            seed=DEFAULT_SEED if seed is None else seed,
            exitstatus=int(exitstatus),
            xfails=getattr(self.config, "_specdec_xfails", []),
            backend_error=backend_error,
        )
        try:
            md = rep.write_certificate(self.path, cert)
            self.written = (self.path, md, cert["certified"])
        except OSError as exc:
            self.error = f"cannot write specdec certificate {self.path!r}: {exc}"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        if self.written:
            path, md, certified = self.written
            terminalreporter.write_line(
                f"specdec certificate ({'certified' if certified else 'NOT certified'}): {path} (summary: {md})"
            )
        elif self.error:
            terminalreporter.write_line(self.error, red=True)
