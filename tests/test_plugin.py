"""The conformance plugin's certificate (--specdec-report) and known-failure list (--specdec-xfails).

End-to-end runs are `python -m pytest` subprocesses from the repository root on the
fast checks (structure / seeded / one-hot), each a few seconds; the report's pure
functions are tested directly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import report as rep
from specdec_properties.scenarios import STAT_SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
FAST = "structure or seeded"
MUTANT = "specdec_fixtures.mutants.verifier:bonus_missing"


def run_suite(tmp_path: Path, *args: str, name: str = "cert.json", files=("conformance/test_verifier.py",)):
    """Run conformance test files; return (process, certificate dict or None, markdown or None)."""
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-q", f"--specdec-report={out}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k not in ("SPECDEC_BACKEND", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")},
    )
    cert = json.loads(out.read_text()) if out.exists() else None
    md = out.with_suffix(".md").read_text() if out.with_suffix(".md").exists() else None
    return proc, cert, md


def statuses(cert) -> dict[str, str]:
    return {item["nodeid"]: item["status"] for item in cert["items"]}


@pytest.fixture(scope="module")
def serial_reference(tmp_path_factory):
    return run_suite(tmp_path_factory.mktemp("serial"), "-k", FAST)


# (a) the reference backend is certified; JSON and Markdown are written and complete
def assert_same_verdict(proc, cert, md):
    """The terminal, the JSON and the Markdown header say the same words (one verdict function)."""
    v = cert["verdict"]
    assert f"{v['headline']}: {v['detail']}" in proc.stdout
    assert md.splitlines()[2] == f"**{v['headline']}**: {v['detail']}"
    assert rep.statistics_line(cert) in proc.stdout and rep.statistics_line(cert) in md


def test_reference_certificate(serial_reference):
    proc, cert, md = serial_reference
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cert["certified"] is True and cert["complete"] is True
    assert cert["verdict"]["level"] == cert["verdict"]["headline"] == "CERTIFIED"
    assert cert["backend_spec"] == "specdec_ref.backend:reference_backend"
    assert cert["backend"]["name"] and "verifier" in cert["backend"]["capabilities"]
    assert cert["suite_version"] and cert["hypothesis_profile"] == "ci" and cert["seed"] == 20261129
    assert cert["totals"] == {
        "passed": 3, "failed": 0, "error": 0, "inconclusive": 0, "skipped": 0, "xfailed": 0, "total": 3,
    }
    ids = {item["check_id"] for item in cert["items"]}
    assert ids == {"structure_sampling", "structure_greedy", "sampling_seeded_reproducible"}
    for item in cert["items"]:
        assert item["guards"] and item["duration"] > 0 and isinstance(item["statistics"], list)
    assert md.startswith("# specdec conformance certificate")
    assert_same_verdict(proc, cert, md)
    assert "specdec certificate (CERTIFIED)" in proc.stdout


# (b) a mutant fails and is not certified; the failed checks are listed with their message
def test_mutant_not_certified(tmp_path):
    proc, cert, md = run_suite(tmp_path, "-k", "structure", f"--specdec-backend={MUTANT}")
    assert proc.returncode == 1
    assert cert["certified"] is False and cert["totals"]["failed"] == 2
    assert cert["verdict"]["headline"] == "NOT CERTIFIED: 2 failed"
    failed = {item["check_id"]: item for item in cert["items"] if item["status"] == "failed"}
    assert set(failed) == {"structure_sampling", "structure_greedy"}
    assert all(item["message"] and item["phase"] == "call" for item in failed.values())
    assert "## Failed checks" in md and "`structure_greedy`" in md
    assert failed["structure_greedy"]["message"].splitlines()[0] in md
    assert_same_verdict(proc, cert, md)
    assert "FAILED structure_greedy" in proc.stdout


# (c) listed xfails turn the mutant's known failures into xfailed; with a passing check it is certified
# (d, first half) under the dev profile an id naming nothing warns, naming it
def test_xfails_certify_with_listed_exceptions(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        "# known failures\n\nstructure_sampling bonus token dropped (issue 12)\n"
        "structure_greedy bonus token dropped (issue 12)\nno_such_check stale entry\n"
    )
    proc, cert, md = run_suite(
        tmp_path, "-k", "structure or random_operations-gpt2", f"--specdec-backend={MUTANT}", f"--specdec-xfails={xfails}", "-rw",
        "--hypothesis-profile=dev", files=("conformance/test_verifier.py", "conformance/test_cache.py"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_id = {item["check_id"]: item for item in cert["items"]}
    assert by_id["structure_sampling"]["status"] == by_id["structure_greedy"]["status"] == "xfailed"
    assert by_id["structure_greedy"]["xfail_reason"] == "bonus token dropped (issue 12)"
    # the mutant's cache is the reference's: its cache check passes
    assert by_id["cache_matches_fresh_prefill_under_random_operations-gpt2"]["status"] == "passed"
    assert cert["certified"] is True and cert["totals"]["xfailed"] == 2
    assert {"line": "structure_greedy", "reason": "bonus token dropped (issue 12)"} in cert["xfails"]
    assert "with 2 listed exception(s)" in md and "## Listed exceptions (xfailed)" in md
    assert "PytestWarning" in proc.stdout and "no_such_check" in proc.stdout
    assert "structure_greedy" not in proc.stdout.split("name no registered check or case", 1)[1].splitlines()[0]


def test_unknown_xfails_id_is_an_error_under_ci(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("sampling_accept prefixes no longer match anything\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_verifier.py", "--co", "-q", f"--specdec-xfails={xfails}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 4  # pytest.ExitCode.USAGE_ERROR
    assert "sampling_accept" in proc.stderr and "name no registered check or case" in proc.stderr


def test_xfails_line_names_one_check_exactly():
    """`sampling_accept` is no check id: it marks neither sampling_accept_and_token_at_j nor sampling_accepted_length_law."""
    from conformance.registry import all_cases
    from conformance.xfails import parse_xfails, reason_for, unknown_ids

    entries = parse_xfails("sampling_accept too broad\nsampling_accepted_length_law known\nsampling_bonus_follows_row_k-edges one case\n")
    assert unknown_ids(entries) == ["sampling_accept"]
    marked = {case.id: reason_for(entries, case) for case in all_cases() if reason_for(entries, case)}
    assert marked == {
        **{f"sampling_accepted_length_law-{name}": "known" for name in STAT_SCENARIOS},
        "sampling_bonus_follows_row_k-edges": "one case",
    }


# strict: a listed check that passes fails the run and the certificate
def test_xfail_is_strict(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("structure_greedy expected to fail\n")
    proc, cert, _ = run_suite(tmp_path, "-k", "structure", f"--specdec-xfails={xfails}")
    assert proc.returncode == 1
    assert cert["certified"] is False
    assert statuses(cert) == {
        "conformance/test_verifier.py::test_verifier[structure_greedy]": "failed",
        "conformance/test_verifier.py::test_verifier[structure_sampling]": "passed",
    }
    assert "XPASS(strict)" in next(i["message"] for i in cert["items"] if i["status"] == "failed")


# (d, second half) a line without a reason is a usage error naming the line
def test_malformed_xfails_line_is_usage_error(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("# comment\nstructure_greedy\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_verifier.py", "--co", "-q", f"--specdec-xfails={xfails}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4  # pytest.ExitCode.USAGE_ERROR
    assert f"{xfails}:2:" in proc.stderr and "structure_greedy" in proc.stderr


# (e) under xdist the controller writes the same items and statuses as a serial run
def test_xdist_report_matches_serial(tmp_path, serial_reference):
    _, serial, _ = serial_reference
    proc, parallel, _ = run_suite(tmp_path, "-k", FAST, "-n", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert statuses(parallel) == statuses(serial)
    assert [i["check_id"] for i in parallel["items"]] == [i["check_id"] for i in serial["items"]]
    assert parallel["certified"] is True and parallel["totals"] == serial["totals"]
    assert sorted(os.listdir(tmp_path)) == ["cert.json", "cert.md"]  # no temp files left behind


# ---- pure functions -------------------------------------------------------------------------


def _entry(nodeid, status, **kw):
    e = rep.new_entry(nodeid)
    e.update(status=status, check_id=nodeid, **kw)
    return e


def _cert(entries, exitstatus=0):
    return rep.build_certificate(
        entries,
        suite_version="0",
        backend_spec="m:f",
        backend={"name": "b", "version": "1", "capabilities": {"verifier": True, "sampling": False}},
        profile="ci",
        seed=1,
        exitstatus=exitstatus,
    )


def test_certified_rules():
    assert _cert([_entry("a", "passed"), _entry("b", "xfailed")])["certified"] is True
    assert _cert([_entry("a", "xfailed")])["certified"] is False  # nothing passed: certifies nothing
    assert _cert([_entry("a", "skipped")])["certified"] is False
    assert _cert([_entry("a", "passed"), _entry("b", "failed")])["certified"] is False
    assert _cert([_entry("a", "passed"), _entry("b", "error")])["certified"] is False
    assert _cert([_entry("a", "passed"), _entry("b", "inconclusive")])["verdict"]["headline"] == "NOT CERTIFIED: 1 inconclusive"
    assert _cert([_entry("a", "passed")], exitstatus=2)["certified"] is False  # interrupted session
    assert _cert([_entry("a", None)])["items"][0]["status"] == "error"  # no outcome recorded


def test_reduced_power_verdict_names_the_weakest_checks():
    full = {"n": 10**7, "power": 0.997, "tv": 0.003, "detects": 0.0028, "alpha": 1e-6}
    weak = {"n": 20_000, "power": 0.01, "tv": 0.003, "detects": 0.041, "alpha": 1e-6}
    weaker = {"n": 5_000, "power": 0.001, "tv": 0.003, "detects": 0.083, "alpha": 1e-6}
    cert = _cert([
        _entry("a", "passed", statistics=[full], power="full"),
        _entry("b", "passed", statistics=[full, weak], power="reduced"),
        _entry("c", "passed", statistics=[weaker], power="reduced"),
    ])
    v = cert["verdict"]
    assert cert["certified"] is True and v["level"] == "CERTIFIED AT REDUCED POWER"
    assert v["headline"] == "CERTIFIED AT REDUCED POWER: detects TV >= 0.083"
    assert "c (0.083), b (0.041)" in v["detail"] and [lim["check_id"] for lim in v["reduced_power"]] == ["c", "b"]
    md = rep.render_markdown(cert)
    assert md.splitlines()[2].startswith("**CERTIFIED AT REDUCED POWER: detects TV >= 0.083**")
    assert "## Checks at reduced power" in md


def test_errors_grouped_by_type_and_message_with_one_traceback():
    tb = "Traceback (most recent call last):\n  ...\nRuntimeError: engine exploded\n"
    entries = [_entry(f"c{i}", "error", message="RuntimeError: engine exploded", error_type="RuntimeError", traceback=tb)
               for i in range(5)]
    entries.append(_entry("d", "error", message="ValueError: other", error_type="ValueError", traceback="tb2"))
    cert = _cert(entries)
    assert [(g["error_type"], g["count"]) for g in cert["errors"]] == [("RuntimeError", 5), ("ValueError", 1)]
    lines = rep.verdict_lines(cert)
    assert cert["verdict"]["headline"] == "NOT CERTIFIED: 6 error"
    assert sum("first traceback" in line for line in lines) == 2  # once per group, not once per check
    assert any("ERROR in 5 check(s), the backend raised RuntimeError: engine exploded: c0, c1" in line for line in lines)


def test_skip_names_missing_capability_and_stats_table():
    stats = [{"n": 4000, "p_value": 0.31, "alpha": 1e-4, "power": 0.999, "tv": 0.01, "detects": 0.008}]
    cert = _cert(
        [
            _entry("s", "skipped", requires=["verifier", "sampling"], skip_reason="backend 'b' does not claim capability sampling"),
            _entry("t", "passed", statistics=stats * 2),
        ]
    )
    assert cert["items"][0]["missing_capabilities"] == ["sampling"]
    assert cert["statistical_tests"] == 2 and cert["family_wise_alpha_bound"] == pytest.approx(2e-4)
    md = rep.render_markdown(cert)
    assert "## Statistical checks" in md and "| `t` | passed | 4000 | 0.999 | 0.01 | 0.008 | 0.31 | 0.0001 |" in md
    assert "does not claim capability sampling" in md


def test_merge_phase_failure_in_teardown_is_an_error():
    e = rep.new_entry("x")
    rep.merge_phase(e, when="setup", outcome="passed", props={"specdec_check": "x"}, duration=0.1)
    rep.merge_phase(e, when="call", outcome="passed", props={}, duration=0.2)
    rep.merge_phase(e, when="teardown", outcome="failed", props={}, duration=0.1, longrepr_message="boom")
    assert e["status"] == "error" and e["phase"] == "teardown" and e["duration"] == pytest.approx(0.4)


def test_merge_phase_keeps_the_core_record_and_pytest_xfail():
    from conformance.registry import CheckRecord

    record = CheckRecord("x", "x", "g", "inconclusive", message="inconclusive: N=0", power="inconclusive").as_entry()
    e = rep.new_entry("node", "x")
    rep.merge_phase(e, when="call", outcome="failed", props={"specdec_record": record}, duration=0.1, longrepr_message="x: inconclusive")
    rep.merge_phase(e, when="teardown", outcome="passed", props={"specdec_record": record}, duration=0.1)
    assert e["status"] == "inconclusive" and e["message"] == "inconclusive: N=0"
    xf = rep.new_entry("node", "x")
    rep.merge_phase(xf, when="call", outcome="skipped", props={"specdec_record": record}, duration=0.1, wasxfail="known")
    rep.merge_phase(xf, when="teardown", outcome="passed", props={"specdec_record": record}, duration=0.1)
    assert xf["status"] == "xfailed" and xf["xfail_reason"] == "known"


def test_parse_xfails_and_paths(tmp_path):
    from conformance.xfails import XfailsError, parse_xfails

    assert parse_xfails("# c\n\n  a_b reason one \nb two words\n") == [("a_b", "reason one"), ("b", "two words")]
    with pytest.raises(XfailsError, match=r"f:3:"):
        parse_xfails("a r\n\nlonely\n", source="f")
    assert rep.markdown_path("out.json") == "out.md" and rep.markdown_path("out") == "out.md"
    assert rep.markdown_path("out.md") == "out.md.md"
    target = tmp_path / "sub" / "c.json"
    rep.write_atomic(str(target), "one")
    rep.write_atomic(str(target), "two")
    assert target.read_text() == "two" and os.listdir(target.parent) == ["c.json"]


# (f) repeatable: the same seed gives the same statistics, run after run and on any number of workers
def test_statistics_identical_across_runs_and_workers(tmp_path):
    def without_timings(cert):
        return [{k: v for k, v in item.items() if k != "duration"} for item in cert["items"]]

    selected = ("-k", "accepted_length_law-edges or bonus_follows_row_k-edges", "--hypothesis-profile=dev")
    first = run_suite(tmp_path, *selected, name="first.json")[1]
    second = run_suite(tmp_path, *selected, name="second.json")[1]
    parallel = run_suite(tmp_path, *selected, "-n", "2", name="parallel.json")[1]
    assert first["items"] and all(item["statistics"] for item in first["items"])
    assert without_timings(first) == without_timings(second) == without_timings(parallel)
    # the same core without pytest (run_checks, as the mutation score and the benchmarks use it): same numbers
    from conformance.registry import CheckContext, all_cases, run_case
    from specdec_ref.backend import reference_backend

    backend = reference_backend()
    cases = [c for c in all_cases(["sampling_accepted_length_law", "sampling_bonus_follows_row_k"]) if c.case_id == "edges"]
    outside = {c.id: json.loads(json.dumps(run_case(c, backend, CheckContext(profile="dev")).statistics)) for c in cases}
    assert outside == {item["check_id"]: item["statistics"] for item in first["items"]}


# backends registered by name under the entry-point group
def test_registered_backend_names_resolve():
    from conformance.backends import BackendLoadError, load_backend, registered_backends

    assert {"reference", "hf-verifier", "hf-cache", "hf-assisted"} <= set(registered_backends())
    assert load_backend("reference").name == "specdec_ref.reference"
    with pytest.raises(BackendLoadError, match="registered"):
        load_backend("no-such-backend")


def test_markdown_lists_statistics_and_numerical_flips():
    stat = {"n": 12345, "power": 0.9969, "tv": 0.003, "detects": 0.0029, "p_value": 0.5, "alpha": 1e-6}
    flip = {"kind": "numerical_flip", "where": "llama bfloat16, k=4", "token_a": 3, "token_b": 7,
            "gap_top1_top2": 0.01, "tolerance": 0.16}
    md = rep.render_markdown(_cert([_entry("a", "passed", statistics=[stat], findings=[flip])]))
    assert "| 12345 |" in md and "numerical flips" in md and "llama bfloat16, k=4" in md and "3 / 7" in md


# ---- honest verdicts on third-party backends ---------------------------------------------------


DIRECT_VERIFY_CHECKS = [
    "structure_sampling", "structure_greedy", "greedy_valid_path", "sampling_p_equals_q_accepts_all",
    "sampling_one_hot_target_is_deterministic", "sampling_zero_target_prob_rejected", "sampling_seeded_reproducible",
    "sampling_ignores_global_rng", "unclaimed_modes_raise_not_supported",
]


def test_checks_calling_verify_directly_honour_batched_false():
    """A strict batch-1 verifier (NotSupportedError for B > 1) passes every check that builds its own blocks."""
    from conformance.registry import CheckContext, all_cases, run_case
    from examples.batch1_backend import factory

    backend = factory()
    records = [run_case(c, backend, CheckContext(profile="dev")) for c in all_cases(DIRECT_VERIFY_CHECKS)]
    assert [r.status for r in records] == ["passed"] * len(records), [(r.id, r.message[:300]) for r in records]


def test_sequence_law_over_rounds_with_a_batch1_verifier_is_reduced_under_ci_and_inconclusive_under_dev():
    """One B = 1 call per sequence and round, capped at 20 000 sequences: power stated, never a silent pass."""
    from conformance.registry import CheckContext, all_cases, run_case
    from examples.batch1_backend import factory

    (case,) = all_cases(["sampling_sequence_law_over_rounds"])
    ci = run_case(case, factory(), CheckContext())
    assert (ci.status, ci.power) == ("passed", "reduced") and ci.statistics[0]["n"] == 20_000, ci.message[:500]
    assert 0.005 < ci.statistics[0]["detects"] < 0.5
    dev = run_case(case, factory(), CheckContext(profile="dev"))  # 2 000 sequences over 512 cells
    assert dev.status == "inconclusive" and "N=2000" in dev.message


def test_strict_batch1_verifier_is_certified_at_reduced_power(tmp_path):
    """batched=False: samples are capped (100 000 blocks per scenario under ci, 10 000 under the dev profile
    used here to keep this test short), and the terminal, JSON and Markdown all say
    CERTIFIED AT REDUCED POWER with the TV it can detect, naming the check that sets it."""
    proc, cert, md = run_suite(
        tmp_path, "-k", "structure_greedy or accepted_length_law-edges", "--specdec-backend=examples.batch1_backend:factory",
        "--hypothesis-profile=dev",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    v = cert["verdict"]
    assert cert["totals"]["passed"] == 2 and cert["totals"]["failed"] == cert["totals"]["error"] == 0
    assert v["level"] == "CERTIFIED AT REDUCED POWER" and v["headline"].startswith("CERTIFIED AT REDUCED POWER: detects TV >= 0.0")
    assert [lim["check_id"] for lim in v["reduced_power"]] == ["sampling_accepted_length_law-edges"]
    assert "sampling_accepted_length_law-edges" in v["detail"]
    assert_same_verdict(proc, cert, md)


def raising_backend():
    from tests.test_misbehaving_backends import Misbehaving

    return Misbehaving("raises")


def test_backend_that_raises_gets_grouped_errors_and_one_traceback(tmp_path):
    proc, cert, md = run_suite(
        tmp_path, "-k", "structure_greedy or seeded or one_hot", "--specdec-backend=tests.test_plugin:raising_backend",
    )
    assert proc.returncode == 1
    assert cert["totals"]["error"] == 3 and cert["totals"]["failed"] == 0
    (group,) = cert["errors"]
    assert group["error_type"] == "RuntimeError" and group["count"] == 3 and group["message"] == "RuntimeError: engine exploded"
    assert group["source"] == "backend" and "verify() (" in next(i["message"] for i in cert["items"])
    assert "Traceback" in group["traceback"] and "test_misbehaving_backends.py" in group["traceback"]
    assert cert["verdict"]["headline"] == "NOT CERTIFIED: 3 error"
    assert proc.stdout.count("first traceback:") == 1 and md.count("```") == 2
    assert_same_verdict(proc, cert, md)


def test_x_makes_the_other_workers_skip_what_they_were_sent(tmp_path):
    """``-x`` under xdist: the worker that reaches the failure limit creates the flag the controller handed every
    worker, and from then on every worker skips the conformance cases still in its queue (xdist would run them all
    before stopping), each skip saying why; other items run on."""
    from types import SimpleNamespace

    from conformance.plugin import StopAcrossWorkers
    from conformance.registry import all_cases

    flag = tmp_path / "stopped"
    config = SimpleNamespace(workerinput={"specdec_stop_flag": str(flag)}, getoption=lambda name: 1)
    plugin = StopAcrossWorkers(config)
    case_item = SimpleNamespace(callspec=SimpleNamespace(params={"case": all_cases(["decoder_greedy_equals_ar_fp32"])[0]}))
    other_item = SimpleNamespace()
    plugin.pytest_runtest_setup(case_item)  # nothing stopped yet: runs
    plugin.pytest_runtest_logreport(SimpleNamespace(failed=False))
    assert not flag.exists()
    plugin.pytest_runtest_logreport(SimpleNamespace(failed=True))  # this worker reached -x's limit
    assert flag.exists()
    other = StopAcrossWorkers(config)  # another worker, the same flag
    with pytest.raises(pytest.skip.Exception, match="another xdist worker stopped the session"):
        other.pytest_runtest_setup(case_item)
    other.pytest_runtest_setup(other_item)  # not a conformance case: not this plugin's to skip
    controller = StopAcrossWorkers(SimpleNamespace(getoption=lambda name: 1))
    node = SimpleNamespace(workerinput={})
    controller.pytest_configure_node(node)
    assert node.workerinput["specdec_stop_flag"] == controller.flag and not os.path.exists(controller.flag)
    controller.pytest_unconfigure(controller.config)  # the controller removes the folder it made
    assert not os.path.exists(os.path.dirname(controller.flag))


def test_costliest_then_statistical_cases_are_collected_first():
    """The cases with a cost hint come first, costliest first (the workers end together on short cases); of the
    others, every statistical case (a broken backend fails it at its 5% look) comes before every deterministic one."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    ids = [line.rsplit("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "::" in line]
    from conformance.plugin import cost_hint
    from conformance.registry import all_cases

    cases = {c.id: c for c in all_cases()}
    costs = [cost_hint(cases[i]) for i in ids]
    assert costs and costs == sorted(costs, reverse=True) and costs[0] > 0, "costliest first"
    rest = [cases[i].check.statistical for i, cost in zip(ids, costs) if cost == 0]
    assert rest and rest.index(False) == sum(rest), "then every statistical case before every deterministic one"
