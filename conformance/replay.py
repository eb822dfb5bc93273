"""Failing cases saved as data (JSON, never pickle) and replayed against any backend.

A replay file names one registered check case and the context it ran under::

    {"schema": "specdec-replay/1", "check": "structure_sampling", "case": "",
     "params": {}, "seed": 20261129, "profile": "ci",
     "bug_class": "...", "note": "...",
     "scenario": {...}}          # optional: Scenario.as_dict() of a verifier statistical case

Every check is seeded from its :class:`~conformance.registry.CheckContext` (and the
``ci``/``dev`` Hypothesis profiles are derandomised), so re-running the case with
the file's seed and profile reproduces the run exactly (``thorough`` is not
derandomised: a replay under it reruns the check, not the exact examples).

    python -m conformance.replay fixtures/replays/NAME.json [--backend module:factory]
    python -m pytest conformance/ --specdec-replay=fixtures/replays/NAME.json --specdec-backend=module:factory
    python -m specdec_fixtures.mutants --regenerate-replays  # rebuild fixtures/replays/ from the mutants
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .profiles import PROFILES
from .registry import CHECKS, CheckCase, CheckContext, CheckRecord, all_cases, run_case
from .report import write_atomic

SCHEMA = "specdec-replay/1"
REQUIRED_KEYS = ("schema", "check", "case", "params", "seed", "profile", "bug_class", "note")
OPTIONAL_KEYS = ("scenario",)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Replay:
    """A validated replay file: one registered check case and the context to run it under."""

    path: str
    check: str
    case_id: str
    params: dict
    seed: int
    profile: str
    bug_class: str
    note: str
    scenario: dict | None = None
    case: CheckCase = field(repr=False, compare=False, default=None)

    @property
    def name(self) -> str:
        """The file's stem (``bonus_missing`` for ``fixtures/replays/bonus_missing.json``)."""
        return os.path.splitext(os.path.basename(self.path))[0]

    def context(self, replay_command: str = "") -> CheckContext:
        return CheckContext(seed=self.seed, profile=self.profile, replay=replay_command or self.command())

    def command(self, backend_spec: str | None = None) -> str:
        spec = f" --backend {backend_spec}" if backend_spec else ""
        return f"python -m conformance.replay {os.path.relpath(self.path, ROOT) if _under(self.path, ROOT) else self.path}{spec}"


def _under(path: str, root: str) -> bool:
    path, root = os.path.abspath(path), os.path.abspath(root)
    return os.path.commonpath([path, root]) == root


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name} is not allowed")


def _json_equal(a: Any, b: Any) -> bool:
    """Equality after a JSON round trip (tuples become lists, int keys strings)."""
    return json.loads(json.dumps(a, sort_keys=True)) == json.loads(json.dumps(b, sort_keys=True))


def _find_case(check: str, case_id: str) -> CheckCase | None:
    for case in all_cases([check]):
        if case.case_id == case_id:
            return case
    return None


def validate(data: Any, source: str) -> Replay:
    """Validate a decoded replay object strictly; every problem is a ``ValueError`` naming ``source``."""

    def bad(msg: str) -> ValueError:
        return ValueError(f"{source}: {msg}")

    if not isinstance(data, dict):
        raise bad(f"a replay must be a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if not isinstance(schema, str) or not schema.startswith("specdec-replay/"):
        raise bad(f"not a specdec replay: 'schema' must be {SCHEMA!r}, got {schema!r}")
    if schema != SCHEMA:
        raise bad(f"unsupported replay schema {schema!r}; this suite reads {SCHEMA!r}")
    unknown = sorted(set(data) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise bad(f"unknown key(s) {unknown}; allowed: {list(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise bad(f"missing key(s) {missing}")
    for key in ("check", "case", "profile", "bug_class", "note"):
        if not isinstance(data[key], str):
            raise bad(f"{key!r} must be a string, got {type(data[key]).__name__}")
    if not isinstance(data["params"], dict):
        raise bad(f"'params' must be an object, got {type(data['params']).__name__}")
    seed = data["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise bad(f"'seed' must be a non-negative integer, got {seed!r}")
    if data["profile"] not in PROFILES:
        raise bad(f"unknown profile {data['profile']!r}; known: {list(PROFILES)}")
    all_cases()  # registers every check module
    check = data["check"]
    if check not in CHECKS:
        raise bad(f"unknown check {check!r}: not registered in this suite (conformance.registry.CHECKS)")
    case = _find_case(check, data["case"])
    if case is None:
        known = [c.case_id for c in all_cases([check])]
        raise bad(f"check {check!r} has no case {data['case']!r}; its cases: {known}")
    if not _json_equal(data["params"], case.params):
        raise bad(
            f"params {data['params']} differ from the suite's case {case.id} ({case.params}): "
            "the suite changed; regenerate the fixture"
        )
    scenario = data.get("scenario")
    if scenario is not None:
        _validate_scenario(scenario, case, bad)
    return Replay(
        path=source,
        check=check,
        case_id=data["case"],
        params=dict(data["params"]),
        seed=seed,
        profile=data["profile"],
        bug_class=data["bug_class"],
        note=data["note"],
        scenario=scenario,
        case=case,
    )


def _validate_scenario(scenario: Any, case: CheckCase, bad) -> None:
    import numpy as np

    from specdec_properties.scenarios import STAT_SCENARIOS, Scenario, for_scheme
    from specdec_ref.contract import LOSSLESS_SCHEMES

    if not isinstance(scenario, dict):
        raise bad(f"'scenario' must be an object (Scenario.as_dict()), got {type(scenario).__name__}")
    name = case.params.get("scenario")
    if name is None:
        raise bad(f"'scenario' given but case {case.id} runs no scenario")
    if set(scenario) != {"name", "purpose", "target", "draft"}:
        raise bad(f"'scenario' must have exactly the keys ['draft', 'name', 'purpose', 'target'], got {sorted(scenario)}")
    try:
        fixture = Scenario.from_dict(scenario)
    except (ValueError, TypeError) as exc:
        raise bad(f"malformed 'scenario': {exc}") from None
    def same(suite) -> bool:
        return (
            fixture.name == suite.name
            and fixture.purpose == suite.purpose
            and fixture.target.shape == suite.target.shape
            and fixture.draft.shape == suite.draft.shape
            and np.array_equal(fixture.target, suite.target)
            and np.array_equal(fixture.draft, suite.draft)
        )

    # the scenario as the suite uses it for some declared scheme (specdec_properties.scenarios.for_scheme)
    if not any(same(for_scheme(STAT_SCENARIOS[name], scheme)) for scheme in LOSSLESS_SCHEMES):
        raise bad(f"fixture scenario differs from the suite's scenario {name}: the suite changed; regenerate the fixture")


def load_replay(path: str) -> Replay:
    """Read and validate a replay file (``ValueError`` naming the file for anything malformed)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text: {exc}") from None
    except ValueError as exc:  # json.JSONDecodeError and non-finite constants
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return validate(data, path)


def replay_dict(check, case_id, params, seed, profile, bug_class, note, scenario=None) -> dict:
    data = {
        "schema": SCHEMA,
        "check": check,
        "case": case_id,
        "params": params,
        "seed": seed,
        "profile": profile,
        "bug_class": bug_class,
        "note": note,
    }
    if scenario is not None:
        data["scenario"] = scenario
    return data


def save_replay(path, check, case_id, params, seed, profile, bug_class, note, scenario=None) -> Replay:
    """Validate and write a replay file atomically (temporary file in the same folder, then rename)."""
    data = replay_dict(check, case_id, params, seed, profile, bug_class, note, scenario)
    replay = validate(json.loads(json.dumps(data)), path)
    write_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    return replay


def run_replay(replay: Replay, backend, timeout: float | None = None) -> CheckRecord:
    """Re-run the replay's case on ``backend`` with its seed and profile; never raises (see ``run_case``)."""
    return run_case(replay.case, backend, replay.context(), timeout=timeout)


# ----------------------------------------------------------------------------- command line


def _load_backend(spec: str | None):
    from .backends import BackendLoadError, load_backend, resolve_spec

    spec = resolve_spec(spec)
    try:
        return spec, load_backend(spec)
    except BackendLoadError as exc:
        raise SystemExit(f"error: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", help="replay file (fixtures/replays/NAME.json)")
    parser.add_argument("--backend", default=None, metavar="MODULE:FACTORY", help="backend under test (default $SPECDEC_BACKEND or the reference)")
    parser.add_argument("--timeout", type=float, default=None, help="per-check time limit in seconds (default 300; 0 disables)")
    args = parser.parse_args(argv)
    if not args.path:
        parser.error("give a replay file")
    try:
        replay = load_replay(args.path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spec, backend = _load_backend(args.backend)
    record = run_replay(replay, backend, timeout=args.timeout)
    print(f"replay {replay.name}: {record.id} on {spec}: {record.status.upper()} ({record.seconds:.1f} s)")
    print(f"bug class: {replay.bug_class}")
    if record.message:
        print(record.message)
    if record.status == "skipped":
        return 2
    return 0 if record.status == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
