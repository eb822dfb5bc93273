"""The OpenVINO GenAI adapter as data, without OpenVINO: the request mapping, the configurations, the conventions
(the heap top-k on every table row the matrix reaches), the mt19937 streams, and the NumPy model of its sampler:
its plain sampler is the exact law, its speculative sampler departs from it even with a draft identical to the
target, and both give the engine's recorded completions request for request (``tests/data/openvino_recorded.json``,
written by ``engine_tests/test_openvino.py --record``)."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conformance.engines import adapter as adapter_mod
from conformance.engines.openvino import adapter as ovad
from conformance.engines.openvino import model as M
from conformance.engines.adapter import Request
from conformance.engines.matrix import CASES, case
from specdec_ref.exact import exact_model
from specdec_ref.warp import SamplingConfig

RECORDED = Path(__file__).parent / "data" / "openvino_recorded.json"


def _req(name="warp", seed=7, eos=None):
    c = case(name)
    return Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos if eos is None else eos, 7, seed)


def logits_fn(name):
    em, cache = exact_model(name), {}

    def f(ctx):
        key = tuple(ctx)
        if key not in cache:
            cache[key] = em.next_logits([list(ctx)])[0].numpy().astype(np.float32)
        return cache[key]
    return f


# ------------------------------------------------------------------------------------------------ the adapter
def test_registered_and_importing_it_imports_no_openvino():
    assert adapter_mod.ADAPTERS["openvino"] == "conformance.engines.openvino"
    assert adapter_mod.adapter("openvino") is ovad.ADAPTER and ovad.ADAPTER.version == ovad.VERSION == "2026.4.1.0"
    assert "openvino_genai" not in sys.modules and "openvino" not in sys.modules


def test_mapping_sets_every_field_explicitly():
    f = ovad.generation_fields(_req("warp"), ovad.ADAPTER.config("draft-k3-nopc"), seed=7)
    assert (f["do_sample"], f["temperature"], f["top_k"], f["top_p"], f["min_p"]) == (True, 1.5, 4, 0.6, 0.0)
    assert f["max_new_tokens"] == 3 and f["rng_seed"] == 7 and f["num_assistant_tokens"] == 3
    assert f["eos_token_id"] == 7 and f["stop_token_ids"] == {7} and f["ignore_eos"] is False
    assert (f["repetition_penalty"], f["presence_penalty"], f["frequency_penalty"]) == (1.0, 0.0, 0.0)
    assert f["apply_chat_template"] is False and f["num_return_sequences"] == 1 and f["logprobs"] == 0
    assert "max_ngram_size" not in f


def test_mapping_greedy_no_eos_penalties_minp_lookup_control():
    g = ovad.generation_fields(_req("greedy"), ovad.ADAPTER.config("control"), seed=1)
    assert g["do_sample"] is False and "temperature" not in g and "num_assistant_tokens" not in g
    t = ovad.generation_fields(_req("temperature"), ovad.ADAPTER.config("control"), seed=5)
    assert t["ignore_eos"] is True and t["stop_token_ids"] == {7} and t["temperature"] == 0.6 and t["top_k"] == 0
    p = ovad.generation_fields(_req("penalty"), ovad.ADAPTER.config("control"), seed=5)
    assert (p["repetition_penalty"], p["presence_penalty"]) == (1.5, 0.5)
    m = ovad.generation_fields(_req("min-p"), ovad.ADAPTER.config("control"), seed=5)
    assert m["min_p"] == 0.2 and m["top_k"] == 0 and m["top_p"] == 1.0
    lk = ovad.generation_fields(_req("eos"), ovad.ADAPTER.config("prompt-lookup"), seed=5)
    assert lk["num_assistant_tokens"] == 3 and lk["max_ngram_size"] == 2
    with pytest.raises(ValueError, match="GenerationConfig has no logit_bias"):
        ovad.generation_fields(Request("x", (1,), SamplingConfig(temperature=1.0, logit_bias={1: 2.0}), 3, True, 7, 0),
                               ovad.ADAPTER.config("control"), seed=0)
    mt = ovad.generation_fields(_req("min-tokens"), ovad.ADAPTER.config("prompt-lookup"), seed=5)
    assert mt["min_new_tokens"] == 3 and mt["ignore_eos"] is False


def test_unseeded_requests_get_distinct_seeds_of_the_adapter():
    s = ovad.OpenVINOSession.__new__(ovad.OpenVINOSession)
    s.unseeded = 0
    seeds = [s._seed(_req("temperature", seed=None)) for _ in range(3)]
    assert seeds == [ovad.UNSEEDED_BASE + 1, ovad.UNSEEDED_BASE + 2, ovad.UNSEEDED_BASE + 3]
    assert s._seed(_req("warp", seed=12)) == 12
    assert ovad.UNSEEDED_BASE > max(c.seed_base + c.n for c in CASES)


def test_configurations():
    names = [c.name for c in ovad.CONFIGS]
    assert len(set(names)) == len(names)
    known = {c.name for c in CASES} | set(ovad.FEATURES) | set(ovad.TEXT_CASES) | set(ovad.GRAMMAR_CASES) | set(
        ovad.LOGPROB_CASES) | set(ovad.N_CASES)
    for c in ovad.CONFIGS:
        assert c.cases is None or set(c.cases) <= known, c.name
        assert c.speculative == (c.name not in ("control", "control-cold"))
        if c.options.get("draft"):
            assert c.method == "draft_model" and c.k == c.options["num_assistant_tokens"]
    caching = {c.name: c.options.get("prefix_caching", True) for c in ovad.CONFIGS if c.options.get("draft")}
    assert caching["draft-k3"] is True and caching["draft-k3-nopc"] is False  # the default and off
    assert {c.k for c in ovad.CONFIGS if c.options.get("draft")} >= {1, 3, 5}
    assert ovad.ADAPTER.config("prompt-lookup").identical_to == "control"
    assert ovad.ADAPTER.config("draft-after-error").options["provoke"] is True
    # the feature cases' draft configuration repeats draft-k3-nopc's settings in batches of its own
    features = ovad.ADAPTER.config("draft-k3-nopc-features")
    assert features.options == ovad.ADAPTER.config("draft-k3-nopc").options and not features.efficiency
    assert not set(features.cases) & set(ovad.ADAPTER.config("draft-k3-nopc").cases)


def test_a_logprobs_request_asks_for_the_returned_token_s_value():
    """GenerationConfig.logprobs 1 for a request that asks for log-probabilities (the engine returns the returned
    token's only, declared ``logprobs_top`` False), 0 otherwise; the raw convention."""
    c = case("logprobs")
    lp = Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, 7, 1, c.logprobs)
    assert ovad.generation_fields(lp, ovad.ADAPTER.config("control"), seed=1)["logprobs"] == 1
    assert ovad.ADAPTER.conventions.logprobs == "raw" and ovad.ADAPTER.conventions.logprobs_top is False
    # several completions: num_return_sequences, which the engine refuses beside a draft or prompt lookup
    c = case("n-samples")
    n4 = Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, 7, 1, None, c.samples)
    assert ovad.generation_fields(n4, ovad.ADAPTER.config("control"), seed=1)["num_return_sequences"] == 4
    assert ovad.ADAPTER.config("draft-same-nopc").options["pair"] == "order1-same"
    assert ovad.scheduler_options(ovad.ADAPTER.config("draft-k3"))["enable_prefix_caching"] is True
    assert ovad.scheduler_options(ovad.ADAPTER.config("draft-k3-nopc"))["enable_prefix_caching"] is False
    assert ovad.PROVOKE_N > ovad.CHUNK


def test_conventions():
    c = ovad.ADAPTER.conventions
    assert c.top_k_ties == "lowest_ids" and c.first_token_at_prefill and c.seeds == "per_request"
    assert any("heap" in n for n in c.notes) and any("sign-dependent" in n for n in c.notes)
    assert ovad.ADAPTER.cases_for(ovad.ADAPTER.config("control"))[3].name == "ties"  # kept: the rule is stated


# ------------------------------------------------------------------------------------------------ the model's parts
def test_mt19937_and_the_distributions():
    s = M.Stream(5489)
    assert s.u32() == 3499211612  # std::mt19937's first output for its default seed
    d = M.Stream(5489)
    for _ in range(9999):
        d.u32()
    assert d.u32() == 4123659995  # the C++ standard's check: the 10000th output of a default mt19937
    u = M.Stream(1)
    vals = [u.uniform() for _ in range(2000)]
    assert all(0 <= v < 1 for v in vals) and abs(np.mean(vals) - 0.5) < 0.03
    assert {M.Stream(i).int_0_100() for i in range(3000)} == set(range(101))


def test_heap_top_k_gives_the_lowest_ids_law_on_every_row_the_matrix_reaches():
    """The declared rule is the law where the matrix samples: at every context a top-k case reaches (its prompt and
    every continuation of its law, up to its last token), the engine's warp (heap top-k, then temperature and
    top-p) has the law of the reference warp with ``top_k_ties="lowest_ids"``, and the heap keeps exactly the lowest
    ids. On rows the matrix does not reach neither holds (row 0 of order1 under the warp settings: top-p keeps one of
    three tied tokens and the heap's order picks id 2), nor does it in general (the counter-example at the end)."""
    from specdec_properties.sequences import next_token_law

    kinds = Counter()
    for c in CASES:
        if not c.sampling.top_k:
            continue
        s = ovad.ADAPTER.conventions.sampling(c.sampling)
        em = exact_model(c.model)
        frontier, ctxs = [list(c.prompt)], []
        for _ in range(c.max_new_tokens):
            ctxs += frontier
            laws = next_token_law(em, [], frontier, s)
            frontier = [f + [t] for f, law in zip(frontier, laws) for t in range(len(law))
                        if law[t] > 0 and not (c.eos and t == em.eos_id)]
        rows = em.next_logits(ctxs).numpy().astype(np.float32)
        for ctx, row in zip(ctxs, rows):
            if True:
                got = M.probabilities(M.warp(row, M.Settings.of(c.sampling)), len(row))
                want = next_token_law(em, [], [ctx], s)[0].numpy()
                assert np.abs(got - want).max() < 1e-6, (c.name, ctx, got, want)
                kept = sorted(i for _, i in M.top_k_heap(row, c.sampling.top_k))
                lowest = sorted(sorted(range(len(row)), key=lambda i: (-row[i], i))[:c.sampling.top_k])
                kinds["same set" if kept == lowest else "other set, same law"] += 1
    assert kinds["same set"] > 20 and kinds["other set, same law"] == 0
    row0 = exact_model("order1-target").next_logits([[0]])[0].numpy().astype(np.float32)
    off = M.probabilities(M.warp(row0, M.Settings.of(case("warp").sampling)), 8)
    assert off[2] > 0 and off[1] == 0  # row 0, not reached by the matrix: one of three tied tokens, not the lowest
    row = np.array([0.0, 1.0, 1.0, 2.0], np.float32)
    assert sorted(i for _, i in M.top_k_heap(row, 2)) == [2, 3]  # lowest ids would keep 1 and 3


def _tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def _exact(model: str, c, length: int) -> dict:
    from specdec_properties.sequences import continuation_law

    em = exact_model(model)
    s = ovad.ADAPTER.conventions.sampling(c.sampling)
    law = continuation_law(em, list(c.prompt), length, s, eos_id=int(em.eos_id) if c.eos else None)
    return {" ".join(map(str, k)): float(v) for k, v in law.items()}


def test_the_plain_model_follows_the_exact_law():
    c = case("warp")
    emp = M.sample_law(lambda sd: M.plain(logits_fn("order1-target"), c.prompt, M.Settings.of(c.sampling), 3, sd,
                                          eos_id=7), range(4000), 2, 7)
    assert _tv(emp, _exact("order1-target", c, 2)) < 0.03


@pytest.mark.parametrize("draft", ["order1-draft-close", "order1-draft-same"])
def test_the_speculative_model_departs_from_the_exact_law_at_position_2(draft):
    """The validation (a fresh target sample y, accept iff U{0..100}/100 <= q(x)/p(y)) and the replacement (the
    next position's sample) give a different law of the second token, even when the draft IS the target."""
    c = case("warp")
    T, D, s = logits_fn("order1-target"), logits_fn(draft), M.Settings.of(c.sampling)
    emp2 = M.sample_law(lambda sd: M.speculative(T, D, c.prompt, s, 3, sd, 3, eos_id=7), range(4000), 2, 7)
    emp1 = Counter()
    for key, v in emp2.items():
        emp1[key.split()[0]] += v
    assert _tv(emp1, _exact("order1-target", c, 1)) < 0.03  # the first token is the target's plain sample
    assert _tv(emp2, _exact("order1-target", c, 2)) > 0.08  # the second is not (0.03 is the matrix's power)


def test_validation_accepts_by_the_ratio_of_two_different_tokens():
    """One round traced: the acceptance compares the draft's probability of its token with the target's
    probability of the target's own fresh sample, against r on the grid 0, 0.01, ..., 1."""
    T, D, s = logits_fn("order1-target"), logits_fn("order1-draft-close"), M.Settings(1.0)
    tr = []
    M.speculative(T, D, (2, 6), s, 3, 7, 3, trace=tr)
    kind, pos, x, y, r, qx, py, ok = tr[0]
    assert kind == "validate" and pos == 2 and x != y and ok == bool(np.float32(r) <= np.float32(qx) / np.float32(py))
    assert abs(r * 100 - round(r * 100)) < 1e-5
    assert tr[1][0] == "replace"  # rejected: the replacement is drawn after x (x in its context)


# ------------------------------------------------------------------------------------------------ the engine, recorded
@pytest.fixture(scope="module")
def recorded():
    if not RECORDED.exists():
        pytest.fail(f"{RECORDED} is missing: write it with `.venv-openvino/bin/python engine_tests/test_openvino.py "
                    f"--record {RECORDED}`")
    return json.loads(RECORDED.read_text())


def test_the_model_gives_the_engines_recorded_completions(recorded):
    """Plain sampling: every recorded request. Speculative: the first two tokens of every request, the whole
    completion wherever the model's trace left no KV slot behind (after one the engine reads an id past the end)."""
    seeds = range(*recorded["seeds"])
    summary = Counter()
    for st in recorded["sets"]:
        c = case(st["case"])
        s = M.Settings.of(c.sampling)
        eos = 7 if c.eos else None
        T = logits_fn(st["target"])
        for sd, got in zip(seeds, st["completions"]):
            if st["draft"] is None:
                assert got == M.plain(T, c.prompt, s, c.max_new_tokens, sd, eos_id=eos), (st["case"], sd)
                summary["plain"] += 1
                continue
            tr = []
            m = M.speculative(T, logits_fn(st["draft"]), c.prompt, s, c.max_new_tokens, sd, st["k"], eos_id=eos,
                              trace=tr)
            assert got[:2] == m[:2], (st["draft"], st["case"], sd, got, m, tr)
            summary["spec"] += 1
            summary["spec_whole"] += got == m
    assert summary["plain"] == 7 * 200 and summary["spec"] == 4 * 200
    assert summary["spec_whole"] >= 0.8 * summary["spec"]


def test_stop_strings_keep_their_tokens_in_the_ids_and_streaming_is_refused():
    """The stop strings reach GenerationConfig with include_stop_str_in_output, so the returned ids end with the stop's
    tokens (the law's rule, as vLLM and llama-server return them); a streamed request is refused, never sent as a
    plain one."""
    from dataclasses import replace

    r = replace(_req("warp", seed=3), stop=("t6 t4", "t5"))
    f = ovad.generation_fields(r, ovad.ADAPTER.config("control"), seed=3)
    assert f["stop_strings"] == {"t6 t4", "t5"} and f["include_stop_str_in_output"] is True
    assert "stop_strings" not in ovad.generation_fields(_req("warp", seed=3), ovad.ADAPTER.config("control"), seed=3)
    with pytest.raises(ValueError, match="no stream"):
        ovad.generation_fields(replace(r, stream=True), ovad.ADAPTER.config("control"), seed=3)
    assert ovad.ADAPTER.conventions.token_prefix == " "


def test_a_record_holds_its_completions_by_index_and_log_probabilities_only_where_asked():
    """One builder for both engine paths (``generate`` and the handles a logprobs request needs), so a chunk that
    mixes an ``n > 1`` request with a logprobs one keeps every completion (a handle path reading the first sequence
    only crashed such a batch: caught by the worker as a missing completion, then split)."""
    c = case("n-samples")
    n4 = Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, 7, 1, None, c.samples)
    seqs = [([0, 1, 2], None, None), ([3, 4, 7], "STOP", None), ([0, 0, 0], None, None), ([5, 5, 5], None, None)]
    rec = ovad._record(n4, seqs)
    assert [s["index"] for s in rec["samples"]] == [0, 1, 2, 3] and rec["samples"][1]["completion_ids"] == [3, 4, 7]
    assert "logprobs" not in rec["samples"][0]
    lc = case("logprobs")
    lp = Request(lc.name, lc.prompt, lc.sampling, lc.max_new_tokens, lc.eos, 7, 1, lc.logprobs)
    one = ovad._record(lp, [([0, 7], "STOP", [{"0": -0.5}, {"7": -2.0}])])
    assert one == {"completion_ids": [0, 7], "finish_reason": "stop", "logprobs": [{"0": -0.5}, {"7": -2.0}]}
