"""Bad words: the automaton that states their rule, its agreement with a direct reading of the words, the black-box
tool's ``--bad-words`` (an ignored word named) and vLLM's request mapping (the planted engine that reads the words off
the tokens before each block: tests/test_engine_runner_fake.py)."""
from __future__ import annotations

import itertools

import pytest

from conformance.engines.matrix import BAD_WORDS, case
from conformance.samples import certify_samples
from conformance.samples.law import parse_bad_words, setting_text
from specdec_ref.automaton import TokenAutomaton, automaton_of
from specdec_ref.warp import SamplingConfig

pytestmark = pytest.mark.xdist_group("fake_engine")

WITH = SamplingConfig(temperature=1.0, bad_words=BAD_WORDS)


def _holds_word(seq, words) -> bool:
    return any(tuple(seq[i:i + len(w)]) == tuple(w) for w in words for i in range(len(seq) - len(w) + 1))


@pytest.mark.parametrize("words", [((0, 0), (1, 2, 1)), ((3,), (2, 2, 4)), ((1, 1, 1), (0, 1))])
def test_the_words_automaton_forbids_exactly_the_sequences_that_end_a_word(words):
    """Bug class: a ban that reads too little history (the last token only) or forgets a word that overlaps another."""
    a = TokenAutomaton.forbidding(words, 5)
    for seq in itertools.product(range(5), repeat=4):
        state = a.start
        for i, t in enumerate(seq):
            forbidden = any(len(w) <= i + 1 and tuple(seq[i + 1 - len(w): i + 1]) == tuple(w) for w in words)
            assert (a.transitions[state][t] < 0) == forbidden, (seq, i)
            if forbidden:
                break
            state = a.transitions[state][t]


def test_a_constraint_and_bad_words_together_run_as_their_product_and_nothing_left_is_an_error():
    parity = TokenAutomaton(((1, 0, 1, 0), (-1, 0, -1, 0)))  # after an even token, odd tokens only
    both = automaton_of(parity, ((1, 1),), 4)
    state = both.start
    for t in (0, 1):
        state = both.transitions[state][t]
    assert both.allowed(state) == (0, 2, 3)  # after "0 1": the parity allows all, the word bans 1
    with pytest.raises(ValueError, match="allows no token"):
        automaton_of(parity, ((0, 1), (0, 3)), 4)  # after an even token nothing is left
    with pytest.raises(ValueError, match="non-empty"):
        SamplingConfig(bad_words=((),))


def test_the_flag_round_trips_and_the_case_reads_its_words():
    assert parse_bad_words(setting_text(BAD_WORDS, "bad_words")) == BAD_WORDS == parse_bad_words("0 0;1 2 1")
    with pytest.raises(ValueError, match="empty word"):
        parse_bad_words("0 0;;1")
    assert case("bad-words").sampling.bad_words == BAD_WORDS and "bad words 0 0, 1 2 1" in case("bad-words").settings()


def test_vllm_takes_the_words_as_text_and_a_path_without_their_text_refuses():
    from conformance.engines.vllm.adapter import vllm_sampling_kwargs

    kw = vllm_sampling_kwargs(WITH, max_new_tokens=5, eos=True, eos_id=7, seed=1, bad_words=["t0 t0", "t1 t2 t1"])
    assert kw["bad_words"] == ["t0 t0", "t1 t2 t1"]
    with pytest.raises(ValueError, match="as text"):
        vllm_sampling_kwargs(WITH, max_new_tokens=5, eos=True, eos_id=7, seed=1)


def _records(n: int, sampling: SamplingConfig, seed: int):
    from specdec_fixtures.engines import law_records

    return law_records("order1-target", (2, 5), sampling, n, seed)


def test_completions_under_bad_words_are_certified_and_ignored_words_are_named():
    ok = certify_samples(_records(3000, WITH, 1), model="order1-target", sampling=WITH, max_new_tokens=5, eos_id=True)
    assert ok.certified, ok.report()
    assert "--bad-words '0 0;1 2 1'" in ok.replay
    ignored = certify_samples(_records(3000, SamplingConfig(temperature=1.0), 2), model="order1-target",
                              sampling=WITH, max_new_tokens=5, eos_id=True)
    assert ignored.level == "not_certified" and ignored.impossible, ignored.report()
    assert ignored.explained.startswith("bad_words has no effect"), ignored.explained


def test_every_adapter_that_takes_no_bad_words_refuses_them_rather_than_dropping_them():
    """Bug class: a harness mapping that silently drops a setting, so the engine is blamed ("bad_words has no
    effect") for the adapter's omission: every adapter without a bad-words mapping refuses the request."""
    from conformance.engines.adapter import Request
    from conformance.engines.llamacpp.adapter import completion_payload
    from conformance.engines.mistralrs.adapter import chat_kwargs
    from conformance.engines.onnxgenai.adapter import search_options
    from conformance.engines.openvino.adapter import ADAPTER as OV, generation_fields

    r = Request("bad-words", (2, 5), WITH, 5, True, 7, 1)
    for call in (lambda: completion_payload(r), lambda: chat_kwargs(r, "t2 t5"), lambda: search_options(r),
                 lambda: generation_fields(r, OV.config("control"), seed=1)):
        with pytest.raises(ValueError, match="bad words|bad_words"):
            call()
