"""Fast tests of the engine runner's parts that need no engine: matrix, adapters as data, expectation files,
efficiency maths, report, the speculation and per-seed identity checks, and a whole runner pass on a fake engine.

Nothing here imports an engine (adapters import theirs only inside the worker process).
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

import numpy as np
import pytest
import torch

from conformance.engines import adapter as adapters
from conformance.engines import efficiency as eff
from conformance.engines import matrix
from conformance.engines import report
from conformance.engines import runner
from conformance.engines.vllm import adapter as vllm
from specdec_ref.warp import SamplingConfig


def test_importing_the_runner_does_not_import_vllm():
    import subprocess

    code = ("import sys, conformance.engines.vllm, conformance.engines.worker, conformance.engines.report, "
            "conformance.engines.runner, conformance.engines.efficiency, conformance.engines.adapter; "
            "sys.exit(1 if 'vllm' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_matrix_cases_are_well_defined():
    from conformance.samples import split_ties
    from specdec_ref.exact import exact_model

    names = [c.name for c in matrix.CASES + matrix.FEATURE_CASES]
    assert len(names) == len(set(names))
    seeds = set()
    for c in matrix.CASES + matrix.FEATURE_CASES:
        em = exact_model(c.model)
        # the logprobs case: the returned values checked token by token; its law at a quarter of the sample; the
        # streamed case: every text checked, and per seed its non-streamed twin's completion
        assert c.n >= (20000 if not c.greedy else 100) or ((c.logprobs or c.same_seeds_as) and c.n >= 5000)
        assert split_ties(em, c.prompt, c.max_new_tokens, c.sampling, eos_id=em.eos_id if c.eos else None) == []
        if c.seeded:
            s = {c.seed(i) for i in range(c.n)}
            assert len(s) == c.n
            if c.same_seeds_as:  # a twin repeats its twin's first seeds, with the same law
                twin = matrix.case(c.same_seeds_as)
                assert s <= {twin.seed(i) for i in range(twin.n)} and (twin.prompt, twin.sampling, twin.stops) == \
                    (c.prompt, c.sampling, c.stops)
                continue
            assert not (s & seeds)
            seeds |= s
    for name in adapters.ADAPTERS:
        for cfg in adapters.adapter(name).configurations:
            assert all(c in names for c in (cfg.cases or ())), (name, cfg.name)
    # the prompt-length split the (C) diagnosis needs: one-token and longer prompts with the same law
    assert {matrix.case("warp-1tok").prompt, matrix.case("warp").prompt} == {(6,), (2, 6)}
    assert len(matrix.case("position-1tok").prompt) == 1 and len(matrix.case("position").prompt) == 2


def test_sampling_kwargs_pass_logit_bias_and_min_tokens():
    kw = vllm.vllm_sampling_kwargs(matrix.case("logit-bias").sampling, max_new_tokens=3, eos=False, eos_id=7, seed=1)
    assert kw["logit_bias"] == {2: 1.0, 5: -1.0} and "min_tokens" not in kw
    kw = vllm.vllm_sampling_kwargs(SamplingConfig(min_new_tokens=2), max_new_tokens=3, eos=True, eos_id=7, seed=1)
    assert kw["min_tokens"] == 2 and "logit_bias" not in kw


def test_sampling_kwargs_set_every_filter_off_explicitly():
    kw = vllm.vllm_sampling_kwargs(SamplingConfig(temperature=0.7), max_new_tokens=3, eos=True, eos_id=7, seed=5)
    assert kw["top_k"] == 0 and kw["top_p"] == 1.0 and kw["min_p"] == 0.0 and kw["seed"] == 5
    assert kw["stop_token_ids"] == [7] and kw["ignore_eos"] is False and kw["detokenize"] is False
    g = vllm.vllm_sampling_kwargs(SamplingConfig(greedy=True), max_new_tokens=2, eos=False, eos_id=7, seed=None)
    assert g["temperature"] == 0.0 and g["ignore_eos"] is True
    p = vllm.vllm_sampling_kwargs(SamplingConfig(temperature=0.6, repetition_penalty=1.5, presence_penalty=0.5),
                                    max_new_tokens=3, eos=True, eos_id=7, seed=1)
    assert p["repetition_penalty"] == 1.5 and p["presence_penalty"] == 0.5 and p["frequency_penalty"] == 0.0


def test_speculative_config():
    assert vllm.speculative_config(vllm.ADAPTER.config("control"), None) is None
    spec = vllm.speculative_config(vllm.ADAPTER.config("draft-prob"), "/d")
    assert spec == {"method": "draft_model", "num_speculative_tokens": vllm.K, "draft_sample_method": "probabilistic",
                    "model": "/d"}
    assert "model" not in vllm.speculative_config(vllm.ADAPTER.config("ngram"), "/d")


# ----------------------------------------------------------------------------- efficiency maths


def _brute_round_law(pair, start, k):
    """P[m, y] of token-wise rejection sampling by direct recursion (independent of specdec_properties.exact)."""
    p, q, V = pair.target, pair.draft, pair.vocab
    out = np.zeros((k + 1, V))

    def walk(last, j, mass):
        if j == k:
            out[k] += mass * p[last]
            return
        for d in range(V):
            if q[last, d] == 0:
                continue
            acc = min(1.0, p[last, d] / q[last, d])
            walk(d, j + 1, mass * q[last, d] * acc)
            res = np.maximum(p[last] - q[last], 0)
            if res.sum() > 0:
                out[j] += mass * q[last, d] * (1 - acc) * res / res.sum()

    walk(start, 0, 1.0)
    return out


def test_round_law_matches_a_direct_recursion():
    pair, oracle = eff.tables("order1-close", SamplingConfig(temperature=0.7), "token")
    for a in (0, 3, 6):
        law = eff.round_law(pair, oracle, a, 2)
        assert abs(law.sum() - 1) < 1e-12
        np.testing.assert_allclose(law, _brute_round_law(pair, a, 2), atol=1e-12)


def test_one_hot_tables_are_argmax_rows():
    pair, _ = eff.tables("order1-close", SamplingConfig(temperature=0.7), "one_hot")
    assert ((pair.draft == 0) | (pair.draft == 1)).all() and (pair.draft.sum(1) == 1).all()


def test_expected_counts_small_cases_by_hand():
    """Two tokens: the prefill samples y ~ p[b], then exactly one round from y, accepting its first draft with
    probability sum_x min(p[y, x], q[y, x])."""
    pair, oracle = eff.tables("order1-far", SamplingConfig(temperature=1.0), "token")
    e = eff.expected(pair, oracle, 2, [3, 3, 5], 2)
    assert np.isclose(e["mean"][0], 3) and np.isclose(e["cov"][0, 0], 0)
    accept = np.minimum(pair.target, pair.draft).sum(1)
    assert np.isclose(e["mean"][1], 2 * pair.target[3] @ accept + pair.target[5] @ accept)
    one = eff.expected(pair, oracle, 2, [3], 2)
    assert np.isclose(one["cov"][1, 1], one["mean"][1] * (1 - one["mean"][1]))


def test_expectation_agrees_with_the_reference_decoder():
    """The dynamic programme (prefill=False) against specdec_ref's own decode loop on the same checkpoints."""
    from specdec_ref.backend import reference_backend
    from specdec_ref.contract import Request
    from specdec_ref.exact import exact_pair

    sampling, k, m = SamplingConfig(temperature=0.7), 3, 8
    pair, oracle = eff.tables("order1-close", sampling, "token")
    ep = exact_pair("order1-close")
    target, draft = ep.target.load(torch.float32), ep.draft.load(torch.float32)
    prompts = [[5, a] for a in range(7)] * 20
    results = reference_backend().decode_batch(
        target, draft, [Request(prompt=p, max_new_tokens=m, sampling=sampling, seed=100 + i) for i, p in enumerate(prompts)],
        k=k)
    drafts = sum(1 for r in results for x in r.rounds if x.proposed > 0)
    per_pos = [sum(1 for r in results for x in r.rounds if x.accepted > j) for j in range(k)]
    e = eff.expected(pair, oracle, k, [p[-1] for p in prompts], m, prefill=False)
    sd = np.sqrt(np.diag(e["cov"]))
    assert abs(drafts - e["mean"][0]) < 5 * sd[0]
    for j in range(k):
        assert abs(per_pos[j] - e["mean"][1 + j]) < 5 * sd[1 + j], (j, per_pos[j], e["mean"][1 + j], sd[1 + j])
    out = eff.compare({"drafts": drafts, "draft_tokens": k * drafts, "accepted": sum(per_pos), "accepted_per_pos": per_pos},
                      {"mean": e["mean"], "cov": e["cov"]}, k=k)
    assert out["passed"], out["verdict"]


def test_compare_names_positions_below_the_expectation():
    exp = {"mean": np.array([1000.0, 800, 600, 400]), "cov": np.diag([100.0, 150, 200, 200])}
    good = eff.compare({"drafts": 1000, "draft_tokens": 3000, "accepted": 1800, "accepted_per_pos": [800, 600, 400]},
                       exp, k=3)
    assert good["passed"] and good["verdict"] == "matches the exact expectation"
    bad = eff.compare({"drafts": 1000, "draft_tokens": 3000, "accepted": 300, "accepted_per_pos": [200, 70, 30]}, exp, k=3)
    assert not bad["passed"] and [r["position"] for r in bad["failing"]] == [1, 2, 3]
    assert "position 1: 0.2000 < exact 0.8000" in bad["verdict"]
    syn = eff.compare({"drafts": 1000, "draft_tokens": 3000, "accepted_per_pos": [800, 600, 400]}, None, k=3,
                      rates=[0.8, 0.6, 0.4])
    assert syn["passed"]
    none = eff.compare({"drafts": 0}, exp, k=3)
    assert none["passed"] is False


# ----------------------------------------------------------------------------- expectations and report


def _results(levels):
    return {"configs": {cfg: {"cases": {case: {"level": lvl} for case, lvl in row.items()}} for cfg, row in levels.items()}}


def test_expectation_file_round_trip_and_nondeterminism():
    obs1 = report.expectation_entries(_results({"draft-prob": {"warp": "not_certified", "ties": "engine_error"}}))
    exp = report.merge_expected({}, "unpatched", obs1, version="0.32.0", engine="vllm")
    assert report.check_expected(exp, "unpatched", obs1) == []
    obs2 = report.expectation_entries(_results({"draft-prob": {"warp": "not_certified", "ties": "not_certified"}}))
    assert report.check_expected(exp, "unpatched", obs2) == ["draft-prob / ties: got not_certified, recorded engine_error"]
    exp = report.merge_expected(exp, "unpatched", obs2, version="0.32.0", engine="vllm")
    assert exp["expected"]["unpatched"]["draft-prob"]["ties"] == ["engine_error", "not_certified"]
    assert report.check_expected(exp, "unpatched", obs1) == [] and report.check_expected(exp, "unpatched", obs2) == []
    tool = report.expectation_entries(_results({"draft-prob": {"warp": report.TOOL_ERROR}}))
    assert report.check_expected(exp, "unpatched", tool) == ["draft-prob / warp: our tooling errored"]
    assert report.check_expected(exp, "patch A", obs1) == ["no expectation recorded for patch A"]
    assert report.patch_key("") == "unpatched" and report.patch_key("b, a") == "patch A,B"


def test_every_engine_folder_is_registered_under_its_name_and_nothing_else():
    """An engine is its folder: ``ADAPTERS`` lists exactly the folders with an ``adapter.py`` (no list to keep in step),
    each exporting an ``ADAPTER`` of that name, its stage script beside it and a word in CI's ``ENGINES``. Guards a
    folder the registry misses (its stage would certify nothing) or an adapter named apart from its folder."""
    root = pathlib.Path(adapters.__file__).resolve().parent
    folders = sorted(p.parent.name for p in root.glob("*/adapter.py"))
    assert sorted(adapters.ADAPTERS) == folders and len(folders) >= 5
    ci = (root.parents[1] / ".ci" / "run").read_text()
    engines = re.search(r'^ENGINES="([^"]*)"', ci, re.M).group(1).split()
    assert sorted(e.split(":")[0] for e in engines) == folders
    for name in folders:
        assert adapters.adapter(name).name == name and (root / name / "stage.sh").exists()


def test_recorded_expectations_cover_the_matrix():
    for name in adapters.ADAPTERS:
        ad = adapters.adapter(name)
        path = ad.expected_path()
        assert path.exists(), f"{path} is missing: the {ad.title} stage checks every verdict against it"
        data = json.loads(path.read_text())
        assert data["engine"] == name and data["version"] == ad.version
        assert "unpatched" in data["expected"]
        for key, section in data["expected"].items():
            for cfg in ad.configurations:
                row = section.get(cfg.name)
                # unpatched: every configuration (vLLM's server configurations: with patch A only); a patch: those
                # its stage runs with it (a superset for the older sections, recorded when the whole matrix ran;
                # vLLM's "patch A,C": the proposer heads only)
                runs_matrix = any(c.condition is None for c in ad.cases_for(cfg))  # a cold run: conditions only
                if (key, cfg.name) not in _PATCH_SUBSETS and runs_matrix:
                    assert row is not None, (name, key, cfg.name)
                if row is not None and key not in _CONDITION_SECTIONS.get(name, {}):
                    only = _CASE_SUBSETS.get((name, key, cfg.name))
                    for c in ad.cases_for(cfg):
                        if c.condition is None and (only is None or c.name in only):  # a matrix case: every section
                            assert c.name in row, (name, key, cfg.name, c.name)  # the matrix ran records it
        recorded = {**_CONDITION_SECTIONS.get(name, {}), **_CONDITIONS_BESIDE_MATRIX.get(name, {})}
        for key, conditions in recorded.items():  # the conditions' cases, where the stage runs them
            for cfg in ad.configurations:
                for c in ad.cases_for(cfg):
                    if c.condition in conditions:
                        assert c.name in data["expected"][key].get(cfg.name, {}), (name, key, cfg.name, c.name)


#: (patch key, configuration) pairs a patched section does not record: the stage runs that patch on other configurations
_PATCH_SUBSETS = {(key, cfg) for key, configs in {"patch A": ("control-deep3", "eagle", "medusa", "eagle3",
                                                              "eagle3-one-layer", "mtp", "mtp-llama", "dflash",
                                                              "eagle-prob", "control-processed"),
                                                  "patch A,C": ("control", "control-deep3", "draft-prob", "draft-greedy",
                                                                "block", "ngram", "eagle3-one-layer", "dflash",
                                                                "suffix", "synthetic", "control-processed",
                                                                "draft-prob-processed", "serve-control",
                                                                "serve-draft-prob"),
                                                  "unpatched": ("serve-control", "serve-draft-prob")}.items()
                  for cfg in configs}
#: vLLM's "patch A,C,D,E" (the seed fixes): the stage runs eagle-prob only
_PATCH_SUBSETS |= {("patch A,C,D,E", c.name) for c in adapters.adapter("vllm").configurations if c.name != "eagle-prob"}
#: (engine, section, configuration) rows that record some cases only: vLLM's structured-output step with A,C
_CASE_SUBSETS = {("vllm", "patch A,C", cfg): ("grammar",) for cfg in ("draft-prob", "draft-greedy")}
#: Sections that record serving conditions only (``--conditions``), per engine: section -> the conditions it records
#: for every configuration that runs them (vLLM: all with A, C, F; prefix caching without C on the draft model).
_CONDITION_SECTIONS = {"vllm": {"patch A,C,F": tuple(adapters.adapter("vllm").conditions),
                                "patch A,F": ()}}
#: Conditions recorded in a section that also holds the matrix (llama.cpp, OpenVINO GenAI: unpatched).
_CONDITIONS_BESIDE_MATRIX = {name: {"unpatched": tuple(adapters.adapter(name).conditions)}
                             for name in ("llamacpp", "openvino")}
_PATCH_SUBSETS |= {(key, c.name) for key, keep in (("patch A,C,F", ("control", "draft-prob", "draft-greedy")),
                                                   ("patch A,F", ("draft-prob", "draft-greedy")))
                   for c in adapters.adapter("vllm").configurations if c.name not in keep}


def test_markdown_table_rows():
    results = {"title": "vLLM", "version": "0.32.0", "patch_key": "unpatched", "command": "python -m conformance.engines vllm --out d",
               "wall_s": 12.0, "configs": {"draft-prob": {"cases": {"warp": {
                   "level": "not_certified", "headline": "NOT CERTIFIED: x", "prompt": [2, 6], "settings": "T 1.5",
                   "n": 20000, "power": 0.995, "detects": 0.029, "departure": "position 2: chi-square 90 on 7 df"}},
                   "efficiency": {"scheme": "token", "drafts": 10, "expected_drafts": 11.0, "acceptance_per_token": 0.1,
                                  "expected_acceptance_per_token": 0.8, "verdict": "FAILS efficiency: ...",
                                  "positions": [{"position": 1, "observed": 0.1, "expected": 0.9, "z": -40.0}]}}}}
    md = report.markdown(results)
    assert "| draft-prob | warp | [2, 6] | T 1.5 | 20000 | 0.995 / 0.029 | NOT CERTIFIED: x | position 2: chi-square 90 on 7 df | 0.100 / 0.800 |" in md
    assert "1: 0.1000 / 0.9000 (-40.0)" in md


def test_replay_script_is_standalone():
    """The replay is vllm/replay_script.py with its SETTINGS filled in: standalone, applying exactly the patches of
    the run it replays."""
    import ast

    src = vllm.replay_script(title="t", command="c", target="/t", spec=None, prompt=(6,), params={"max_tokens": 3},
                             n=10, length=1, eos=7, law={"4": 1.0}, critical=30.0, patch="A,C")
    tree = compile(src, "replay.py", "exec", ast.PyCF_ONLY_AST)
    assert "conformance" not in src and "specdec_ref" not in src and "_expand_kernel_impl" in src
    settings = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", None) == "SETTINGS")
    assert settings["patches"] == ["A"] and settings["law"] == {"4": 1.0} and settings["prompt"] == [6]
    unpatched = vllm.replay_script(title="t", command="c", target="/t", spec=None, prompt=(6,), params={}, n=1,
                                   length=1, eos=None, law={}, critical=1.0, patch="")
    assert "'patches': []" in unpatched


def test_missing_vllm_names_the_env_script(monkeypatch, tmp_path):
    monkeypatch.setattr(adapters.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(adapters, "REPO", tmp_path)
    with pytest.raises(adapters.EngineMissingError, match="scripts/env.sh vllm"):
        vllm.find_python()
    assert runner.main(["vllm", "--out", str(tmp_path / "o")]) == 2


def test_an_unstated_tie_rule_leaves_out_every_case_whose_law_depends_on_it():
    """Computed from the tables, not marked by hand: ``warp`` depends on it through a top-p over the kept set."""
    from dataclasses import replace as dc_replace

    dependent = {c.name for c in matrix.CASES if matrix.law_depends_on_tie_rule(c)}
    assert dependent == {"warp-1tok", "warp", "ties", "position-1tok", "position"}
    ad = dc_replace(vllm.ADAPTER, conventions=adapters.Conventions(top_k_ties="unstated"))
    features = {"logit-bias", "min-tokens", "frequency", "logprobs", "n-samples", "stop-strings", "stop-stream",
                "grammar", "bad-words"}
    assert {c.name for c in ad.all_cases()} == ({c.name for c in matrix.CASES} | features) - dependent
    assert len(vllm.ADAPTER.all_cases()) == len(matrix.CASES) + len(features)  # and the request features


def test_export_runs_in_the_engines_own_interpreter(monkeypatch, capsys):
    """``python -m conformance.engines export ENGINE`` runs the adapter's export where the engine is installed: in
    this interpreter when it is the adapter's, else again in the adapter's (a venv whose python links to this binary
    is another interpreter all the same)."""
    import subprocess
    import sys

    from conformance.engines import export
    from specdec_fixtures.engines import FAKE

    assert export.main(["specdec_fixtures.engines:FAKE"]) == 0 and "nothing to write" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(type(FAKE), "python", lambda self: "/some/venv/bin/python")
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert export.main(["specdec_fixtures.engines:FAKE", "--no-check"]) == 0
    assert calls == [["/some/venv/bin/python", "-m", "conformance.engines", "export", "specdec_fixtures.engines:FAKE", "--no-check"]]
    assert sys.executable != "/some/venv/bin/python"


def test_a_condition_cases_rounds_name_drafts_the_engine_did_not_make(tmp_path):
    """Serving conditions' rounds check (rounds.case_rounds): an engine whose per-request rounds follow the draft
    model's argmax from the text passes; one that reports a round of three rejected drafts where the completion goes
    on exactly as the draft model's argmax (vLLM's zeroed drafts at the context edge) is named, request and round."""
    from conformance.engines.conditions import condition
    from conformance.engines.rounds import argmax_drafts, case_rounds, proposal_law

    ad = adapters.adapter("vllm")
    cfg, case = ad.config("draft-greedy"), condition("context-edge").cases[0]
    law = proposal_law("draft", ad.families[case.family])
    prompt = list(case.prompt)
    first = [3]  # the prefill's token; then two rounds whose drafts are all accepted, and the bonus token; the second
    drafts1, _ = argmax_drafts(law, prompt + first, 3)  # drafts 2 (vLLM near max_model_len: 128 - 125 - 1 tokens)
    drafts2, _ = argmax_drafts(law, prompt + first + list(drafts1) + [1], 2)
    completion = first + list(drafts1) + [1] + list(drafts2)
    honest = {"prompt_ids": prompt, "completion_ids": completion, "seed": 1, "rounds": [[3, 3], [2, 2]]}
    zeroed = {**honest, "seed": 2, "rounds": [[3, 3], [2, 0], [1, 0]]}

    def check(records):
        (tmp_path / "case.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return case_rounds(ad, cfg, case, {"status": "ok", "dir": str(tmp_path), "file": "case.jsonl"})

    assert check([honest])["passed"] is True, check([honest])["text"]
    bad = check([honest, zeroed])
    assert bad["passed"] is False and "request 1 (seed 2)" in bad["text"] and "round 2" in bad["text"], bad["text"]
    assert case_rounds(ad, ad.config("draft-prob"), case, {"status": "ok"}) is None  # sampled drafts: no argmax law


def test_evidence_on_a_knob_the_engine_lacks_is_not_applicable_but_never_enough():
    """An unpaged engine (llama.cpp) has no KV block size: under prefix caching the block-size predicate is stated as
    not applicable and the cache hits decide; under the block-boundary condition nothing is left to show it reached."""
    from conformance.engines.conditions import condition, evidence_check

    absent = {"block_size": "not paged"}
    pc = condition("prefix-cache")
    ok, text = evidence_check(pc, pc.cases[0], {"prefix_cache_hits": 5}, absent=absent)
    assert ok and text == "prefix_cache_hits 5 > 0; block_size: not applicable (not paged)"
    assert evidence_check(pc, pc.cases[0], {"prefix_cache_hits": 0}, absent=absent)[0] is False
    bb = condition("block-boundary")
    ok, text = evidence_check(bb, bb.cases[0], {}, absent=absent)
    assert not ok and text.endswith("no evidence left that the engine can report: not shown reached")


def test_a_cold_run_of_a_condition_turns_the_cache_off_and_must_show_no_hit():
    """A configuration's ``condition_settings`` change the condition as it runs it: prefix caching off turns the
    evidence ``prefix_cache_hits > 0`` into ``== 0`` (a cold run that hit the cache is not cold); other predicates
    stay; an unknown knob is refused; per-seed identity targets are certified first and a circle is refused."""
    from dataclasses import replace

    from conformance.engines.conditions import condition, evidence_check, under

    pc = condition("prefix-cache")
    cold = under(pc, {"prefix_caching": False})
    assert cold.settings["prefix_caching"] is False and cold.settings["block_size"] == 32
    assert cold.evidence == (("prefix_cache_hits", "==", 0), ("block_size", "==", "block_size"))
    assert evidence_check(cold, cold.cases[0], {"prefix_cache_hits": 0, "block_size": 32})[0] is True
    ok, text = evidence_check(cold, cold.cases[0], {"prefix_cache_hits": 96, "block_size": 32})
    assert not ok and "prefix_cache_hits 96 == 0 FAILS" in text
    assert under(pc, {}) is pc
    with pytest.raises(ValueError, match="unknown knobs"):
        under(pc, {"cache": False})

    from specdec_fixtures.engines import FAKE_CONDITIONS

    assert runner.identity_order(FAKE_CONDITIONS, ["rare-corrupt", "control", "control-cold"]) == [
        "control-cold", "rare-corrupt", "control"]
    circle = replace(FAKE_CONDITIONS, configurations=(
        matrix.Configuration("a", None, identical_to="b"), matrix.Configuration("b", None, condition_identical_to="a")))
    with pytest.raises(ValueError, match="circle"):
        runner.identity_order(circle, ["a", "b"])


def test_llamacpp_maps_only_the_knobs_it_can_show():
    """llama-server takes prefix caching and the context per slot; a token budget (no chunking it reports) and a KV
    pool (it never preempts) make the condition a load error naming the knob."""
    from conformance.engines.conditions import condition
    from conformance.engines.llamacpp.adapter import condition_settings

    assert condition_settings(condition("prefix-cache")) == {"prefix_caching": True, "max_model_len": 128}
    with pytest.raises(NotImplementedError, match="token_budget"):
        condition_settings(condition("chunked-prefill"))
    with pytest.raises(NotImplementedError, match="kv_blocks"):
        condition_settings(condition("preemption"))


def test_a_configuration_states_which_logprobs_it_returns():
    """vLLM's ``logprobs_mode`` is an engine setting: the processed configurations are judged against the law sampled
    from, the others against the raw distribution (its default); the option never reaches ``speculative_config``."""
    ad = vllm.ADAPTER
    assert ad.logprobs_of(ad.config("control")) == "raw" and ad.logprobs_of(ad.config("draft-prob")) == "raw"
    assert ad.logprobs_of(ad.config("control-processed")) == "processed"
    spec = vllm.speculative_config(ad.config("draft-prob-processed"), "/draft")
    assert "logprobs_mode" not in spec and spec["draft_sample_method"] == "probabilistic"
    # it repeats draft-prob's set-up with one setting that cannot touch acceptance: no second efficiency set
    assert runner.families_of(ad, "draft-prob-processed") == ["order2"]
    assert runner.families_of(ad, "draft-prob")[0] == "order1"


def test_a_request_asking_for_n_completions_that_gets_fewer_is_named():
    """An engine that answers an n = 4 request with one completion: the worker's lines raise with the counts (the worker
    records it as the batch's engine error), never a silent shorter file."""
    from conformance.engines.adapter import Request
    from conformance.engines.worker import request_lines

    req = Request("n-samples", (6, 0), matrix.case("n-samples").sampling, 3, True, 7, 1_400_000, None, 4)
    lines = request_lines(req, {"samples": [{"completion_ids": [1, 7], "index": j} for j in range(4)]})
    assert [x["index"] for x in lines] == [0, 1, 2, 3] and all(x["seed"] == 1_400_000 for x in lines)
    with pytest.raises(RuntimeError, match="asking for n=4 completions got 1"):
        request_lines(req, {"samples": [{"completion_ids": [1, 7]}]})
    with pytest.raises(RuntimeError, match="got none"):
        request_lines(req, {"completion_ids": [1, 7]})


def test_identity_with_n_completions_per_request_compares_each_completion_by_its_index(tmp_path):
    """Bug class: a speculative configuration that keeps the first of a request's n completions identical to the plain
    sampler and draws the others from a shared stream; the check must compare every (seed, index), not the seed."""
    from conformance.engines.matrix import case as matrix_case
    from conformance.engines.seeds import identity_check

    def state(name, flip=None):
        lines = [{"seed": s, "index": j, "completion_ids": [j, s % 5, 1]} for s in (10, 14) for j in range(4)]
        if flip is not None:
            lines[flip]["completion_ids"] = [9, 9, 9]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return {"cases": {"n-samples": {"status": "ok", "dir": str(tmp_path), "file": f"{name}.jsonl"}}}

    c = matrix_case("n-samples")
    ok = identity_check(c, state("a"), state("b"), "control-np4")
    assert ok.passed and ok.text == "identical to control-np4 on all 8 completions"
    bad = identity_check(c, state("c", flip=6), state("d"), "control-np4")
    assert not bad.passed and bad.text.startswith("differs from control-np4 at request seed 14 completion 2, position 1")
    assert "(1 of 8 completions differ)" in bad.text
