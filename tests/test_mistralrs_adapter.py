"""The mistral.rs adapter as data, without mistral.rs: the model folder it prepares, the prompt text, the request
fields, the cases whose law depends on the top-k tie rule, the configurations, and a session over a stub
``mistralrs`` module (streams read token by token, EOS appended from ``finish_reason``, a bounded number in flight)."""
from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import pytest

from conformance.engines import adapter as adapter_mod
from conformance.engines.mistralrs import adapter as mrs
from conformance.engines.adapter import EngineMissingError, Request
from conformance.engines.matrix import CASES, case
from specdec_ref.warp import SamplingConfig


def _req(name="eos", seed=None, **kw):
    c = case(name)
    return replace(Request(c.name, c.prompt, c.sampling, c.max_new_tokens, c.eos, 7, seed), **kw)


def test_registered_and_two_versions():
    assert adapter_mod.ADAPTERS["mistralrs"] == "conformance.engines.mistralrs"
    assert adapter_mod.adapter("mistralrs") is mrs.ADAPTER and mrs.ADAPTER.version == "0.9.5"
    assert adapter_mod.adapter("conformance.engines.mistralrs:ADAPTER_060") is mrs.ADAPTER_060
    assert mrs.ADAPTER_060.version == "0.6.0" and mrs.ADAPTER_060.expected_path().name == "mistralrs-0.6.0.json"
    src = open(mrs.__file__).read().split("\nclass ", 1)[0]
    assert "\nimport mistralrs" not in src  # the engine is imported inside the session only


def test_060_expectations_are_keyed_by_the_cpu_flag_that_changes_its_behaviour():
    """0.6.0 dies with SIGILL at load without GFNI and runs with it: its expectations are recorded for both, and a
    run reads the one of its CPU (a recorded SIGILL on a GFNI machine would be a false mismatch, and vice versa)."""
    assert mrs.ADAPTER.expectation_key("unpatched") == "unpatched"  # 0.9.5 declares no CPU dependence
    assert mrs.ADAPTER_060.expectation_key("unpatched", frozenset({"avx2"})) == "unpatched, cpu -gfni"
    assert mrs.ADAPTER_060.expectation_key("unpatched", frozenset({"avx2", "gfni"})) == "unpatched, cpu +gfni"
    recorded = json.loads(mrs.ADAPTER_060.expected_path().read_text())["expected"]
    assert set(recorded) == {"unpatched, cpu -gfni", "unpatched, cpu +gfni"}
    assert recorded["unpatched, cpu -gfni"]["draft-k3"]["eos"] == "engine_error"  # SIGILL at load
    assert recorded["unpatched, cpu +gfni"]["draft-k3"]["eos"] == "not_certified"  # the greedy completion for all
    assert isinstance(adapter_mod.this_cpu_flags(), frozenset)


def test_split_text_reads_the_tokens_a_stream_spells():
    vocab = {"t0": 0, "t1": 1, "t10": 10, "<eos>": 7}
    assert mrs.split_text("t1t10t0<eos>", vocab) == [1, 10, 0, 7]  # the longest token first: t10 is not t1 + "0"
    assert mrs.split_text("", vocab) == []
    with pytest.raises(RuntimeError, match="no token spells 'x9'"):
        mrs.split_text("t0x9", vocab)


def test_python_picks_the_versions_own_venv(tmp_path, monkeypatch):
    monkeypatch.setattr(mrs, "REPO", tmp_path)
    with pytest.raises(EngineMissingError, match="scripts/env.sh mistralrs"):
        mrs.ADAPTER_060.python()
    py = tmp_path / ".venv-mistralrs-060" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    if sys.modules.get("mistralrs") is None:
        assert mrs.ADAPTER_060.python() == str(py)


def test_prepared_folders(tmp_path):
    eos = mrs.prepare_folder("order2-target", "eos", tmp_path / "e")
    tok = json.loads((eos / "tokenizer.json").read_text())
    assert tok["decoder"]["type"] == "ByteLevel"
    assert json.loads((eos / "tokenizer_config.json").read_text())["chat_template"] == mrs.CHAT_TEMPLATE
    assert mrs._vocab(eos) == ({"<bos>": 6, "<eos>": 7, **{f"t{i}": i for i in range(6)}}, 6)
    plain = mrs.prepare_folder("order1-target", "plain", tmp_path / "p")
    tok = json.loads((plain / "tokenizer.json").read_text())
    assert [a["content"] for a in tok["added_tokens"]] == [mrs.STOP] and tok["added_tokens"][0]["id"] == 8
    assert tok["model"]["vocab"]["<eos>"] == 7  # an ordinary word: streamed when sampled
    for f in ("config.json", "generation_config.json"):
        c = json.loads((plain / f).read_text())
        assert c["eos_token_id"] == 8 and c["pad_token_id"] == 8
    assert json.loads((plain / "tokenizer_config.json").read_text())["eos_token"] == mrs.STOP
    assert mrs._vocab(plain)[1] is None  # order1 prepends nothing
    old = mrs.prepare_folder("order1-target", "eos", tmp_path / "o", version="0.6.0")
    assert json.loads((old / "generation_config.json").read_text())["bos_token_id"] == 7


def test_prompt_text():
    vocab = {"<bos>": 6, "<eos>": 7, **{f"t{i}": i for i in range(6)}}
    assert mrs.prompt_text((6, 0), vocab, 6) == "t0" and mrs.prompt_text((6,), vocab, 6) == ""
    assert mrs.prompt_text((2, 6), {**vocab, "t6": 6}, None) == "t2 t6"
    with pytest.raises(ValueError, match="prepends id 6"):
        mrs.prompt_text((0, 1), vocab, 6)


def test_chat_request_fields():
    w = mrs.chat_kwargs(_req("warp"), "t2 t6")
    assert w == {"messages": "t2 t6", "model": "default", "max_tokens": 3, "stream": True, "logprobs": True,
                 "temperature": 1.5, "top_k": 4, "top_p": 0.6}
    g = mrs.chat_kwargs(_req("greedy"), "t0")
    assert g["temperature"] == 0.0 and "top_k" not in g and "top_p" not in g
    p = mrs.chat_kwargs(_req("penalty"), "")
    assert (p["repetition_penalty"], p["presence_penalty"]) == (1.5, 0.5) and "frequency_penalty" not in p
    assert mrs.chat_kwargs(_req("min-p"), "")["min_p"] == 0.2
    bias = Request("x", (1,), SamplingConfig(temperature=1.0, logit_bias={1: 2.0}), 3, True, 7, 0)
    with pytest.raises(ValueError, match="logit_bias"):
        mrs.chat_kwargs(bias, "")
    lowest = _req("ties", sampling=replace(case("ties").sampling, top_k_ties="lowest_ids"))
    with pytest.raises(ValueError, match="no top-k tie rule"):
        mrs.chat_kwargs(lowest, "")


def test_tie_dependent_cases_are_exactly_those_whose_law_depends_on_the_rule():
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    dependent = []
    for c in CASES:
        if c.greedy or not c.sampling.top_k:
            continue
        em = exact_model(c.model)
        eos = int(em.eos_id) if c.eos else None
        a = continuation_law(em, list(c.prompt), c.max_new_tokens, c.sampling, eos_id=eos)
        b = continuation_law(em, list(c.prompt), c.max_new_tokens, replace(c.sampling, top_k_ties="lowest_ids"),
                             eos_id=eos)
        if max(abs(float(a.get(x, 0)) - float(b.get(x, 0))) for x in set(a) | set(b)) > 1e-9:
            dependent.append(c.name)
    assert tuple(dependent) == mrs.TIE_DEPENDENT


def test_configurations_and_conventions():
    ad = mrs.ADAPTER
    assert ad.conventions.top_k_ties == "unstated" and ad.conventions.seeds == "none"
    control = {c.name for c in ad.cases_for(ad.config("control"))}
    assert control == {"temperature", "eos", "min-p", "greedy-1tok", "greedy"}
    assert not control & set(mrs.TIE_DEPENDENT) and "penalty" not in control
    assert [c.name for c in ad.cases_for(ad.config("penalty-order"))] == ["penalty"]
    assert ad.config("mtp").speculative and ad.config("mtp").options["mtp"]
    d = mrs.ADAPTER_060.config("draft-k3")
    assert d.scheme == "token" and d.options == {"draft": True, "gamma": 3}


class _Chunk:
    def __init__(self, token, finish):
        lp = types.SimpleNamespace(token=token) if token is not None else None
        self.choices = [types.SimpleNamespace(logprobs=lp, finish_reason=finish)]


class _StubRunner:
    def __init__(self, which=None, **kw):
        self.kw, self.live, self.peak = kw, 0, 0

    def send_chat_completion_request(self, req):
        self.live += 1
        self.peak = max(self.peak, self.live)
        script = {"t3 t1": [("t4", None), (None, "stop")], "t0 t3": [("t1", None), ("<eos>", None), ("t2", "length")]}
        runner = self

        def stream():
            for tok, fin in script[req.kw["messages"]]:
                if fin:
                    runner.live -= 1
                yield _Chunk(tok, fin)
        return stream()


def test_session_streams_appends_eos_and_bounds_what_is_in_flight(monkeypatch):
    fake = types.ModuleType("mistralrs")
    fake.Runner = _StubRunner
    fake.Which = types.SimpleNamespace(Plain=lambda **kw: kw)
    fake.Architecture = types.SimpleNamespace(Mistral="mistral")
    fake.ModelDType = types.SimpleNamespace(F32="f32")
    fake.ChatCompletionRequest = lambda **kw: types.SimpleNamespace(kw=kw)
    monkeypatch.setitem(sys.modules, "mistralrs", fake)
    monkeypatch.setattr(mrs, "IN_FLIGHT", 2)
    from specdec_ref.exact import exact_pair

    s = mrs.ADAPTER.open(mrs.ADAPTER.config("control"), "order1")
    try:
        reqs = [_req("eos"), _req("temperature"), _req("eos"), _req("eos"), _req("temperature")]
        out = s.generate(reqs)
        assert [o["completion_ids"] for o in out] == [[4, 7], [1, 7, 2], [4, 7], [4, 7], [1, 7, 2]]
        assert [o["finish_reason"] for o in out] == ["stop", "length", "stop", "stop", "length"]
        assert s.instances["eos"].peak <= 2 and s.instances["eos"].kw["no_paged_attn"] is True
        assert s.counters() is None and s.refuses(_req("warp")) is None
    finally:
        s.close()
    assert exact_pair("order1-close").draft.name == "order1-draft-close"


def test_penalty_order_model_tells_the_two_orders_apart(tmp_path):
    """Second tokens of the penalty case drawn from each order's law: the fit accepts the order they came from and
    rejects the other (so the stage's fit of mistral.rs's file means something)."""
    import numpy as np

    c = case("penalty")
    s, prompt = c.sampling, list(c.prompt)
    from specdec_ref.exact import exact_model

    rows = np.asarray(exact_model(c.model).next_logits([[a] for a in range(8)]), dtype=np.float64)
    rng = np.random.default_rng(0)

    def law(ctx, presence_first):
        x, gen, seen = rows[ctx[-1]].copy(), set(ctx[len(prompt):]), set(ctx)
        for t in range(8):
            rep = (lambda v: v / s.repetition_penalty if v > 0 else v * s.repetition_penalty) if t in seen else (lambda v: v)
            pres = s.presence_penalty if t in gen else 0.0
            x[t] = rep(x[t] - pres) if presence_first else rep(x[t]) - pres
        p = np.exp((x - x.max()) / s.temperature)
        return p / p.sum()

    for presence_first in (True, False):
        path = tmp_path / f"p{presence_first}.jsonl"
        with open(path, "w") as fh:
            for _ in range(20000):
                ids = [int(rng.choice(8, p=law(prompt, presence_first)))]
                ids.append(int(rng.choice(8, p=law(prompt + ids, presence_first))))
                fh.write(json.dumps({"prompt_ids": prompt, "completion_ids": ids}) + "\n")
        ref, mistral = mrs.penalty_order_fit(path).values()
        good, bad = (mistral, ref) if presence_first else (ref, mistral)
        assert good["p"] > 1e-4 and bad["p"] < 1e-6, (presence_first, good, bad)
