"""Smoke test of ``specdec-bench`` (the ``bench`` package): tiny settings, output structure only (never a timing).

Also the import direction of the project: reference (``specdec_ref``) -> suite (``properties``,
``conformance``, ``fixtures``) -> tools (``bench``), never backwards.
"""
from __future__ import annotations

import ast
import io
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from specdec_bench import cli
from specdec_properties.scenarios import STAT_SCENARIOS
from test_layout import PACKAGES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    status = cli.main(argv, out=out)
    return status, out.getvalue()


def test_verifier_rows_table_and_json(tmp_path):
    path = tmp_path / "verifier.json"
    threads = torch.get_num_threads()
    status, text = _run(
        [
            "verifier", "--batch", "1,8", "--k", "1,4", "--vocab", "16", "--threads", "1",
            "--repeats", "3", "--min-seconds", "0.001", "--warmup-seconds", "0.001",
            "--mode", "sampling,greedy", "--json", str(path),
        ]
    )  # fmt: skip
    assert status == 0
    assert torch.get_num_threads() == threads, "the benchmark must restore the thread count"
    payload = json.loads(path.read_text())
    assert payload["command"] == "verifier"
    assert {"torch", "cpu_count"} <= set(payload["environment"])
    assert set(payload["load_average"]) == {"before", "after"}
    rows = payload["rows"]
    assert len(rows) == 2 * 2 * 2  # B x k x mode
    assert {(r["batch"], r["k"], r["mode"]) for r in rows} == {
        (b, k, m) for b in (1, 8) for k in (1, 4) for m in ("sampling", "greedy")
    }
    for r in rows:
        assert r["threads"] == 1 and r["vocab"] == 16 and r["validate"] is False and r["repeats"] == 3
        assert r["calls"] >= 1
        assert r["blocks_per_s_p10"] <= r["blocks_per_s_median"] <= r["blocks_per_s_p90"]
        assert r["us_per_call_p10"] <= r["us_per_call_median"] <= r["us_per_call_p90"]
        assert 0 <= r["mean_accepted"] <= r["k"]
    for header in ("thr", "blocks/s med", "us/call med", "load average"):
        assert header in text
    # the goal point (k=4, V=16, sampling, no validation) is in the grid: the verdict line names it
    assert "goal: >= 2M blocks/s at k=4, V=16" in text
    assert ("REACHED" in text) and "B=8" in text
    assert payload["summary"] and "goal" in payload["summary"][0]


def test_verifier_skips_oversized_points_and_reports_missing_goal():
    status, text = _run(
        [
            "verifier", "--batch", "2", "--k", "1", "--vocab", "8,4096", "--mode", "greedy",
            "--repeats", "1", "--min-seconds", "0.001", "--warmup-seconds", "0.001", "--max-gb", "0.0001",
        ]
    )  # fmt: skip
    assert status == 0
    assert "skipped" in text
    assert "NOT MEASURED" in text


def test_verifier_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit, match="cuda"):
        _run(["verifier", "--device", "cuda", "--batch", "1", "--k", "1", "--vocab", "4"])


def test_checks_rows_groups_and_json(tmp_path):
    from hypothesis import settings

    path = tmp_path / "checks.json"
    profile = getattr(settings, "_current_profile", None)
    status, text = _run(
        [
            "checks", "--profile", "dev", "--names", "sampling_accepted_length_law", "structure_greedy",
            "sampling_seeded_reproducible", "--json", str(path),
        ]
    )  # fmt: skip
    assert getattr(settings, "_current_profile", None) == profile, "the benchmark must restore the Hypothesis profile"
    assert status == 0, text
    payload = json.loads(path.read_text())
    rows = payload["rows"]
    scenarios = len(STAT_SCENARIOS)
    assert [r["check"] for r in rows] == ["sampling_accepted_length_law"] * scenarios + ["structure_greedy", "sampling_seeded_reproducible"]
    for r in rows:
        assert r["status"] == "passed"
        assert r["cpu_s"] >= 0 and r["wall_s"] >= 0
    stat = rows[0]
    assert stat["statistical"] and stat["tests"] == 1
    assert stat["n_min"] > 0 and 0 <= stat["power_min"] <= 1 and stat["alpha_max"] <= 1e-6
    assert stat["group"].startswith("verifier-sample-")
    assert rows[scenarios]["tests"] == 0 and rows[scenarios]["power_min"] is None  # structure_greedy
    groups = {g["group"]: g for g in payload["groups"]}
    assert len(groups) == scenarios + 2  # one group per scenario + two single-case groups
    assert sum(g["cases"] for g in groups.values()) == len(rows)
    for name, g in groups.items():
        members = [r for r in rows if r["group"] == name]
        assert g["cpu_s"] == pytest.approx(sum(r["cpu_s"] for r in members))
    cases = scenarios + 2
    for header in ("case", "status", "cpu s", "power min", "per shared-sample group", f"totals: {cases} cases ({cases} passed)"):
        assert header in text
    assert "pytest -n 2" in text


def test_checks_top_lists_the_costliest_cases_first():
    """``checks --top N``: the N costliest cases by CPU seconds, largest first, with their share of the total."""
    from specdec_bench.checks import top_rows

    rows = [dict(id=f"c{i}", status="passed", cpu_s=float(s), wall_s=float(s)) for i, s in enumerate((1, 5, 3, 1))]
    top = top_rows(rows, 2)
    assert [r["id"] for r in top] == ["c1", "c2"]
    assert top[0]["cpu_share"] == pytest.approx(0.5) and top[1]["cumulative_share"] == pytest.approx(0.8)
    status, text = _run(["checks", "--profile", "dev", "--names", "structure_greedy", "sampling_seeded_reproducible",
                         "--top", "1"])
    assert status == 0, text
    assert "the 1 costliest cases of 2" in text and "cumulative" in text


def test_unknown_check_name_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown check name"):
        _run(["checks", "--names", "no_such_check"])


def test_checks_accepts_a_registered_backend_name(tmp_path):
    """``--backend hf-verifier`` (an entry-point name, not module:factory) loads through conformance.backends."""
    path = tmp_path / "checks.json"
    status, text = _run(
        ["checks", "--backend", "hf-verifier", "--profile", "dev", "--names", "structure_greedy",
         "sampling_p_equals_q_accepts_all", "decoder_rejects_bad_input", "--json", str(path)]
    )  # fmt: skip
    assert status == 0, text
    rows = json.loads(path.read_text())["rows"]
    assert {r["check"]: r["status"] for r in rows} == {
        "structure_greedy": "passed",
        "sampling_p_equals_q_accepts_all": "passed",
        "decoder_rejects_bad_input": "skipped",  # hf_verifier does not claim decoder
    }
    assert "conformance checks on hf-verifier" in text


def test_checks_unloadable_backend_is_a_clear_error():
    with pytest.raises(SystemExit, match=r"^error: backend 'no-such-backend' is neither"):
        _run(["checks", "--backend", "no-such-backend", "--names", "structure_greedy"])
    with pytest.raises(SystemExit, match=r"^error: backend 'specdec_ref.backend:nope'"):
        _run(["checks", "--backend", "specdec_ref.backend:nope", "--names", "structure_greedy"])


def test_python_dash_m_bench_runs_the_command_line():
    done = subprocess.run([sys.executable, "-m", "specdec_bench", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "specdec-bench" in done.stdout and all(name in done.stdout for name in ("verifier", "checks", "decoder", "tree-verifier", "tree-decoder", "batch"))


def test_every_subcommand_has_its_own_parser_and_json_option():
    parser = cli.build_parser()
    assert set(cli.SUBCOMMANDS) == {"verifier", "checks", "decoder", "tree-verifier", "tree-decoder", "batch", "profile",
                                   "profile-engine"}
    for name in cli.SUBCOMMANDS:
        args = parser.parse_args([name, "--json", "x.json"])
        assert args.command == name and args.json == "x.json"


def test_decoder_rows_table_and_json(tmp_path):
    path = tmp_path / "decoder.json"
    threads = torch.get_num_threads()
    status, text = _run(
        [
            "decoder", "--prompts", "1", "--new-tokens", "16", "--k", "2", "--repeats", "1",
            "--mode", "greedy,sampling", "--json", str(path),
        ]
    )  # fmt: skip
    assert status == 0
    assert torch.get_num_threads() == threads, "the benchmark must restore the thread count"
    payload = json.loads(path.read_text())
    assert payload["command"] == "decoder"
    assert set(payload["load_average"]) == {"before", "after"}
    rows = payload["rows"]
    labels = ["ar", "ar-lean", "spec k=2", "hf-assisted k=2", "hf-ar"]
    assert [(r["mode"], r["label"]) for r in rows] == [(m, label) for m in ("greedy", "sampling") for label in labels]
    for r in rows:
        assert r["repeats"] == 1 and r["new_tokens"] == 16 and r["prompts"] == 1 and r["threads"] == 1
        assert len(r["tokens_per_s"]) == 1 and r["tokens_per_s_p10"] <= r["tokens_per_s_median"] <= r["tokens_per_s_p90"]
        assert r["target_calls_per_100"] > 0 and r["tokens_per_cpu_s_median"] > 0
        assert r["forward_share"] is None or 0 < r["forward_share"] <= 1  # None: the lean forward bypasses the hooks
        if r["variant"] in ("spec", "hf-assisted"):
            assert r["k"] == 2 and 0 <= r["acceptance"] <= 1 and 1 <= r["tokens_per_round"] <= 3
            assert r["draft_calls_per_100"] > 0
            assert r["k_exact"] is True, "every round must draft exactly min(k, tokens left - 1) tokens"
        else:
            assert r["k"] is None and r["acceptance"] is None and r["draft_calls_per_100"] == 0
        if r["variant"] == "spec":
            assert r["host_syncs_per_round"] == 1
            assert all(0 <= r[f"{p}_share"] <= 1 for p in ("draft", "verify", "repair"))
            assert r["vs_hf_assisted"] > 0 and r["vs_ar_lean"] > 0
            assert r["runs_hf"] == 1 and isinstance(r["equals_hf"], bool)
        if r["mode"] == "greedy":
            assert r["equals_ar"] is True and r["runs"] == 1
    greedy = {r["label"]: r for r in rows if r["mode"] == "greedy"}
    # greedy drafts are deterministic: ours and transformers' assisted generation accept the same tokens
    assert greedy["spec k=2"]["acceptance"] == greedy["hf-assisted k=2"]["acceptance"]
    assert greedy["ar"]["vs_ar"] == 1.0
    for header in ("variant", "tok/s med", "x hf(k)", "accept", "k exact", "= AR", "load average"):
        assert header in text
    assert "goal (our speculative decoder >= 2x" in text and "at our best k=2" in text
    assert "every output equals AR token for token" in text



def test_batch_rows_table_greedy_equality_and_json(tmp_path):
    path = tmp_path / "batch.json"
    threads = torch.get_num_threads()
    status, text = _run(
        [
            "batch", "--batch", "1,2", "--k", "2", "--new-tokens", "8", "--prompt-length", "8", "--repeats", "1",
            "--cost-seconds", "0.005", "--json", str(path),
        ]
    )  # fmt: skip
    assert status == 0, text  # 0: every greedy spec row equals ar-lean token for token
    assert torch.get_num_threads() == threads, "the benchmark must restore the thread count"
    rows = json.loads(path.read_text())["rows"]
    assert [(r["mode"], r["batch"], r["label"]) for r in rows] == [
        (m, b, label) for m in ("greedy", "sampling") for b in (1, 2) for label in ("ar-lean", "spec k=2")
    ]
    for r in rows:
        assert r["repeats"] == 1 and r["new_tokens"] == 8 and r["threads"] == 1 and r["tokens_per_s_median"] > 0
        assert r["target_forward_s"] > 0 and r["draft_forward_s"] > 0 and r["round_cost"] > 0
        if r["variant"] == "ar-lean":
            assert r["vs_ar_lean"] == 1.0 and r["acceptance"] is None and r["leviathan_speedup"] is None
            assert r["tokens_per_target_call"] == r["batch"]  # one token per row per batched call
        else:
            assert 0 <= r["acceptance"] <= 1 and 1 <= r["tokens_per_round"] <= 3
            assert r["batch"] <= r["tokens_per_target_call"] <= 3 * r["batch"]
            assert r["cost_ratio"] > 0 and r["block_ratio"] > 0 and r["leviathan_speedup"] > 0 and r["refined_speedup"] > 0
            assert r["gap_leviathan"] == pytest.approx(r["vs_ar_lean"] / r["leviathan_speedup"] - 1)
        if r["mode"] == "greedy":
            assert r["mismatched_rows"] == 0 and r["rows_compared"] == r["batch"]
        assert (r["hf_assisted_error"] is None) == (r["batch"] == 1)
    for header in ("variant", "tok/s", "x lean", "tok/tgt", "alpha", "tok/rnd", "S'", "gap S", "kc+r", "= lean"):
        assert header in text
    assert "greedy B=2 k=2: measured" in text and "Leviathan S" in text and "refined S'" in text
    assert "greedy: every spec row equals ar-lean token for token (3 rows)" in text
    assert "speculation pays" in text and "specdec-bench decoder" in text


def test_batch_exit_status_flags_a_greedy_mismatch():
    status = cli.SUBCOMMANDS["batch"].exit_status
    assert status([{"mismatched_rows": 0}, {"mismatched_rows": None}]) == 0
    assert status([{"mismatched_rows": 0}, {"mismatched_rows": 2}]) == 1


def test_leviathan_speedup_known_values():
    from specdec_bench.batch import expected_tokens_per_round, leviathan_speedup, refined_speedup

    assert leviathan_speedup(0.0, 4, 0.25) == pytest.approx(1 / (4 * 0.25 + 1))  # alpha = 0: only the target's token
    assert leviathan_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)  # alpha = 1: (k + 1) / (k c + 1)
    assert leviathan_speedup(1 - 1e-9, 3, 0.5) == pytest.approx(4 / 2.5)  # ... the limit of the closed form
    # alpha = 0.5, k = 2, c = 0.1: (1 - 0.125) / (0.5 * 1.2) = 1.458333...
    assert leviathan_speedup(0.5, 2, 0.1) == pytest.approx(0.875 / 0.6)
    assert expected_tokens_per_round(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert refined_speedup(2.5, 2, 0.25, 1.5) == pytest.approx(2.5 / 2.0)
    with pytest.raises(ValueError):
        leviathan_speedup(1.5, 2, 0.1)

# ----------------------------------------------------------------------------- import direction

#: package -> the top-level packages it must never import (reference -> suite -> mutants -> tools): the mutants and
#: the fake engine are backends the suite checks, so they may import the suite and the suite never imports them.
FORBIDDEN_IMPORTS = {
    "specdec_ref": {"specdec_properties", "conformance", "specdec_fixtures", "specdec_bench"},
    "specdec_properties": {"conformance", "specdec_fixtures", "specdec_bench"},
    "conformance": {"specdec_fixtures", "specdec_bench"},
    "specdec_fixtures": {"specdec_bench"},
}


def imported_packages(path: pathlib.Path, package: str) -> set[tuple[int, str]]:
    """(line, top-level package) of every import in ``path``, module-level or inside functions.

    Relative imports are resolved against ``package`` (they stay inside it, so they never count);
    ``importlib.import_module("x...")`` with a literal name counts too.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name.split(".")[0]) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add((node.lineno, package if node.level else (node.module or "").split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add((node.lineno, node.args[0].value.split(".")[0]))
    return found


def test_imports_run_one_way_reference_then_suite_then_tools():
    violations = []
    for package, forbidden in FORBIDDEN_IMPORTS.items():
        files = sorted((ROOT / PACKAGES[package]).rglob("*.py"))
        assert files, f"no Python files under {PACKAGES[package]}/"
        for path in files:
            for line, name in sorted(imported_packages(path, package)):
                if name in forbidden:
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not violations, "imports must run specdec_ref -> specdec_properties/conformance/specdec_fixtures -> specdec_bench:\n" + "\n".join(violations)


def test_import_direction_checker_sees_function_level_and_relative_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os.path\nfrom . import sibling\ndef f():\n    from specdec_bench.kit import Column\n    importlib.import_module('conformance.registry')\n")
    assert imported_packages(path, "specdec_ref") == {(1, "os"), (2, "specdec_ref"), (4, "specdec_bench"), (5, "conformance")}


def test_tree_verifier_rows_and_ratios(tmp_path):
    path = tmp_path / "tree.json"
    status, text = _run(
        ["tree-verifier", "--batch", "4", "--nodes", "10", "--depth", "3", "--vocab", "16", "--repeats", "1",
         "--min-seconds", "0.01", "--warmup-seconds", "0.001", "--json", str(path)]
    )  # fmt: skip
    assert status == 0
    rows = json.loads(path.read_text())["rows"]
    kinds = {(r["kind"], r["scheme"], r["mode"]) for r in rows}
    assert ("chain", "token", "sampling") in kinds and ("tree", "recursive", "greedy") in kinds
    assert all(r["nodes_per_s_median"] > 0 for r in rows)
    assert all(r["ratio_to_chain"] > 0 for r in rows if r["kind"] == "tree")
    assert "x the chain verifier" in text
