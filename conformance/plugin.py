"""pytest plugin of the conformance suite (registered through the ``pytest11`` entry point).

Options: ``--specdec-backend=module:factory`` (or ``SPECDEC_BACKEND``) picks the
backend under test, resolved once per session; ``--specdec-seed`` the base seed.
Hypothesis's ``--hypothesis-profile`` picks ``ci`` (default), ``dev`` or ``thorough``.
At the end the plugin prints the verdict and the family-wise false-alarm bound.
"""
from __future__ import annotations

import importlib
import os
import shlex

import pytest

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


def backend_spec(config) -> str:
    return config.getoption("specdec_backend") or os.environ.get(ENV_BACKEND) or DEFAULT_BACKEND


def load_backend(spec: str):
    """Import ``module:factory`` and call the factory; errors name the spec and what is wrong."""
    from specdec_ref.contract import Capabilities

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
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
    config._specdec = {"passed": 0, "failed": [], "skipped": 0, "stat_tests": 0, "min_power": {}, "alpha": None}
    config._specdec_profile = profiles.current_profile_name()


def pytest_collection_modifyitems(config, items):
    from specdec_ref.contract import CAPABILITY_FLAGS

    for item in items:
        for mark in item.iter_markers("requires"):
            unknown = [flag for flag in mark.args if flag not in CAPABILITY_FLAGS]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid}: unknown capability {unknown}; known: {list(CAPABILITY_FLAGS)}")


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


def case_params(capability: str) -> list:
    """pytest params for every registered check case needing ``capability``, with id, xdist group and requires marks."""
    from .registry import all_cases

    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xdist_group(c.group), pytest.mark.requires(*c.check.requires)])
        for c in all_cases()
        if capability in c.check.requires
    ]


def run_case_in_pytest(request, case, backend, ctx) -> None:
    """Skip on unclaimed capabilities, run the check, attach its statistics to the report."""
    __tracebackhide__ = True
    from .registry import missing_capabilities

    missing = missing_capabilities(case, backend)
    if missing:
        pytest.skip(f"backend {backend.name!r} does not claim capability {', '.join(missing)}")
    ctx.results = []
    try:
        case.run(backend, ctx)
    finally:
        stats = [r.as_record() for r in ctx.results]
        request.node.user_properties.append(("specdec_statistics", stats))
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
        if report.passed:
            state["passed"] += 1
        elif report.failed:
            state["failed"].append(report.nodeid)
        for record in props.get("specdec_statistics", []):
            state["stat_tests"] += 1
            state["alpha"] = max(state["alpha"] or 0.0, record["alpha"])
            tv = round(record["tv"], 4)
            state["min_power"][tv] = min(state["min_power"].get(tv, 1.0), record["power"])
    elif report.skipped and report.when in ("setup", "call") and "conformance" in report.nodeid:
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
            f"({state['skipped']} skipped for unclaimed capabilities)",
            green=True,
            bold=True,
        )
