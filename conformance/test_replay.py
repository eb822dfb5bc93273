"""The one check case of ``--specdec-replay=PATH`` (collected only with that option; see conformance.replay)."""
import pytest

from conformance.plugin import backend_spec, run_case_in_pytest


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    replay = getattr(metafunc.config, "_specdec_replay", None)
    if replay is None:  # collected explicitly without the option
        metafunc.parametrize("case", [pytest.param(None, id="no-replay", marks=pytest.mark.skip(reason="no --specdec-replay"))])
        return
    case = replay.case
    metafunc.parametrize(
        "case",
        [pytest.param(case, id=f"{replay.name}-{case.id}", marks=[pytest.mark.requires(*case.check.requires)])],
    )


def test_replay(case, request, specdec_backend, pytestconfig):
    replay = pytestconfig._specdec_replay
    command = (
        f"pytest conformance/ --specdec-replay={pytestconfig.getoption('specdec_replay')} "
        f"--specdec-backend={backend_spec(pytestconfig)}"
    )
    ctx = replay.context(command)
    timeout = pytestconfig.getoption("specdec_timeout", None)
    if timeout is not None:
        ctx.timeout = timeout
    run_case_in_pytest(request, case, specdec_backend, ctx)
