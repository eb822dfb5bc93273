"""The ONNX Runtime GenAI adapter as data, without the engine: the search options per request, the configurations
and their schemes, the conventions, the composed model folder, the round counters, the model of its top-k, and a
session over a stub ``onnxruntime_genai`` module (EOS read from ``get_next_tokens``, rounds from the stats)."""
from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from conformance.engines.session import variant_of
from conformance.engines import adapter as adapter_mod
from conformance.engines.onnxgenai import adapter as og_ad
from conformance.engines.adapter import EngineMissingError, Request
from conformance.engines.matrix import case
from specdec_ref.warp import SamplingConfig


def _req(name="warp", seed=7, **kw):
    c = case(name)
    s = og_ad.ADAPTER.conventions.sampling(c.sampling)
    r = Request(c.name, c.prompt, s, c.max_new_tokens, c.eos, 7, seed)
    return replace(r, **kw)


def test_registered_and_importing_it_starts_nothing():
    assert adapter_mod.ADAPTERS["onnxgenai"] == "conformance.engines.onnxgenai"
    ad = adapter_mod.adapter("onnxgenai")
    assert ad is og_ad.ADAPTER and ad.version == og_ad.VERSION == "0.18.0"
    src = open(og_ad.__file__).read().split("\nclass ", 1)[0]  # module level: the engine is imported in functions
    assert "\nimport onnxruntime_genai" not in src and "\nfrom onnxruntime_genai" not in src


def test_search_options_per_request():
    o = og_ad.search_options(_req("warp"))
    assert o == {"max_length": 5, "do_sample": True, "temperature": 1.5, "top_k": 4, "top_p": 0.6, "random_seed": 7}
    g = og_ad.search_options(_req("greedy"))
    assert g == {"max_length": 6, "do_sample": False, "random_seed": 7}
    t = og_ad.search_options(_req("temperature", seed=None))
    assert "random_seed" not in t and t["top_k"] == 0 and t["top_p"] == 1.0  # every filter off explicitly (default 50)
    eff = Request("efficiency", (5, 2), SamplingConfig(temperature=0.7), 10, False, 7, 3)
    assert og_ad.search_options(eff, k=3)["max_length"] == 2 + 10 + 4  # headroom: rounds of exactly k drafts
    assert og_ad.search_options(eff)["max_length"] == 12
    assert og_ad.search_options(_req("warp", case="warp"), k=3)["max_length"] == 5  # law cases: the exact budget
    rep = Request("x", (1,), SamplingConfig(temperature=1.0, repetition_penalty=1.3), 3, True, 7, 0)
    assert og_ad.search_options(rep)["repetition_penalty"] == 1.3
    mt = og_ad.search_options(_req("min-tokens"))  # min_length counts the prompt: [2, 6] + 3 generated
    assert mt["min_length"] == 5 and mt["max_length"] == 6


def test_refused_settings_and_the_tie_rule():
    for name, what in (("min-p", "min_p"), ("penalty", "presence_penalty"), ("logit-bias", "logit_bias")):
        with pytest.raises(ValueError, match=what):
            og_ad.search_options(_req(name))
    keep_all = Request("ties", (0, 4), SamplingConfig(temperature=1.5, top_k=2), 3, True, 7, 0)
    with pytest.raises(ValueError, match="lowest-ids"):
        og_ad.search_options(keep_all)
    assert og_ad.search_options(_req("ties"))["top_k"] == 2  # under the declared rule
    s = og_ad.OnnxGenaiSession.__new__(og_ad.OnnxGenaiSession)
    assert "min_p" in s.refuses(_req("min-p")) and s.refuses(_req("warp")) is None


def test_variant_per_request():
    assert variant_of(_req("temperature")) == "plain" and variant_of(_req("eos")) == "eos"


def test_configurations_declare_their_schemes():
    ad = og_ad.ADAPTER
    names = [c.name for c in ad.configurations]
    assert names[:3] == ["control", "draft-k3", "draft-k1"] and {"draft-k5", "greedy", "ngram", "draft-adaptive"} <= set(names)
    for c in ad.configurations:
        spec = c.options.get("speculative", {})
        if c.method == "draft_model" and not spec.get("min_adaptive_k"):
            assert c.scheme == "token" and c.k == spec["max_draft_tokens"] and c.options["draft"]
        if c.method == "ngram":
            assert c.scheme is None and c.identical_to == "control" and spec["ngram_size"] >= 2
        assert ad.cases_for(c), c.name
    assert ad.config("greedy").identical_to == "control"
    assert {x.name for x in ad.cases_for(ad.config("greedy"))} == {"greedy-1tok", "greedy"}
    assert ad.config("draft-adaptive").scheme is None
    control = {x.name for x in ad.cases_for(ad.config("control"))}
    for c in ad.configurations:  # every identity claim has the control cases it compares with
        if c.identical_to:
            assert {x.name for x in ad.cases_for(c)} <= control, c.name
    assert {x.name for x in ad.cases_for(ad.config("draft-k3")) if x.condition is None} == set(og_ad.LAW) | {"min-tokens"}
    # its rounds are placed per request, so its acceptance is checked per position under a condition too
    assert ad.config("draft-k3").sampled_proposer == "draft"


def test_conventions():
    conv = og_ad.ADAPTER.conventions
    assert conv.top_k_ties == "lowest_ids" and not conv.first_token_at_prefill and conv.seeds == "per_request"
    assert "ties" in {c.name for c in og_ad.ADAPTER.all_cases()}  # declared: the tie case is run, under lowest ids
    assert conv.sampling(case("ties").sampling).top_k_ties == "lowest_ids"
    assert any("get_next_tokens" in n for n in conv.notes)


def test_partial_sort_model_of_the_engines_top_k():
    """libstdc++'s heap selection: the lowest ids on every row at k = 2 (the ties case), other ids on five tied
    (row, k) pairs of order1-target (the engine test checks the same sets against the engine)."""
    from specdec_ref.exact import exact_model

    L = np.asarray(exact_model("order1-target").next_logits([[a] for a in range(8)]), dtype=np.float64)
    lowest = lambda row, k: set(sorted(range(8), key=lambda i: (-row[i], i))[:k])  # noqa: E731
    differ = {(a, k): sorted(og_ad.partial_sort_top_k(list(L[a]), k)) for a in range(8) for k in range(1, 8)
              if og_ad.partial_sort_top_k(list(L[a]), k) != lowest(L[a], k)}
    assert differ == {(2, 3): [1, 4, 7], (2, 4): [1, 4, 5, 7], (3, 4): [0, 3, 4, 5], (4, 5): [1, 4, 5, 6, 7],
                      (6, 3): [4, 5, 6]}
    assert og_ad.partial_sort_top_k([1.0, 2.0, 3.0], 5) == {0, 1, 2}


def _fake_export(root, name, vocab=8):
    d = root / name
    d.mkdir(parents=True)
    (d / "model.onnx").write_text("onnx")
    (d / "tokenizer.json").write_text("{}")
    block = {"filename": "model.onnx", "session_options": {"log_id": "x"}, "head_size": 32}
    (d / "genai_config.json").write_text(json.dumps({"model": {"decoder": block, "vocab_size": vocab, "eos_token_id": 7},
                                                     "search": {"top_k": 50}}))
    return d


def test_compose_config_relative_paths_draft_and_options(tmp_path):
    t, d = _fake_export(tmp_path, "t"), _fake_export(tmp_path, "d")
    out = og_ad.compose_config(t, d, og_ad.ADAPTER.config("draft-k5").options, tmp_path / "composite")
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["decoder"]["filename"] == "target/model.onnx" and (out / "target" / "model.onnx").exists()
    assert cfg["model"]["draft"]["filename"] == "draft/model.onnx" and (out / "draft" / "model.onnx").exists()
    assert cfg["speculative"] == {"max_draft_tokens": 5}
    assert cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] == 1
    plain = og_ad.compose_config(t, None, og_ad.ADAPTER.config("ngram").options, tmp_path / "ng")
    cfg = json.loads((plain / "genai_config.json").read_text())
    assert "draft" not in cfg["model"] and cfg["speculative"] == {"ngram_size": 2, "max_draft_tokens": 3}


def test_round_counter_per_position():
    c = og_ad.RoundCounter(3)
    c.add([(3, 0), (3, 3), (3, 1), (0, 0), (2, 2)])  # (proposed, accepted) per round; a round without drafts: none
    assert c.read() == {"drafts": 4, "draft_tokens": 11, "accepted": 6, "accepted_per_pos": [3, 2, 1]}


class _StubGenerator:
    """Emits a scripted sequence; each call of a new round bumps the stats (2 proposed, 1 accepted)."""

    script = {}

    def __init__(self, model, params):
        self.opts, self.out, self.i, self.stats = params.opts, None, 0, {"rounds": 0, "draft_tokens_proposed": 0,
                                                                          "draft_tokens_accepted": 0}

    def append_tokens(self, ids):
        self.out = list(self.script[tuple(int(x) for x in ids)])

    def is_done(self):
        return self.i >= len(self.out) or (self.i and self.out[self.i - 1] == 7)

    def generate_next_token(self):
        if self.i % 2 == 0:
            self.stats = {"rounds": self.stats["rounds"] + 1, "draft_tokens_proposed": self.stats["draft_tokens_proposed"] + 2,
                          "draft_tokens_accepted": self.stats["draft_tokens_accepted"] + 1}
        self.i += 1

    def get_next_tokens(self):
        return np.array([self.out[self.i - 1]], dtype=np.int32)

    def get_speculative_stats(self):
        return dict(self.stats)


class _StubParams:
    def __init__(self, model):
        self.opts = {}

    def set_search_options(self, **kw):
        self.opts.update(kw)


def test_session_reads_eos_from_next_tokens_and_counts_rounds(monkeypatch):
    fake = types.ModuleType("onnxruntime_genai")
    fake.GeneratorParams, fake.Generator = _StubParams, _StubGenerator
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", fake)
    _StubGenerator.script = {(3, 1): [4, 7], (0, 3): [1, 2, 3, 4]}
    s = og_ad.OnnxGenaiSession.__new__(og_ad.OnnxGenaiSession)
    s.cfg, s.k, s.counter = og_ad.ADAPTER.config("draft-k3"), 3, og_ad.RoundCounter(3)
    s.instances = {"eos": object(), "plain": object()}
    out = s.generate([_req("eos", seed=1), _req("temperature", seed=None)])
    assert out[0] == {"completion_ids": [4, 7], "finish_reason": "stop", "draft_tokens": 2, "accepted": 1,
                      "rounds": [[2, 1]]}
    assert out[1]["completion_ids"] == [1, 2, 3] and out[1]["finish_reason"] == "length"  # stopped at max_new_tokens
    assert out[1]["draft_tokens"] == 4 and out[1]["accepted"] == 2
    assert s.counters() == {"drafts": 3, "draft_tokens": 6, "accepted": 3, "accepted_per_pos": [3, 0, 0]}
    s.cfg = og_ad.ADAPTER.config("control")
    assert s.counters() is None and "draft_tokens" not in s.one(object(), _req("eos", seed=2))


def test_missing_venv_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(adapter_mod, "REPO", tmp_path)
    monkeypatch.setattr(adapter_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineMissingError, match="scripts/env.sh onnxgenai"):
        og_ad.ADAPTER.python()


def test_cache_is_keyed_by_version(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    assert og_ad.engine_home() == tmp_path / "onnxgenai-0.18.0"
    assert len(og_ad._checkpoint_key("order1-target")) == 12
    assert og_ad._checkpoint_key("order1-target") != og_ad._checkpoint_key("order1-draft-close")


def test_the_context_edge_maps_to_the_export_s_context_and_the_rest_is_refused_by_name():
    """ORT GenAI runs the conditions it has knobs for: the context edge (the exports' 128 positions; the paged block
    size stated as absent); prefix caching on, a token budget, a KV pool or another context are refused, named."""
    from conformance.engines.conditions import condition

    assert og_ad.condition_settings(condition("context-edge")) == {"max_model_len": 128, "prefix_caching": False}
    assert set(og_ad.ADAPTER.conditions) == {"context-edge"} and "block_size" in og_ad.ADAPTER.absent_knobs
    for name, why in (("prefix-cache", "no prefix cache"), ("chunked-prefill", "token_budget"),
                      ("preemption", "kv_blocks"), ("long-context-edge", "prefix cache")):
        with pytest.raises(NotImplementedError, match=why):
            og_ad.ADAPTER.open_condition(og_ad.ADAPTER.config("control"), "order2", condition(name))


class _RefusingParams(_StubParams):
    said = "max_length (1048576) cannot be greater than model context_length (128)"


class _RefusingGenerator:
    def __init__(self, model, params):
        raise RuntimeError(_RefusingParams.said)


def test_the_context_is_the_one_the_engine_states_when_it_refuses_a_longer_request(monkeypatch):
    """The condition's evidence is the engine's own refusal, parsed; a refusal that names no context (or none at all)
    gives no reading, so the condition is not shown reached."""
    fake = types.ModuleType("onnxruntime_genai")
    fake.GeneratorParams, fake.Generator = _RefusingParams, _RefusingGenerator
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", fake)
    assert og_ad.stated_context(object()) == 128
    monkeypatch.setattr(_RefusingParams, "said", "out of memory")
    assert og_ad.stated_context(object()) is None
    fake.Generator = lambda model, params: object()  # accepted: it enforces no context
    assert og_ad.stated_context(object()) is None
