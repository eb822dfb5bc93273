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
