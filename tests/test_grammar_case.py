"""Structured output: the grammar case's automaton, its law in the black-box tool (``--automaton``), its GBNF for the
engines (the planted engine that checks a block's drafts against the block's first state: tests/test_engine_runner_fake.py)."""
from __future__ import annotations

import json

import pytest

from conformance.engines.adapter import Request
from conformance.engines.features import grammar_text
from conformance.engines.llamacpp.adapter import completion_payload
from conformance.engines.matrix import GRAMMAR, case
from conformance.samples import certify_samples
from conformance.samples.law import parse_automaton, setting_text
from specdec_ref.warp import SamplingConfig

pytestmark = pytest.mark.xdist_group("fake_engine")

WITH = SamplingConfig(temperature=1.0, constraint=GRAMMAR)


def test_the_grammar_reads_as_gbnf_with_end_only_where_eos_is_allowed():
    assert grammar_text(GRAMMAR, 7) == ('root ::= s0\ns0 ::= "t0" s0 | "t1" s0 | "t2" s0 | "t3" s1 | ""\n'
                                        's1 ::= "t4" s0 | "t5" s0 | "t6" s0\n')
    r = Request("grammar", (3,), WITH, 5, True, 7, 1)
    assert completion_payload(r)["grammar"] == grammar_text(GRAMMAR, 7)
    from conformance.engines.vllm.adapter import vllm_sampling_kwargs

    kw = vllm_sampling_kwargs(WITH, max_new_tokens=5, eos=True, eos_id=7, seed=1)
    assert kw["structured_outputs"] == {"grammar": grammar_text(GRAMMAR, 7)}
    assert case("grammar").sampling.constraint == GRAMMAR and "grammar (2 states)" in case("grammar").settings()


def test_the_automaton_flag_round_trips_and_rejects_what_is_not_one():
    assert parse_automaton(setting_text(GRAMMAR)) == GRAMMAR
    assert parse_automaton(json.dumps([list(r) for r in GRAMMAR.transitions])) == GRAMMAR
    with pytest.raises(ValueError, match="not JSON"):
        parse_automaton("[[0,")
    with pytest.raises(ValueError, match="allows no token"):
        parse_automaton("[[-1,-1]]")


def _records(n: int, sampling: SamplingConfig, seed: int):
    from specdec_fixtures.engines import law_records

    return law_records("order1-target", (3,), sampling, n, seed)


def test_constrained_completions_are_certified_and_an_ignored_grammar_is_named():
    ok = certify_samples(_records(3000, WITH, 1), model="order1-target", sampling=WITH, max_new_tokens=5, eos_id=True)
    assert ok.certified, ok.report()
    assert "--automaton" in ok.replay
    ignored = certify_samples(_records(3000, SamplingConfig(temperature=1.0), 2), model="order1-target", sampling=WITH,
                              max_new_tokens=5, eos_id=True)
    assert ignored.level == "not_certified" and ignored.impossible, ignored.report()
    assert ignored.explained.startswith("constraint has no effect"), ignored.explained
    # each impossible token is one the grammar forbids: counted and named, in the headline and the report
    assert all(d["forbidden_by"] == "grammar" for d in ignored.impossible)
    assert f"({len(ignored.impossible)} of them a token the grammar forbids)" in ignored.headline, ignored.headline
    assert "(the grammar forbids it)" in ignored.report()


def test_forbidden_by_names_the_rule_that_forbids_a_token_and_none_otherwise():
    from specdec_ref.automaton import forbidden_by

    assert forbidden_by(GRAMMAR, (), (3,), 0) == "grammar"  # after t3 only t4 t5 t6
    assert forbidden_by(GRAMMAR, (), (3, 4), 5) == "grammar"  # back in state 0: t5 is not allowed
    assert forbidden_by(GRAMMAR, (), (3,), 5) is None and forbidden_by(None, (), (3,), 0) is None
    assert forbidden_by(None, ((0, 0), (1, 2, 1)), (1, 2), 1) == "bad words"
    assert forbidden_by(None, ((0, 0), (1, 2, 1)), (2,), 1) is None  # the word needs its beginning
    assert forbidden_by(GRAMMAR, (), (0, 5), 0) is None  # the tokens before already left the grammar: no attribution


def test_openvino_grammar_literals_carry_the_tokenizer_ir_s_space():
    """xgrammar sees the tokenizer IR's vocabulary as ' t0' ... ' t6': without the space only EOS matches (every
    completion empty), the bug class of a grammar written against the wrong token strings."""
    from conformance.engines.openvino.adapter import CONFIGS, GRAMMAR_TOKEN_PREFIX, generation_fields

    assert GRAMMAR_TOKEN_PREFIX == " "
    r = Request("grammar", (3,), WITH, 5, True, 7, 1)
    f = generation_fields(r, next(c for c in CONFIGS if c.name == "prompt-lookup"), seed=1)
    assert f["grammar"] == grammar_text(GRAMMAR, 7, " ") and '" t3" s1' in f["grammar"]
    with pytest.raises(ValueError, match="quoted literal"):
        grammar_text(GRAMMAR, 7, '"')
