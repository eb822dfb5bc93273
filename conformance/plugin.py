"""pytest plugin of the conformance suite (registered through the ``pytest11`` entry point).

A thin adapter over :func:`conformance.registry.run_case`: every conformance test item runs
its check case through that core (profile, seed, time limit, outcome), attaches the record to
the report, and turns the outcome into pytest's (skip, pass, fail). The controller collects the
records and builds the certificate with :func:`conformance.report.build_certificate`; the
terminal verdict is printed from that certificate, so the terminal, the JSON and the Markdown
always say the same.

Options: ``--specdec-backend`` (``module:factory``, a registered name, or ``$SPECDEC_BACKEND``;
see :mod:`conformance.backends`), ``--specdec-seed``, ``--specdec-report=PATH`` (JSON
certificate plus a Markdown summary next to it; under xdist only the controller writes it),
``--specdec-xfails=FILE`` (exact check or case ids, see :mod:`conformance.xfails`),
``--specdec-timeout``, ``--specdec-replay=PATH`` (only the check case saved in a replay file,
with its seed and profile), ``--specdec-device=cpu|cuda`` (where the verifier and tree-verifier
checks put the tensors and generators they hand to the backend; ``cuda`` needs
``torch.cuda.is_available()``, and checks of a backend not claiming ``device:cuda`` are skipped).
Hypothesis's ``--hypothesis-profile`` picks ``ci`` (default), ``dev`` or ``thorough``
(:mod:`conformance.profiles`).
"""
from __future__ import annotations

import dataclasses
import os
import shlex

import pytest

# Register the suite's Hypothesis profiles at import, before Hypothesis's own plugin reads --hypothesis-profile.
from . import profiles as _profiles  # noqa: F401
from .backends import DEFAULT_BACKEND, ENV_BACKEND, BackendLoadError, load_backend, resolve_spec

#: Values of --specdec-device.
DEVICES = ("cpu", "cuda")
#: Check families whose backend calls honour --specdec-device (:attr:`conformance.registry.Check.family`).
DEVICE_FAMILIES = ("verifier", "tree")


def pytest_addoption(parser):
    group = parser.getgroup("specdec", "speculative-decoding conformance")
    group.addoption(
        "--specdec-backend",
        default=None,
        metavar="MODULE:FACTORY",
        help=f"backend under test: a factory returning the backend object, or a registered name "
        f"(default ${ENV_BACKEND} or {DEFAULT_BACKEND})",
    )
    group.addoption("--specdec-seed", type=int, default=None, help=f"base seed of every check (default {_profiles.DEFAULT_SEED})")
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
        help="known failures: one '<check id>[-<case id>] <reason...>' per line (exact ids); listed cases are xfail(strict=True)",
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
    group.addoption(
        "--specdec-device",
        choices=DEVICES,
        default="cpu",
        help="device of the tensors and generators the verifier and tree-verifier checks hand to verify() / verify_tree() "
        "(default cpu; the other checks run on the CPU). cuda needs torch.cuda.is_available(); checks of a backend that "
        "does not claim device:cuda are skipped with that reason",
    )


def backend_spec(config) -> str:
    return resolve_spec(config.getoption("specdec_backend"))


def base_seed(config) -> int:
    seed = config.getoption("specdec_seed")
    return _profiles.DEFAULT_SEED if seed is None else seed


@pytest.hookimpl(trylast=True)  # after Hypothesis's own plugin has loaded --hypothesis-profile (the profile read below)
def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*capabilities): backend capabilities the check needs")
    config.addinivalue_line("markers", "xdist_group(name): checks sharing a sample run on one xdist worker")
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        settings.load_profile(_profiles.DEFAULT_PROFILE)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one torch thread per xdist worker: oversubscribed OpenMP threads spin and run several times slower
        import torch

        torch.set_num_threads(1)
    config._specdec_profile = _profiles.current_profile_name()
    config._specdec_device = load_device_option(config)
    config._specdec_replay = load_replay_option(config)
    config._specdec_xfails = load_xfails(config)
    if config.getoption("maxfail", 0) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(StopAcrossWorkers(config), "specdec-stop-across-workers")
    if not hasattr(config, "workerinput"):  # the xdist controller (or a serial run) decides the verdict
        report_path = config.getoption("specdec_report", None)
        path = os.path.join(str(config.invocation_params.dir), report_path) if report_path else None
        config.pluginmanager.register(CertificateCollector(config, path), "specdec-certificate")


def load_device_option(config) -> str:
    """Parse --specdec-device: ``cpu`` or ``cuda``; ``cuda`` without a usable CUDA device is a UsageError."""
    device = config.getoption("specdec_device", None) or "cpu"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                "--specdec-device=cuda: torch.cuda.is_available() is False (no CUDA device visible, or a CPU-only torch "
                f"build: torch {torch.__version__}); run on a CUDA machine or use --specdec-device=cpu"
            )
    return device


def device_case(case, device: str):
    """``case`` as it runs on ``device``: a verifier or tree check on a device other than the CPU also requires
    ``device:<device>``, so :func:`conformance.registry.run_case` skips it with its usual reason ("backend ... does
    not claim capability device:cuda") when the backend does not claim the device. The one place the device
    requirement is added; other cases (and every case on the CPU) are returned unchanged."""
    flag = f"device:{device}"
    if device == "cpu" or case.check.family not in DEVICE_FAMILIES or flag in case.check.requires:
        return case
    return dataclasses.replace(case, check=dataclasses.replace(case.check, requires=(*case.check.requires, flag)))


def load_xfails(config) -> list[tuple[str, str]]:
    """Parse --specdec-xfails: a missing file, a line without a reason or (ci/thorough) an unknown id is a UsageError."""
    path = config.getoption("specdec_xfails", None)
    if not path:
        return []  # without importing the xfails module (its registry imports torch: seconds in the xdist controller)
    from .xfails import XfailsError, parse_xfails, unknown_ids

    path = os.path.join(str(config.invocation_params.dir), path)
    try:
        with open(path, encoding="utf-8") as fh:
            entries = parse_xfails(fh.read(), source=path)
    except OSError as exc:
        raise pytest.UsageError(f"--specdec-xfails: cannot read {path!r}: {exc}") from exc
    except XfailsError as exc:
        raise pytest.UsageError(f"--specdec-xfails: {exc}") from exc
    unknown = unknown_ids(entries)
    if unknown:
        message = (
            f"--specdec-xfails: {len(unknown)} id(s) name no registered check or case: {', '.join(unknown)} "
            "(a line names a check id exactly, or '<check id>-<case id>'; see conformance.xfails)"
        )
        if config._specdec_profile == "dev":
            if getattr(config, "workerinput", {}).get("workerid") in (None, "gw0"):  # warn once
                config.issue_config_time_warning(pytest.PytestWarning(message), stacklevel=2)
        else:
            raise pytest.UsageError(message + f"; an error under the {config._specdec_profile!r} profile, a warning under 'dev'")
    return entries


def load_replay_option(config):
    """Parse --specdec-replay: the Replay, or None; a bad file is a UsageError. The file's seed and profile win."""
    path = config.getoption("specdec_replay", None)
    if not path:
        return None  # without importing the replay module (its registry imports torch: seconds in the xdist controller)
    from .replay import load_replay

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

    from .xfails import reason_for

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
            requires = device_case(case, getattr(config, "_specdec_device", "cpu")).check.requires
            item.user_properties.append(("specdec_requires", list(requires)))
            reason = reason_for(config._specdec_xfails, case)
            if reason is not None:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    _statistical_first(items)
    if getattr(config, "_specdec_replay", None) is not None:  # --specdec-replay: only the replay item runs
        keep = [item for item in items if str(item.path) == _REPLAY_TEST]
        if not keep:
            raise pytest.UsageError("--specdec-replay needs the conformance suite collected: pytest conformance/ --specdec-replay=...")
        config.hook.pytest_deselected(items=[item for item in items if str(item.path) != _REPLAY_TEST])
        items[:] = keep


class StopAcrossWorkers:
    """``-x`` / ``--maxfail`` under xdist: once a worker reaches the limit, the other workers skip the conformance
    cases they were already sent (xdist lets every worker finish its queue, an eighth of the suite each, before the
    session stops). The controller hands every worker one flag file; the worker that stops creates it."""

    def __init__(self, config):
        import tempfile

        self.config = config
        self.failed = 0
        workerinput = getattr(config, "workerinput", None)
        if workerinput is None:  # the controller
            self.flag = os.path.join(tempfile.mkdtemp(prefix="specdec-stop-"), "stopped")
        else:
            self.flag = workerinput.get("specdec_stop_flag")

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        node.workerinput["specdec_stop_flag"] = self.flag

    def pytest_unconfigure(self, config):
        if not hasattr(config, "workerinput") and self.flag:  # the controller made the folder: remove it
            import shutil

            shutil.rmtree(os.path.dirname(self.flag), ignore_errors=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if self.flag and item_case(item) is not None and os.path.exists(self.flag):
            pytest.skip("not run: another xdist worker stopped the session at its failure limit (-x / --maxfail)")

    def pytest_runtest_logreport(self, report):
        if report.failed and self.flag and hasattr(self.config, "workerinput"):
            self.failed += 1
            if self.failed >= self.config.getoption("maxfail"):
                open(self.flag, "w").close()


#: Typical seconds of the costliest cases (the reference backend under ``-n 2``), by case id pattern, first match;
#: unlisted cases count 0. Only the order of the run depends on them: the costliest cases go first, statistical or
#: not, so the xdist workers end together on short cases (xdist hands a worker its next case while it still runs two,
#: so costly cases sent late pile up on one worker; what the order saves: docs/benchmarks.md). The checks' own
#: workload (samples, decodes) makes the same cases the costly ones for any backend.
COST_HINTS: tuple[tuple[str, float], ...] = (
    ("tree_proposer_sequence_law-*", 2.5),
    ("batch_sequence_law-penalties", 9.0),
    ("batch_sequence_law-min_new_tokens", 7.0),
    ("tree_decoder_greedy_equals_ar_fp32-*", 5.0),
    ("batch_sequence_law-constraint", 4.0),
    ("decoder_acceptance_under_filters-cold", 4.0),
    ("tree_sampling_batch_invariance-*", 3.0),
    ("decoder_acceptance_under_filters-*", 3.0),
    ("sampling_exact_on_generated_distributions", 3.0),
    ("sampling_batch_invariance-*", 3.0),
    ("tree_decoder_greedy_bf16_divergences_are_flips-*", 2.7),
    ("decoder_sequence_law-position_limit", 2.5),
    ("batch_sequence_law-*", 2.2),
    ("sampling_sequence_law_over_rounds", 2.2),
    ("batch_position_limit_law", 2.0),
    ("*acceptance_is_ideal", 2.0),
    ("tree_decoder_sequence_law-*", 2.0),
    ("tree_decoder_acceptance_under_filters-*", 1.7),
    ("decoder_eos_anywhere_in_block", 1.8),
    ("decoder_greedy_bf16_divergences_are_flips-*", 1.7),
    ("decoder_sequence_law-*", 1.5),
    ("decoder_greedy_equals_ar_fp32-*", 1.4),
    ("tree_sampling_*", 1.3),
    ("tree_decoder_cache_matches_prefill_every_round-*", 1.2),
)


def cost_hint(case) -> float:
    """The case's typical seconds from :data:`COST_HINTS` (0 when unlisted)."""
    from fnmatch import fnmatchcase

    return next((cost for pattern, cost in COST_HINTS if fnmatchcase(case.id, pattern)), 0.0)


def _statistical_first(items) -> None:
    """The conformance cases in place, costliest first (:data:`COST_HINTS`), then the other statistical ones, then the
    other deterministic ones (stable; other items keep their places).

    A statistical case looks at 5% of its sample first, so a broken backend is rejected in seconds by nearly any of
    them, while a deterministic case runs in full; under ``-x`` a worker that fails stops the others
    (:class:`StopAcrossWorkers`), so the first cases should be ones that stop a broken backend soon: the costliest cases
    are mostly statistical, and the costly deterministic ones (greedy equality with AR) fail at their first wrong
    decode. A correct backend runs its longest cases first and the short ones fill the end of the run. (``--dist
    loadgroup`` sends the groups of several cases, the verifier's shared samples, before the single cases.)"""
    slots = [i for i, item in enumerate(items) if item_case(item) is not None]
    cases = [items[i] for i in slots]
    ordered = sorted(cases, key=lambda item: (-cost_hint(item_case(item)), not item_case(item).check.statistical))
    for i, item in zip(slots, ordered):
        items[i] = item


@pytest.fixture(scope="session")
def specdec_backend(pytestconfig):
    """The backend under test, resolved once per session from --specdec-backend."""
    try:
        return load_backend(backend_spec(pytestconfig))
    except BackendLoadError as exc:
        raise pytest.UsageError(f"--specdec-backend: {exc}") from None


@pytest.fixture
def specdec_ctx(request, pytestconfig):
    from .registry import CheckContext

    seed = base_seed(pytestconfig)
    replay = (
        f"pytest {shlex.quote(request.node.nodeid)} --specdec-backend={backend_spec(pytestconfig)} "
        f"--specdec-seed={seed} --hypothesis-profile={pytestconfig._specdec_profile}"
    )
    device = pytestconfig._specdec_device
    if device != "cpu":
        replay += f" --specdec-device={device}"
    timeout = pytestconfig.getoption("specdec_timeout", None)
    ctx = CheckContext(seed=seed, profile=pytestconfig._specdec_profile, replay=replay, device=device)
    if timeout is not None:
        ctx.timeout = timeout
    return ctx


def case_params(family: str) -> list:
    """pytest params for every registered check case of ``family`` (verifier, decoder, cache, contract),
    with id, xdist group and requires marks."""
    from .registry import all_cases

    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xdist_group(c.group), pytest.mark.requires(*c.check.requires)])
        for c in all_cases()
        if c.check.family == family
    ]


def raise_outcome(record) -> None:
    """Turn a record into pytest's outcome: skip, return (pass), or raise with the check's message."""
    __tracebackhide__ = True
    if record.status == "skipped":
        pytest.skip(record.message)
    if record.status == "failed":
        if isinstance(record.exception, AssertionError):
            raise record.exception  # the check's own assertion, with its traceback
        raise AssertionError(record.message) from record.exception
    if record.status == "error":
        who = "the backend raised" if record.error_source == "backend" else "the check itself raised"
        pytest.fail(
            f"{record.id}: {who} {record.message}\n(errors are grouped in the specdec verdict, "
            "which shows the first traceback once)",
            pytrace=False,
        )
    if record.status == "inconclusive":
        pytest.fail(f"{record.id}: {record.message}", pytrace=False)


def run_case_in_pytest(request, case, backend, ctx) -> None:
    """Run the case through the core, attach its record to the report, and raise its outcome."""
    __tracebackhide__ = True
    from .registry import run_case

    from .report import backend_info

    record = run_case(device_case(case, ctx.device), backend, ctx)
    request.node.user_properties.append(("specdec_record", record.as_entry()))
    if not any(key == "specdec_backend" for key, _ in request.node.user_properties):
        request.node.user_properties.append(("specdec_backend", backend_info(backend)))
    raise_outcome(record)


def pytest_report_header(config):
    profile = f"specdec profile: {config._specdec_profile}, base seed: {base_seed(config)}"
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # the xdist controller runs no check: loading the backend here (torch, transformers: seconds of CPU while the
        # workers start) would only print what the workers load and the verdict names
        return [f"specdec backend: {backend_spec(config)} (loaded by the xdist workers; the verdict names it)", profile]
    try:
        backend = load_backend(backend_spec(config))
    except BackendLoadError as exc:
        return [f"specdec backend: {exc}"]
    return [
        f"specdec backend: {backend.name} {getattr(backend, 'version', '?')} ({backend_spec(config)})",
        f"specdec capabilities: {backend.capabilities.as_dict()}",
        profile,
    ] + ([f"specdec device: {config._specdec_device} (verifier and tree checks)"] if config._specdec_device != "cpu" else [])


class CertificateCollector:
    """Controller-side plugin: one entry per conformance item from its phase reports; the certificate
    (and so the verdict) is built once at session end, printed, and written with --specdec-report."""

    def __init__(self, config, path: str | None):
        self.config = config
        self.path = path
        self.entries: dict[str, dict] = {}
        self.backend: dict | None = None  # name, version, capabilities, as the process that ran the checks saw it
        self.cert: dict | None = None
        self.written: str | None = None
        self.error: str | None = None

    def pytest_runtest_logreport(self, report):
        from . import report as rep

        props = dict(report.user_properties)
        if "specdec_check" not in props:
            return  # not a conformance item
        self.backend = self.backend or props.get("specdec_backend")
        entry = self.entries.setdefault(report.nodeid, rep.new_entry(report.nodeid, props["specdec_check"]))
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

        if not self.entries:
            return
        spec = backend_spec(self.config)
        backend, backend_error = self.backend, None
        if backend is None:  # no check ran it (e.g. all skipped or the fixture failed): load it here to say why
            try:
                backend = rep.backend_info(load_backend(spec))
            except BackendLoadError as exc:
                backend_error = str(exc)
        self.cert = rep.build_certificate(
            self.entries.values(),
            suite_version=specdec_ref.__version__,
            backend_spec=spec,
            backend=backend,
            profile=self.config._specdec_profile,
            seed=base_seed(self.config),
            exitstatus=int(exitstatus),
            xfails=self.config._specdec_xfails,
            backend_error=backend_error,
        )
        if self.path:
            try:
                self.written = rep.write_certificate(self.path, self.cert)
            except OSError as exc:
                self.error = f"cannot write specdec certificate {self.path!r}: {exc}"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        from . import report as rep

        if self.cert is None:
            return
        tr = terminalreporter
        tr.section("specdec verdict")
        level = self.cert["verdict"]["level"]
        for i, line in enumerate(rep.verdict_lines(self.cert)):
            markup = {"bold": i == 1, "green": level == rep.CERTIFIED, "yellow": level == rep.REDUCED,
                      "red": level == rep.NOT_CERTIFIED} if i >= 1 else {}
            tr.write_line(line, **markup)
        if self.written:
            tr.write_line(f"specdec certificate ({self.cert['verdict']['headline']}): {self.path} (summary: {self.written})")
        elif self.error:
            tr.write_line(self.error, red=True)
