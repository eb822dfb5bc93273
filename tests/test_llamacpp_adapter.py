"""The llama.cpp adapter as data, without llama.cpp: the request mapping, the flags per configuration, the
conventions and the case lists, the metrics parser, and a session over a stub server."""
from __future__ import annotations

import pytest

from conformance.engines.session import variant_of
from conformance.engines import adapter as adapter_mod
from conformance.engines.llamacpp import adapter as lc
from conformance.engines.adapter import EngineMissingError, Request
from conformance.engines.matrix import case
from specdec_ref.warp import SamplingConfig


def _req(name="warp", seed=7, eos=None):
    c = case(name)
    return Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos if eos is None else eos, 7, seed)


def test_registered_and_importing_it_starts_nothing():
    assert adapter_mod.ADAPTERS["llamacpp"] == "conformance.engines.llamacpp"
    ad = adapter_mod.adapter("llamacpp")
    assert ad is lc.ADAPTER and ad.version == lc.VERSION == "0.3.36"


def test_payload_sets_every_filter_and_the_reference_order():
    body = lc.completion_payload(_req("warp"))
    assert body["prompt"] == [2, 6] and body["n_predict"] == 3 and body["seed"] == 7
    assert body["samplers"] == ["penalties", "temperature", "top_k", "top_p", "min_p"]  # temperature before top-k/p
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (1.5, 4, 0.6, 0.0)
    assert body["typical_p"] == 1.0 and body["top_n_sigma"] == -1.0 and body["xtc_probability"] == 0.0
    assert body["dry_multiplier"] == 0.0 and body["mirostat"] == 0 and body["dynatemp_range"] == 0.0
    assert body["ignore_eos"] is False and body["return_tokens"] is True and body["repeat_last_n"] == 128
    assert (body["repeat_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.0, 0.0, 0.0)


def test_payload_greedy_unseeded_penalties_minp():
    g = lc.completion_payload(_req("greedy"))
    assert g["temperature"] == 0.0 and g["top_k"] == 0 and g["top_p"] == 1.0 and g["min_p"] == 0.0
    t = lc.completion_payload(_req("temperature", seed=None))
    assert "seed" not in t and t["temperature"] == 0.6
    p = lc.completion_payload(_req("penalty"))
    assert (p["repeat_penalty"], p["presence_penalty"]) == (1.5, 0.5)
    m = lc.completion_payload(_req("min-p"))
    assert m["min_p"] == 0.2 and m["top_k"] == 0 and m["top_p"] == 1.0


def test_logit_bias_is_sent_and_min_tokens_refused():
    assert lc.completion_payload(_req("logit-bias"))["logit_bias"] == [[2, 1.0], [5, -1.0]]
    assert "logit_bias" not in lc.completion_payload(_req("warp"))
    r = Request("x", (1,), SamplingConfig(temperature=1.0, min_new_tokens=2), 3, True, 7, 0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        lc.completion_payload(r)
    s = lc.LlamaCppSession.__new__(lc.LlamaCppSession)
    assert "min_new_tokens" in s.refuses(r) and s.refuses(_req("warp")) is None


def test_eos_variant_per_request():
    assert variant_of(_req("temperature")) == "plain"  # EOS an ordinary token
    assert variant_of(_req("eos")) == "eos"


def test_flags_per_configuration():
    ad = lc.ADAPTER
    control = lc.server_args(ad.config("control"), None)
    assert control == ["-np", "1", "-c", "128"]
    k3 = lc.server_args(ad.config("draft-k3"), "/d.gguf")
    assert k3[k3.index("-md") + 1] == "/d.gguf" and k3[k3.index("--spec-type") + 1] == "draft-simple"
    assert k3[k3.index("--spec-draft-n-max") + 1] == "3" and k3[k3.index("--spec-draft-n-min") + 1] == "0"
    assert k3[k3.index("--spec-draft-p-min") + 1] == "0.0"
    for name, k in (("draft-k1", "1"), ("draft-k5", "5")):
        a = lc.server_args(ad.config(name), "/d.gguf")
        assert a[a.index("--spec-draft-n-max") + 1] == k
    np4 = lc.server_args(ad.config("draft-k3-np4"), "/d.gguf")
    assert np4[:4] == ["-np", "4", "-c", "512"]
    ignored = lc.server_args(ad.config("draft-ignored"), "/d.gguf")
    assert "-md" in ignored and "--spec-type" not in ignored  # the silently ignored draft
    ng = lc.server_args(ad.config("ngram-simple"), None)
    assert "-md" not in ng and ng[ng.index("--spec-type") + 1] == "ngram-simple"
    assert ng[ng.index("--spec-ngram-simple-size-n") + 1] == "1"
    with pytest.raises(ValueError, match="draft model"):
        lc.server_args(ad.config("draft-k3"), None)


def test_configurations_declare_their_schemes():
    ad = lc.ADAPTER
    names = {c.name for c in ad.configurations}
    assert {"control", "control-np4", "draft-k1", "draft-k3", "draft-k5", "draft-k3-np4", "draft-ignored",
            "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"} <= names
    for c in ad.configurations:
        if c.method == "draft-simple":
            plain = "control-np4" if c.options.get("parallel", 1) == 4 else "control"  # the same slots, no speculation
            assert c.scheme == "sample_match" and c.identical_to == plain and c.k == c.options["draft_max"]
        if c.method and c.method.startswith("ngram"):
            assert c.scheme is None and c.identical_to == "control"
    ign = ad.config("draft-ignored")
    assert ign.speculative and ign.scheme == "sample_match" and ign.identical_to is None


def test_conventions_and_cases():
    ad = lc.ADAPTER
    conv = ad.conventions
    assert conv.top_k_ties == "lowest_ids" and conv.first_token_at_prefill and conv.seeds == "per_request"
    all_names = {c.name for c in ad.all_cases()}
    assert "ties" in all_names and "penalty" in all_names
    assert ad.conventions.sampling(case("ties").sampling).top_k_ties == "lowest_ids"
    assert lc.completion_payload(_req("ties"))["top_k"] == 2  # one top-k for llama.cpp, whatever the declared law
    assert "penalty" not in {c.name for c in ad.cases_for(ad.config("control"))}
    assert [c.name for c in ad.cases_for(ad.config("penalty-window"))] == ["penalty"]
    for c in ad.configurations:
        assert ad.cases_for(c), c.name
        if c.name != "penalty-window":
            assert "penalty" not in {x.name for x in ad.cases_for(c)}
    assert any("temperature last" in n for n in conv.notes) and any("ignore_eos" in n for n in conv.notes)


METRICS = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 120
llamacpp:spec_decode_num_accepted_tokens_total 50
llamacpp:spec_decode_num_drafts_total 40
llamacpp:prompt_tokens_total 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 30
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 15
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 5
"""


def test_parse_metrics():
    m = lc.parse_metrics(METRICS)
    assert m == {"drafts": 40, "draft_tokens": 120, "accepted": 50, "accepted_per_pos": [30, 15, 5]}
    assert lc.parse_metrics("")["accepted_per_pos"] is None


class _StubServer:
    def __init__(self, replies):
        self.replies, self.bodies = replies, []

    def complete(self, body, timeout=None):
        self.bodies.append(body)
        return self.replies(body)

    def metrics(self):
        return lc.parse_metrics(METRICS)

    def stop(self):
        self.stopped = True


def test_session_maps_records_and_counters():
    ad = lc.ADAPTER
    s = lc.LlamaCppSession.__new__(lc.LlamaCppSession)
    s.cfg, s.parallel = ad.config("draft-k3"), 1
    eos_srv = _StubServer(lambda b: {"tokens": [b["prompt"][-1], 7], "stop_type": "eos", "timings/draft_n": 2,
                                     "timings/draft_n_accepted": 1})
    plain_srv = _StubServer(lambda b: {"tokens": [1, 2, 3], "stop_type": "limit"})
    s.instances = {"eos": eos_srv, "plain": plain_srv}
    reqs = [_req("eos", seed=1), _req("temperature", seed=None), _req("eos", seed=2)]
    out = s.generate(reqs)
    assert [o["completion_ids"] for o in out] == [[1, 7], [1, 2, 3], [1, 7]]
    assert out[0]["draft_tokens"] == 2 and out[0]["accepted"] == 1 and out[1]["draft_tokens"] == 0
    assert out[0]["finish_reason"] == "eos" and out[1]["finish_reason"] == "length" and len(eos_srv.bodies) == 2 and len(plain_srv.bodies) == 1
    c = s.counters()
    assert c["draft_tokens"] == 240 and c["accepted_per_pos"] == [60, 30, 10]  # both servers summed
    s.close()
    assert eos_srv.stopped and plain_srv.stopped
    s.cfg = ad.config("control")
    assert s.counters() is None and "draft_tokens" not in s.one(plain_srv, _req("temperature"))


def test_missing_build_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    assert lc.engine_home() == tmp_path / "llama.cpp-0.3.36"
    with pytest.raises(EngineMissingError, match="scripts/env.sh llamacpp"):
        lc.ADAPTER.python()
