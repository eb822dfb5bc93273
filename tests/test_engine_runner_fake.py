"""The shared engine runner end to end on a fake engine (specdec_fixtures.engines): every outcome an engine can cause is named.

The fake engine samples each case's exact law with the request's seed, so its correct configurations must be
CERTIFIED and identical per seed; each broken configuration is a bug class the runner must name (a silent
fall-back to no speculation, a wrong law with a per-seed identity claim, a crash, a hang, a refusal).
"""
from __future__ import annotations

import json

import pytest

from conformance.engines import runner

#: one xdist worker runs the module: the fake run is a module fixture, shared by its tests
pytestmark = pytest.mark.xdist_group("fake_engine")
SCALE = "0.05"  # 1 000 completions per sampling case: CERTIFIED AT REDUCED POWER or INCONCLUSIVE, never rejected


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake")
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(out), "--scale", SCALE,
                      "--configs", "control,spec,spec-few,silent,biased,crash,refuse,global-rng"])
    return rc, json.loads((out / "verdicts.json").read_text()), out


def _levels(results, cfg):
    return {name: c["level"] for name, c in results["configs"][cfg]["cases"].items()}


def test_an_exact_engine_is_certified_and_identical_per_seed(fake_run):
    rc, results, out = fake_run
    assert rc == 0
    for cfg in ("control", "spec"):
        assert set(_levels(results, cfg).values()) <= {"certified", "reduced"}, _levels(results, cfg)
    spec = results["configs"]["spec"]["cases"]
    for name, c in spec.items():
        if name != "temperature":  # unseeded: no per-seed identity to check
            assert c["identity"]["passed"] is True, (name, c["identity"])
    assert "identity" not in spec["temperature"]
    assert spec["warp"]["speculation"]["passed"] is True
    few = results["configs"]["spec-few"]["cases"]["warp"]  # scale 0.2: the first fifth of the seeds, compared per seed
    # its planned looks: 200 requests (0.05 x 0.2 of 20 000), the full look on 1.07 x that (its early looks have no
    # futility bound at so few): the first 214 seeds, compared per seed
    assert few["n"] == few["looks"]["full_n"] == 214
    assert few["identity"]["passed"] is True and few["identity"]["compared"] == 214
    assert "| spec | warp |" in (out / "verdicts.md").read_text()


def test_a_configuration_that_drafts_nothing_is_not_speculating(fake_run):
    _, results, out = fake_run
    levels = _levels(results, "silent")
    assert set(levels.values()) == {"not_speculating"}, levels
    c = results["configs"]["silent"]["cases"]["warp"]
    assert c["headline"].startswith("NOT SPECULATING: 0 draft tokens") and c["law_level"] in ("certified", "reduced")
    assert c["replay_command"] and "--configs silent --cases warp" in c["replay_command"]
    assert "silent / warp, speculation: 0 draft tokens" in (out / "verdicts.md").read_text()


def test_a_wrong_law_fails_the_law_and_the_per_seed_identity(fake_run):
    _, results, _ = fake_run
    warp = results["configs"]["biased"]["cases"]["warp"]
    assert warp["level"] == "not_certified" and warp["departure"], warp["headline"]
    assert warp["identity"]["passed"] is False and "differs from control at request seed" in warp["identity"]["text"]
    from conformance.engines.report import expectation_entries

    assert expectation_entries(results)["biased"]["identity:warp"] == "fail"


def test_seeds_that_do_not_fix_the_output_are_named(fake_run):
    """The per-request seed probe: an exact engine's seeded requests give the same completions in another batch (no
    entry in the expectations); one whose seeded requests also draw from its global generator keeps the exact law and
    is named, with the first seed and position that differ."""
    _, results, out = fake_run
    assert results["configs"]["spec"]["cases"]["warp"]["seeds"]["passed"] is True
    assert "seeds" not in results["configs"]["spec"]["cases"]["temperature"]  # unseeded: nothing to probe
    c = results["configs"]["global-rng"]["cases"]["warp"]
    assert c["level"] in ("certified", "reduced") and c["seeds"]["passed"] is False
    assert c["seeds"]["text"].startswith("SEEDS NOT HONOURED: ") and "first: seed" in c["seeds"]["text"]
    from conformance.engines.report import expectation_entries

    entries = expectation_entries(results)
    assert entries["global-rng"]["seeds:warp"] == "fail" and "seeds:warp" not in entries["spec"]
    assert "global-rng / warp, seeds: SEEDS NOT HONOURED" in (out / "verdicts.md").read_text()


def test_the_seed_probe_batch_reverses_the_first_seeded_requests_beside_unseeded_ones():
    from conformance.engines.adapter import Request
    from conformance.engines.seeds import PROBE_FILLERS, PROBE_N, compare, probe_requests
    from specdec_ref.warp import SamplingConfig

    s = SamplingConfig(temperature=1.0)
    items = [Request("a" if i % 2 else "b", (1,), s, 3, False, 7, None if i % 5 == 0 else 100 + i) for i in range(200)]
    batch, picked = probe_requests(items)
    assert len(picked) == 2 * PROBE_N and picked == sorted(picked, reverse=True)
    assert [r.seed for r in batch[: len(picked)]] == [items[i].seed for i in picked]
    assert len(batch) == len(picked) + PROBE_FILLERS and all(r.seed is None for r in batch[len(picked):])
    outs = [{"completion_ids": [i, i]} for i in range(len(items))]
    again = [{"completion_ids": [i, i]} for i in picked]
    assert compare("a", items, outs, again, picked) == {"compared": PROBE_N, "differing": 0}
    again[0] = {"completion_ids": [picked[0], -1]}
    record = compare(items[picked[0]].case, items, outs, again, picked)
    assert record["differing"] == 1 and record["first"]["position"] == 2 and record["first"]["seed"] == items[picked[0]].seed


def test_crashes_and_refusals_are_named(fake_run):
    _, results, _ = fake_run
    crash = results["configs"]["crash"]["cases"]["temperature"]
    assert crash["level"] == "engine_error" and "segfault-like" in crash["headline"]
    # the efficiency set crashed first (the case was not run), then the case was rerun alone before it was named
    assert crash["engine"]["first_call"]["status"] == "not_run"
    assert "segfault-like" in results["configs"]["crash"]["efficiency"]["verdict"]
    refuse = _levels(results, "refuse")
    assert refuse["min-p"] == "refused" and refuse["warp"] in ("certified", "reduced")


def test_a_hang_is_a_timeout_and_the_worker_group_is_killed(tmp_path):
    import time

    t0 = time.time()
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path), "--configs", "hang", "--timeout", "4",
                      "--scale", SCALE])
    results = json.loads((tmp_path / "verdicts.json").read_text())
    c = results["configs"]["hang"]["cases"]["temperature"]
    assert rc == 0 and c["level"] == "timeout" and "timed out after 4s" in c["headline"]
    assert time.time() - t0 < 60


def test_a_hang_under_a_relative_out_folder_is_a_timeout_too(tmp_path, monkeypatch):
    """Bug class: the harness crashing on an engine's failure (the worker's log path joined twice under a relative
    --out; the workers run in the repository, so a relative folder is the caller's)."""
    monkeypatch.chdir(tmp_path)
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", "rel", "--configs", "hang", "--timeout", "4", "--scale", SCALE])
    c = json.loads((tmp_path / "rel" / "verdicts.json").read_text())["configs"]["hang"]["cases"]["temperature"]
    assert rc == 0 and c["level"] == "timeout" and "timed out after 4s" in c["headline"]


def test_check_expected_without_a_file_fails_and_unknown_engines_exit_2(tmp_path, capsys):
    assert runner.main(["no-such-engine", "--out", str(tmp_path)]) == 2
    assert "unknown engine" in capsys.readouterr().err


def test_an_undeclared_tie_rule_fails_with_the_line_naming_the_rule_it_fits(tmp_path):
    """The engine keeps exactly k through a top-k tie (lowest ids) while its adapter declares keep-all: NOT
    CERTIFIED on the ties case, with the explanation; the same engine declaring its rule is CERTIFIED there."""
    assert runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path / "a"), "--configs", "exactly-k"]) == 0
    ties = json.loads((tmp_path / "a" / "verdicts.json").read_text())["configs"]["exactly-k"]["cases"]["ties"]
    assert ties["level"] == "not_certified", ties["headline"]
    assert "fits --top-k-ties lowest-ids" in ties["explained"] and "where top-k cuts a tie" in ties["explained"]
    assert "ties, explained: departs only where top-k cuts a tie" in (tmp_path / "a" / "verdicts.md").read_text()
    assert runner.main(["specdec_fixtures.engines:FAKE_LOWEST_IDS", "--out", str(tmp_path / "b")]) == 0
    declared = json.loads((tmp_path / "b" / "verdicts.json").read_text())
    assert declared["conventions"]["top_k_ties"] == "lowest_ids"
    assert declared["configs"]["control"]["cases"]["ties"]["level"] == "certified"


def test_one_table_across_runs_names_every_finding(fake_run, tmp_path, capsys):
    from conformance.engines import table

    _, _, out = fake_run
    assert table.main([str(out), "--markdown", str(tmp_path / "t.md"), "--unavailable", "SGLang=CUDA only"]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "| Fake engine | 1.0 | unpatched | control | - | " in text and "certified at N >= 1000" not in text
    assert "| Fake engine | 1.0 | unpatched | silent | - | 6 not speculating |" in text
    assert "| SGLang | - | - | - | - | cannot run here: CUDA only | - |" in text
    assert "biased / warp: NOT CERTIFIED" in text and "differs from control at request seed" in text
    assert table.main([str(out), str(tmp_path / "no-run")]) == 1  # a stage that wrote nothing is named
    assert "Missing runs" in capsys.readouterr().out


def test_parallel_workers_give_the_same_verdicts(fake_run, tmp_path):
    """``--jobs 2`` runs the workers two at a time, longest first: every verdict, N, identity and efficiency line is
    the one the sequential run gave (the workers share nothing but the machine), and the crash is still named."""
    _, sequential, _ = fake_run
    configs = ["control", "spec", "crash"]
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path), "--scale", SCALE, "--jobs", "2",
                      "--configs", ",".join(configs)])
    parallel = json.loads((tmp_path / "verdicts.json").read_text())
    assert rc == 0 and list(parallel["configs"]) == configs

    def summary(results, cfg):
        entry = results["configs"][cfg]
        return ({n: (c["level"], c["n"], (c.get("identity") or {}).get("passed")) for n, c in entry["cases"].items()},
                (entry.get("efficiency") or {}).get("verdict"))

    for cfg in configs:
        assert summary(parallel, cfg) == summary(sequential, cfg), cfg


def test_argmax_draft_rounds_are_rebuilt_from_the_completions_and_a_misaligned_drafter_is_named(tmp_path):
    """Any adapter whose configuration declares its argmax proposer gets the rounds check: the engine's counters and
    each request's rounds against the rounds rebuilt from the efficiency set's completions. The fake vLLM-like EAGLE
    engine passes it exactly; the one whose drafter reads the feature one position early keeps the exact law of its
    completions (CERTIFIED) and is named at its first differing request and round."""
    from conformance.engines.report import expectation_entries

    assert runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path), "--scale", SCALE,
                        "--configs", "eagle,eagle-early"]) == 0
    results = json.loads((tmp_path / "verdicts.json").read_text())
    good, early = results["configs"]["eagle"], results["configs"]["eagle-early"]
    assert good["rounds"]["passed"] is True and good["rounds"]["per_request"], good["rounds"]["text"]
    assert good["efficiency"]["passed"] is True and "given the rounds' texts" in good["efficiency"]["verdict"]
    assert early["cases"]["warp"]["level"] in ("certified", "reduced")
    assert early["rounds"]["passed"] is False and "request 0 (seed 5000000)" in early["rounds"]["text"]
    assert expectation_entries(results)["eagle-early"]["rounds"] == "fail"
    assert "| eagle-early | exact-eagle | FAIL: DIFFERS" in (tmp_path / "verdicts.md").read_text()


def test_every_case_states_its_looks_and_a_rejected_case_stops_at_its_deciding_look(fake_run):
    """Waves: a case's record states the completions the verdict read, the looks and the procedure's power; the
    biased engine's case stops at the look that rejects it (nothing generated past it); and the verdict is the one
    the black-box tool gives the case's file at the same looks."""
    from conformance.engines.matrix import case
    from conformance.engines.waves import case_looks
    from conformance.samples import certify_samples

    _, results, _ = fake_run
    warp = results["configs"]["biased"]["cases"]["warp"]
    assert warp["level"] == "not_certified" and warp["looks"]["outcome"] == "reject", warp["looks"]
    assert warp["n"] == warp["looks"]["n_used"] == warp["generated"] < warp["looks"]["full_n"]
    for cfg in ("control", "spec"):
        for name, c in results["configs"][cfg]["cases"].items():
            assert c["looks"]["decided"] and c["looks"]["taken"] and c["looks"]["family_alpha"], (cfg, name)
            assert c["n"] == c["looks"]["n_used"] <= c["generated"], (cfg, name)
            assert (c.get("power") is None) == name.startswith("greedy"), (cfg, name)  # greedy: every completion checked
    # decided cases keep mixing into the later waves (written after the lines their verdict read)
    assert any(c["generated"] > c["n"] for c in results["configs"]["control"]["cases"].values())
    c = results["configs"]["control"]["cases"]["warp"]
    v = certify_samples(c["file"], model="order1-target", sampling=case("warp").sampling, max_new_tokens=3, eos_id=True,
                        looks=case_looks(case("warp"), float(SCALE)))
    assert (v.level, v.n, v.headline) == (c["level"], c["n"], c["headline"])


def test_after_a_crash_each_case_runs_alone_to_its_decision(tmp_path):
    """An engine that crashes on batches holding a top-k request: the first wave's batch crashes, the rerun takes
    one case at a time to its decision (the case without top-k first), so that case is judged on its whole planned
    looks, not left a partial sample, and only the top-k case is an engine error."""
    rc = runner.main(["specdec_fixtures.engines:FAKE", "--out", str(tmp_path), "--scale", SCALE, "--configs", "crash-top-k"])
    cases = json.loads((tmp_path / "verdicts.json").read_text())["configs"]["crash-top-k"]["cases"]
    assert rc == 0
    assert cases["warp"]["level"] == "engine_error" and cases["warp"]["engine"]["first_call"]["status"] == "engine_error"
    temperature = cases["temperature"]
    assert temperature["level"] in ("certified", "reduced") and temperature["looks"]["decided"], temperature["headline"]


def test_one_case_per_batch_from_the_start_gives_the_reruns_verdicts_with_one_worker(tmp_path):
    """``--one-case-per-batch`` (an engine whose mixed batches are known to crash): a speculative configuration's
    worker runs the rerun's way from the start, so its verdicts are the crash rerun's (the case without top-k judged
    to its decision, the top-k case an engine error: as test_after_a_crash_each_case_runs_alone_to_its_decision) and
    no second worker starts; an engine that dies before its first case (in the efficiency set: ``crash``) has its
    cases rerun, so its crash is still a case's."""
    assert runner.main(["specdec_fixtures.engines:FAKE", "--scale", SCALE, "--configs", "crash-top-k-spec,crash", "--out",
                        str(tmp_path), "--one-case-per-batch"]) == 0
    got = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    split = got["crash-top-k-spec"]["cases"]
    assert split["warp"]["level"] == "engine_error" and "first_call" not in split["warp"]["engine"]
    assert split["temperature"]["level"] in ("certified", "reduced") and split["temperature"]["looks"]["decided"]
    crash = got["crash"]["cases"]["temperature"]
    assert crash["level"] == "engine_error" and crash["engine"]["first_call"]["status"] == "not_run"
    raw = tmp_path / "raw" / "crash-top-k-spec"
    assert list(raw.rglob("worker-first.json")) == [] and all(json.loads(p.read_text())["split"]
                                                             for p in raw.rglob("worker.json"))


def test_an_engine_that_drops_logit_bias_while_speculating_is_not_certified_naming_the_setting(tmp_path):
    """The request-feature case ``logit-bias``: the control applies the bias and is certified; the speculative
    configuration accepts it and drops it, and its verdict names the setting (not a bare chi-square), in the
    record and in the verdict table."""
    assert runner.main(["specdec_fixtures.engines:FAKE_FEATURES", "--out", str(tmp_path), "--scale", "0.25",
                        "--cases", "logit-bias"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    control, dropped = configs["control"]["cases"]["logit-bias"], configs["ignores-bias"]["cases"]["logit-bias"]
    assert control["level"] in ("certified", "reduced") and not control.get("explained"), control["headline"]
    assert "bias 2:+1 5:-1" in control["settings"]
    assert dropped["level"] == "not_certified", dropped["headline"]
    assert dropped["explained"].startswith("logit_bias has no effect: the file fits the law without it"), dropped
    assert "--logit-bias 2:1,5:-1" in dropped["replay"]
    assert "logit-bias, explained: logit_bias has no effect" in (tmp_path / "verdicts.md").read_text()


def test_logprobs_left_unset_while_speculating_are_not_certified_with_their_positions(tmp_path):
    """The request-feature case ``logprobs``: the control returns the exact log-probabilities (and the prompt's) and is
    certified with the check's count; a configuration whose drafted tokens come back with probability 1 (llama-server's
    speculative path) is NOT CERTIFIED although its law holds, the headline naming what and where, with a rerun command."""
    assert runner.main(["specdec_fixtures.engines:FAKE_FEATURES", "--out", str(tmp_path), "--scale", "0.1",
                        "--cases", "logprobs"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, unset = configs["control"]["cases"]["logprobs"], configs["logprobs-unset"]["cases"]["logprobs"]
    assert ok["level"] in ("certified", "reduced") and ok["logprobs"]["passed"] is True, ok["headline"]
    assert ok["logprobs"]["prompt_tokens"] == 2 * ok["generated"] and "logprobs top-3" in ok["settings"]
    assert unset["level"] == "not_certified" and unset["law_level"] in ("certified", "reduced", "inconclusive"), unset
    assert unset["headline"].startswith("NOT CERTIFIED: logprobs wrong on ")
    assert "(positions 2, 3, 4; right at 1): log-probability 0 (probability 1) returned" in unset["headline"]
    assert "--configs logprobs-unset --cases logprobs" in unset["replay_command"]
    assert "logprobs-unset / logprobs, logprobs: logprobs wrong" in (tmp_path / "verdicts.md").read_text()


def test_n_completions_per_request_are_lines_with_their_index_and_copies_are_named(tmp_path):
    """The request-feature case ``n-samples`` (n = 4 per request): each completion is a line with its request's seed
    and its ``index``; a control whose completions are independent is certified, one that returns n copies of a
    request's first completion is NOT CERTIFIED with the copies named (vLLM #4934's class: n > 1 sharing randomness)."""
    assert runner.main(["specdec_fixtures.engines:FAKE_FEATURES", "--out", str(tmp_path), "--scale", "0.25",
                        "--cases", "n-samples"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, copies = configs["control"]["cases"]["n-samples"], configs["n-copies"]["cases"]["n-samples"]
    assert ok["level"] in ("certified", "reduced") and "n 4 per request" in ok["settings"], ok["headline"]
    assert ok["samples"]["copies_explain"] is False and ok["samples"]["identical"] < 20
    lines = [json.loads(x) for x in (tmp_path / "raw" / "control" / "order2" / "n-samples.jsonl").read_text().splitlines()]
    assert [(x["seed"], x["index"]) for x in lines[:5]] == [(1_400_000, 0), (1_400_000, 1), (1_400_000, 2),
                                                             (1_400_000, 3), (1_400_004, 0)]
    assert copies["level"] == "not_certified", copies["headline"]
    assert copies["explained"].startswith("a request's 4 completions are copies of one another: all 4 completions "
                                          "the same in ")
    # a refusal at submission is asked with the request as its batch sends it (n 4 here): REFUSED, its reason kept
    refused = configs["refuses-n"]["cases"]["n-samples"]
    assert refused["level"] == "refused" and "parallel sampling" in refused["headline"], refused["headline"]


def test_a_serving_condition_not_reached_is_a_failure_with_its_evidence(tmp_path):
    """A condition's cases run in their own engine load with its knobs; the evidence the engine reports decides
    whether it was reached: 0 preemptions under the preemption condition is NOT REACHED (a failure, the law's own level
    kept beside it), never a pass."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--scale", "0.05",
                        "--conditions", "all"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, unreached = configs["control"]["cases"]["preemption.60-62"], configs["no-pressure"]["cases"]["preemption.60-62"]
    law = ("certified", "reduced", "inconclusive")  # 321 completions: the law's level is not what this test is about
    assert ok["level"] in law and ok["condition"]["passed"] is True, ok["headline"]
    assert ok["condition"]["text"] == f"preemptions {ok['condition']['evidence']['preemptions']} > 0"
    assert unreached["level"] == "not_reached" and unreached["law_level"] in law, unreached
    assert unreached["headline"].startswith("NOT REACHED: preemption: preemptions 0 > 0 FAILS")
    assert "--configs no-pressure --cases preemption.60-62" in unreached["replay_command"]
    block = configs["control"]["cases"]["block-boundary.29-32"]
    assert block["condition"]["text"] == "block_size 32 == 32" and "4 prompts of 29-32 tokens" in block["settings"]
    assert (tmp_path / "raw" / "control" / "order2@preemption" / "preemption.60-62.jsonl").exists()
    assert "no-pressure / preemption.60-62, condition: preemptions 0 > 0 FAILS" in (tmp_path / "verdicts.md").read_text()
    from conformance.engines.report import expectation_entries

    assert expectation_entries({"configs": configs})["no-pressure"]["preemption.60-62"] == "not_reached"


def test_a_context_shift_is_judged_past_the_checkpoint_s_positions_and_a_stale_cell_after_it_is_rejected(tmp_path):
    """Bug class: after a context shift the engine reads a moved cell one off (its next token follows the wrong
    context). The case generates past the checkpoints' 128 positions: the law is the order-1 table at any length
    (``order1-target+shift``), so every token, the ones after the shift included, is judged; the evidence is the
    engine's count of shifts."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--conditions", "context-shift",
                        "--configs", "control,stale-shift"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, stale = configs["control"]["cases"]["context-shift.116-120"], configs["stale-shift"]["cases"]["context-shift.116-120"]
    assert ok["level"] in ("certified", "reduced") and ok["condition"]["passed"], ok["headline"]
    assert ok["model"] == "order1-target+shift"
    assert stale["level"] == "not_certified", stale["headline"]


@pytest.mark.parametrize("case, planted, at_least", [("grammar", "grammar-block-start", 100),
                                                     ("bad-words", "bad-words-stale", 10)])
def test_a_constraint_read_off_the_state_a_block_began_in_gives_impossible_completions(tmp_path, case, planted, at_least):
    """Bug class: drafts checked against the grammar state, or the bad words, as they stood before the block (vLLM
    #34241's class): a token the constraint forbids is an impossible event, so the case is rejected at the first look."""
    assert runner.main(["specdec_fixtures.engines:FAKE_FEATURES", "--out", str(tmp_path), "--scale", "0.25",
                        "--cases", case, "--configs", f"control,{planted}"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, bad = configs["control"]["cases"][case], configs[planted]["cases"][case]
    assert ok["level"] in ("certified", "reduced"), ok["headline"]
    assert bad["level"] == "not_certified" and bad["impossible"]["completions"] >= at_least, bad["headline"]
    assert bad["looks"]["look"] == "interim"  # impossible tokens need no power
    # every one is a token the declared rule forbids, and the verdict says so
    rule = {"grammar": "grammar", "bad-words": "bad words"}[case]
    assert bad["impossible"]["forbidden_by"] == {rule: bad["impossible"]["completions"]}, bad["impossible"]
    assert f"of them a token the {rule} forbid" in bad["headline"], bad["headline"]


@pytest.mark.parametrize("condition, case, planted, scale", [
    ("long-prefix-cache", "long-prefix-cache.2049-2051", "stale-block", "0.25"),
    ("long-chunked-prefill", "long-chunked-prefill.516-600", "chunk-local", "1")])
def test_a_long_context_s_marker_lost_or_swapped_under_a_condition_is_rejected(tmp_path, condition, case, planted,
                                                                                scale):
    """Bug classes: a prefix-cache hit restores a block written by another prompt (a block keyed by less than its own
    tokens, a stale block after eviction; SGLang #31600's class on the target's side), and a prefill chunk that does
    not read the KV earlier chunks wrote. The long pair's law reads its marker wherever it stands: the twins of
    ``long-prefix-cache`` differ only in the marker of their last full block, which the planted engine serves from
    whichever twin wrote it first (half the requests read the other marker, TV 0.45 on average); ``chunk-local`` loses
    the markers of the chunks before the last (TV 0.49). NOT CERTIFIED, while the control reaching the same condition
    is certified."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--scale", scale,
                        "--conditions", condition, "--configs", f"control,{planted}"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, stale = configs["control"]["cases"][case], configs[planted]["cases"][case]
    assert ok["level"] in ("certified", "reduced") and ok["condition"]["passed"], ok["headline"]
    assert stale["level"] == "not_certified" and stale["condition"]["passed"], stale["headline"]


def test_distinct_prompts_are_certified_pooled_and_a_slot_keeping_the_previous_prompt_is_rejected(tmp_path):
    """Bug class: state a request leaves behind read by the next one (a slot or cache reused past the common prefix of
    two prompts), which the matrix's one repeated prompt can never show (the state left behind is the right one). The
    condition's 6 000 distinct prompts share prefixes of random lengths and end in two table cells: the control is
    certified with the completions pooled by cell; the planted slot that keeps the previous prompt's cells up to the
    new prompt's last token is NOT CERTIFIED."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--scale", "0.25",
                        "--conditions", "distinct-prompts", "--configs", "control,stale-slot"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok, stale = (configs[c]["cases"]["distinct-prompts.24-99"] for c in ("control", "stale-slot"))
    assert ok["level"] in ("certified", "reduced") and ok["condition"]["passed"], ok["headline"]
    assert "pooled by the table cell they end in: 2 test(s)" in ok["report"] and "--pool-prompts" in ok["replay"]
    assert stale["level"] == "not_certified", stale["headline"]


def test_the_first_turn_fills_two_blocks_and_rejects_a_draft_at_their_last_position():
    """The multi-turn condition's design, checked from the tables: the first turn's prompt and first 5 greedy tokens
    fill 64 positions (two blocks of 32), all computed in that turn (a 6th token follows), and order2-draft's argmax
    drafts, as vLLM and llama.cpp run them (the first token at prefill, up to k = 3 drafts a round), have a draft
    rejected at position 63: its KV was written for the draft, then rewritten. The second turn shares those 64
    tokens and then differs. Each wave sends the second turn after the first (a batch of its own)."""
    from conformance.engines import rounds as R
    from conformance.engines.conditions import TURN1, TURN1_GREEDY, condition, random_prompt
    from conformance.engines.worker import batches
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model
    from specdec_ref.warp import GREEDY

    prompt = random_prompt(*TURN1)
    (greedy,) = continuation_law(exact_model("order2-target"), list(prompt), len(TURN1_GREEDY), GREEDY, eos_id=None)
    assert tuple(greedy) == TURN1_GREEDY and len(prompt) + len(greedy) == 65
    for max_new in (None, len(greedy)):  # vLLM drafts k always, llama.cpp at most the tokens left but one
        rounds = R.reconstruct(R.DraftArgmaxLaw("order2-draft"), prompt, greedy, 3, max_new=max_new)
        assert 63 in [r.start + r.accepted for r in rounds if not r.censored and r.accepted < len(r.drafts)]
    first, second = condition("multi-turn").cases
    assert second.prompt[:64] == (prompt + TURN1_GREEDY)[:64] and second.prompt[64] != TURN1_GREEDY[5]
    assert len(second.prompt) == 65 and second.after == first.name
    assert batches([second, first]) == [[first], [second]] and batches([second]) == [[second]]
    assert batches([second, first], split=True) == [[first], [second]]


def test_a_prefix_cache_corrupting_one_request_in_300_fails_per_seed_against_the_cold_run(tmp_path):
    """Bug class: a prefix-cache hit that serves a wrong block now and then (OpenVINO GenAI 2026.4.1: two requests
    extending a cached partial block in one step). Its effect on the law (TV 0.003 here) is far below any law test's
    reach at these sizes; per seed, against the same engine with prefix caching off (``control-cold``, run first
    whatever the order asked, its evidence inverted: no hit), it is named with the first request that differs."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--scale", "0.25",
                        "--conditions", "distinct-prompts", "--configs", "rare-corrupt,control,control-cold"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    assert list(configs)[0] == "control-cold"
    cold, ok, bad = (configs[c]["cases"]["distinct-prompts.24-99"] for c in ("control-cold", "control", "rare-corrupt"))
    assert cold["condition"]["passed"] and "prefix_cache_hits 0 == 0" in cold["condition"]["text"]
    assert ok["identity"]["passed"] and "identical to control-cold" in ok["identity"]["text"]
    assert bad["level"] in ("certified", "reduced"), bad["headline"]  # the law cannot see it
    assert bad["identity"]["passed"] is False and "differs from control-cold at request seed" in bad["identity"]["text"]
    assert 0 < bad["identity"]["differing"] <= sum(1 for s in range(2_900_000, 2_900_000 + bad["n"]) if s % 300 == 7)


def test_a_next_turn_reading_a_rejected_draft_s_kv_is_rejected(tmp_path):
    """Bug class: a conversation's next turn served from KV written while speculating, where the last position of
    the previous turn still holds a rejected draft's KV (counted computed, or cached with the block). The planted
    engine reads that cell as another token: the second turn is NOT CERTIFIED; the control reaching the same
    condition is certified on both turns."""
    assert runner.main(["specdec_fixtures.engines:FAKE_CONDITIONS", "--out", str(tmp_path), "--scale", "0.25",
                        "--conditions", "multi-turn", "--configs", "control,stale-turn"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    ok = configs["control"]["cases"]
    assert ok["multi-turn.turn1"]["level"] == "certified" and ok["multi-turn.turn2"]["level"] in ("certified", "reduced")
    stale = configs["stale-turn"]["cases"]
    assert stale["multi-turn.turn1"]["level"] == "certified"
    assert stale["multi-turn.turn2"]["level"] == "not_certified", stale["multi-turn.turn2"]["headline"]
