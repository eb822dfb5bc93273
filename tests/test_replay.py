"""Replay files (conformance.replay): strict loading, the shipped mutant fixtures, the CLI and the pytest option."""
import json
import os
import subprocess
import sys

import pytest

from conformance.profiles import DEFAULT_SEED
from conformance.replay import (
    SCHEMA,
    load_replay,
    main,
    run_replay,
    save_replay,
)
from specdec_fixtures.mutants import MUTANTS as ALL_MUTANTS
from specdec_fixtures.mutants.replays import FIXTURE_DIR, fixture_for
from specdec_properties.scenarios import STAT_SCENARIOS
from specdec_ref.backend import reference_backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Fixtures actually replayed here: deterministic checks (well under a second) and one statistical one.
CHEAP = ["bonus_missing", "global_rng", "fixed_seed", "greedy_against_previous_row", "crop_zero_no_op"]
STATISTICAL = "bonus_from_row_k_minus_1"


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURE_DIR, f"{name}.json")


def test_one_fixture_per_mutant_and_nothing_else():
    shipped = {f[: -len(".json")] for f in os.listdir(FIXTURE_DIR) if f.endswith(".json")}
    assert shipped == set(ALL_MUTANTS)


@pytest.mark.parametrize("name", list(ALL_MUTANTS))
def test_fixture_loads_and_is_what_the_generator_writes(name):
    """Every shipped fixture validates, names its mutant's first must_fail check, and is generator output byte for byte."""
    mutant = ALL_MUTANTS[name]
    replay = load_replay(fixture_path(name))
    assert replay.check == mutant.must_fail[0]
    assert replay.case.check.name == replay.check and replay.case.case_id == replay.case_id
    assert replay.bug_class == mutant.bug.splitlines()[0]
    assert name in replay.note and mutant.spec in replay.note
    assert (replay.seed, replay.profile) == (DEFAULT_SEED, "ci")
    stat_verifier = replay.case.check.statistical and replay.case.check.family == "verifier"
    assert (replay.scenario is not None) == (stat_verifier and "scenario" in replay.params)
    expected = json.dumps(fixture_for(mutant, replay.case), indent=2) + "\n"
    with open(fixture_path(name), encoding="utf-8") as fh:
        assert fh.read() == expected, "hand-edited? rebuild with python -m specdec_fixtures.mutants --regenerate-replays"


@pytest.mark.parametrize("name", CHEAP + [STATISTICAL])
def test_fixture_fails_on_its_mutant_and_passes_on_the_reference(name):
    replay = load_replay(fixture_path(name))
    assert (name == STATISTICAL) == replay.case.check.statistical
    bad = run_replay(replay, ALL_MUTANTS[name].backend())
    assert bad.status == "failed", (bad.status, bad.message[:2000])
    assert bad.check == replay.check
    good = run_replay(replay, reference_backend())
    assert good.status == "passed", good.message[:2000]


# ----------------------------------------------------------------------------- malformed files


def valid_data() -> dict:
    with open(fixture_path(STATISTICAL), encoding="utf-8") as fh:
        return json.load(fh)


def write(tmp_path, data, name="case.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def edited(**changes) -> dict:
    data = valid_data()
    for key, value in changes.items():
        if value is KeyError:
            del data[key]
        else:
            data[key] = value
    return data


def _other_rows():
    d = valid_data()
    d["scenario"]["target"][0][0] += 1e-3
    return d


def _other_scenario():
    d = valid_data()
    d["scenario"] = STAT_SCENARIOS["edges"].as_dict()
    return d


@pytest.mark.parametrize(
    "data, message",
    [
        ("{not json", "not valid JSON"),
        ('{"seed": NaN}', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (edited(schema="specdec-replay/2"), "unsupported replay schema 'specdec-replay/2'"),
        (edited(schema="something-else"), "not a specdec replay"),
        (edited(schema=KeyError), "not a specdec replay"),
        (edited(extra=1, also=2), "unknown key(s) ['also', 'extra']"),
        (edited(note=KeyError), "missing key(s) ['note']"),
        (edited(check="no_such_check"), "unknown check 'no_such_check'"),
        (edited(case="balanced-j9"), "has no case 'balanced-j9'"),
        (edited(params={"scenario": "edges"}), "the suite changed; regenerate the fixture"),
        (edited(profile="fast"), "unknown profile 'fast'"),
        (edited(seed=True), "'seed' must be a non-negative integer"),
        (edited(seed="1"), "'seed' must be a non-negative integer"),
        (edited(note=3), "'note' must be a string"),
        (edited(params=[]), "'params' must be an object"),
        (_other_rows(), "fixture scenario differs from the suite's scenario balanced: the suite changed; regenerate the fixture"),
        (_other_scenario(), "fixture scenario differs from the suite's scenario balanced"),
        (edited(scenario={"name": "balanced"}), "'scenario' must have exactly the keys"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_malformed_file_is_a_clear_value_error(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(ValueError) as info:
        load_replay(path)
    assert path in str(info.value) and message in str(info.value), str(info.value)


def test_scenario_only_for_scenario_cases(tmp_path):
    data = json.loads(open(fixture_path("bonus_missing"), encoding="utf-8").read())
    data["scenario"] = STAT_SCENARIOS["balanced"].as_dict()
    with pytest.raises(ValueError, match="runs no scenario"):
        load_replay(write(tmp_path, data))


def test_save_validates_and_writes_atomically(tmp_path):
    path = str(tmp_path / "sub" / "saved.json")
    replay = save_replay(path, "sampling_residual_at_j", "edges-j1", {"scenario": "edges", "j": 1}, 7, "dev", "bug", "note")
    assert load_replay(path) == replay and replay.seed == 7 and replay.name == "saved"
    with pytest.raises(ValueError, match="unknown check"):
        save_replay(str(tmp_path / "bad.json"), "nope", "", {}, 7, "ci", "bug", "note")
    assert sorted(os.listdir(tmp_path)) == ["sub"] and os.listdir(tmp_path / "sub") == ["saved.json"]


# ----------------------------------------------------------------------------- command line and pytest option


def test_command_exit_status(capsys):
    path = fixture_path("bonus_missing")
    assert main([path, "--backend", "specdec_fixtures.mutants.verifier:bonus_missing"]) == 1
    out = capsys.readouterr().out
    assert "structure_sampling" in out and "FAILED" in out and "not in [0, " in out
    assert main([path, "--backend", "specdec_ref.backend:reference_backend"]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_command_rejects_a_malformed_file(tmp_path, capsys):
    assert main([write(tmp_path, "{")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def _pytest(*args):
    cmd = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *args]
    env = {**os.environ, "PYTEST_XDIST_WORKER": ""}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_pytest_option_end_to_end():
    fixture = "--specdec-replay=fixtures/replays/bonus_missing.json"
    out = _pytest(fixture, "--specdec-backend=specdec_fixtures.mutants.verifier:bonus_missing")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test_replay[bonus_missing-structure_sampling]" in out.stdout and "NOT CERTIFIED" in out.stdout
    assert "1 failed" in out.stdout
    out = _pytest(fixture, "--specdec-backend=specdec_ref.backend:reference_backend")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 passed" in out.stdout


def test_pytest_option_with_a_malformed_file_is_a_usage_error(tmp_path):
    out = _pytest(f"--specdec-replay={write(tmp_path, edited(bogus=1))}")
    assert out.returncode == 4 and "unknown key(s) ['bogus']" in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
