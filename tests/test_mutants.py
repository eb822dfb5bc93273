"""Every known-buggy backend (verifier, decoder and cache mutants: one registry) is rejected by the checks
that guard its bug class; the reference by none."""
import os
import subprocess
import sys

import pytest

from conformance.registry import CheckContext, all_cases, run_case
from conformance.backends import load_backend
from conformance.replay import load_replay
from specdec_fixtures.mutants import MUTANTS as ALL_MUTANTS
from specdec_fixtures.mutants import batch, cache, decoder, proposer, sglang, tree, tree_decoder, verifier
from specdec_fixtures.mutants.replays import FIXTURE_DIR
from specdec_ref.backend import reference_backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def test_registry_names_are_unique_and_every_kind_is_scored():
    modules = {"verifier": verifier, "decoder": decoder, "cache": cache, "tree": tree, "sglang": sglang, "tree_decoder": tree_decoder,
               "batch": batch, "proposer": proposer}
    assert sum(len(m.MUTANTS) for m in modules.values()) == len(ALL_MUTANTS)
    for kind, module in modules.items():
        assert module.MUTANTS and all(ALL_MUTANTS[n] is m and m.kind == kind for n, m in module.MUTANTS.items()), kind
    assert set(cache.CACHE_CLASSES) == set(cache.MUTANTS)
    assert all(name.startswith("cache_") for name in cache.MUTANTS)


@pytest.mark.parametrize("name", list(ALL_MUTANTS))
def test_mutant_spec_loads_a_backend_of_that_name(name):
    mutant = ALL_MUTANTS[name]
    assert mutant.spec == f"specdec_fixtures.mutants.{mutant.kind}:{name}"
    backend = load_backend(mutant.spec)  # runs specdec_ref.contract.check_backend
    assert backend.name == f"mutant.{name}"


@pytest.mark.parametrize("name", list(ALL_MUTANTS))
def test_mutant_is_killed_by_its_check(name):
    """Each check in ``must_fail`` fails on the mutant: deterministic checks at the ci profile, statistical ones at
    the mutant's ``kill_profile``: ``ci`` as a certification runs them, rejected at one of its looks before the full
    sample (the interim look on a twentieth, or an early-pass look); ``dev``, a tenth of the ci sample at the same
    alpha, for the few bugs those looks do not reject sooner."""
    mutant = ALL_MUTANTS[name]
    backend = mutant.backend()
    recorded = load_replay(os.path.join(FIXTURE_DIR, f"{name}.json")).case_id  # a case of must_fail[0] that kills it
    for check in mutant.must_fail:
        outcomes = []
        cases = all_cases([check])
        if check == mutant.must_fail[0]:  # try the recorded case first (cases are seeded per case: order-free)
            cases.sort(key=lambda case: case.case_id != recorded)
        for case in cases:  # a check fails when any of its cases fails: stop at the first
            profile = mutant.kill_profile if case.check.statistical else "ci"
            record = run_case(case, backend, CheckContext(profile=profile))
            assert record.status != "error" or record.error_source == "backend", (
                f"the check itself raised instead of judging mutant {name}: {record.message}"
            )
            outcomes.append(record.status)
            if record.rejects:  # failed, or the mutant's bug made it raise (an error from a backend call)
                assert not (case.check.statistical and profile == "ci") or record.look == "interim", (
                    f"mutant {name}: {check} rejects it only at the full ci sample; give it kill_profile='dev'")
                break
        assert outcomes[-1] in ("failed", "error"), f"mutant {name} ({mutant.bug}) survived {check} ({len(outcomes)} cases passed)"


def test_kill_profiles_are_known_and_dev_only_where_the_looks_do_not_reject_sooner():
    assert {m.kill_profile for m in ALL_MUTANTS.values()} <= {"dev", "ci"}
    assert sorted(n for n, m in ALL_MUTANTS.items() if m.kill_profile == "dev") == [
        "draft_unfiltered", "penalty_counts_not_rolled_back", "samples_from_bf16_logits"]


def test_every_registered_mutant_names_registered_checks():
    names = {case.check.name for case in all_cases()}
    for mutant in ALL_MUTANTS.values():
        assert set(mutant.must_fail) <= names, mutant.name
        assert mutant.bug, f"mutant {mutant.name} must document its bug class"


#: Checks whose bug class is exercised by a non-mutant test instead (named here, with the test).
KILLED_ELSEWHERE = {
    "decoder_rejects_bad_input": "tests/test_decode.py::test_decoder_check_fails_on_a_backend_accepting_bad_input",
}


def test_every_check_kills_some_mutant():
    """A check that no mutant fails is a check that cannot be shown to fail."""
    checks = {case.check.name for case in all_cases()}
    killed = {check for m in ALL_MUTANTS.values() for check in m.must_fail} | set(KILLED_ELSEWHERE)
    assert checks - killed == set(), f"checks with no mutant: {sorted(checks - killed)}"


def test_reference_passes_the_deterministic_checks_as_records():
    """run_checks() without pytest: one record per case, the reference passes."""
    backend = reference_backend()
    cases = [c for c in all_cases() if not c.check.statistical and "verifier" in c.check.requires]
    records = [run_case(c, backend, CheckContext()) for c in cases]
    assert records and all(r.status == "passed" for r in records), [(r.id, r.message[:300]) for r in records if r.status != "passed"]


def test_command_line_names_the_failed_check():
    """`pytest conformance/ --specdec-backend=<mutant>` exits non-zero, prints NOT CERTIFIED and the check."""
    cmd = [
        sys.executable, "-m", "pytest", "conformance/test_verifier.py", "-q", "-p", "no:randomly",
        "--specdec-backend=specdec_fixtures.mutants.verifier:accept_after_rejection", "-k", "accepted_length_law and balanced",
        "--hypothesis-profile=dev",  # a tenth of the ci sample still rejects this mutant; the CLI path is what is tested
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTEST_XDIST_WORKER": ""})
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "NOT CERTIFIED" in out.stdout and "sampling_accepted_length_law" in out.stdout
    assert "accepted length m vs its exact law" in out.stdout
