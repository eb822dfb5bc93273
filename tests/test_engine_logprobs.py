"""The engine runner's log-probability check (conformance/engines/logprobs.py): exact values pass; each bug class a
real engine has shown fails, named where its pattern is recognisable."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.engines.logprobs import TOLERANCE, bug_effects, exact_rows, logprob_check
from conformance.engines.matrix import case
from specdec_ref.exact import exact_model

CASE = case("logprobs")
MODEL = exact_model(CASE.model)
COMPLETIONS = ([0, 0, 1, 7], [3, 0, 2, 1], [0, 4, 0, 0], [7])


def _row(prefix, convention="raw"):
    return exact_rows(MODEL, CASE.prompt, [prefix], CASE.sampling, convention, int(MODEL.eos_id))[0]


def _entry(row, tok, n=CASE.logprobs):
    top = [int(t) for t in np.argsort(-row, kind="stable")[:n]]
    return {str(t): float(row[t]) for t in top + [tok]}


def _lines(mutate=None, prompt_logprobs=True):
    """Exact engine lines for COMPLETIONS; ``mutate(i, toks, entry) -> entry`` alters position ``i``'s entry."""
    out = []
    for n, toks in enumerate(COMPLETIONS):
        lps = []
        for i, tok in enumerate(toks):
            entry = _entry(_row(tuple(toks[:i])), tok)
            lps.append(mutate(i, toks, entry) if mutate else entry)
        line = {"prompt_ids": list(CASE.prompt), "completion_ids": toks, "seed": 100 + n, "logprobs": lps}
        if prompt_logprobs:
            line["prompt_logprobs"] = [None] + [
                {str(CASE.prompt[j]): float(exact_rows(MODEL, CASE.prompt[:j], [()], CASE.sampling, "raw")[0][CASE.prompt[j]])}
                for j in range(1, len(CASE.prompt))]
        out.append(line)
    return out


def test_exact_logprobs_pass_and_say_what_was_checked():
    check = logprob_check(CASE, _lines(), "raw")
    assert check.passed is True, check.text
    assert check.detail["tokens"] == sum(map(len, COMPLETIONS)) and check.detail["prompt_tokens"] == 2 * len(COMPLETIONS)
    assert "within 0.001 nats" in check.text


def test_a_case_without_logprobs_is_not_checked():
    assert logprob_check(case("position"), _lines(), "raw") is None


def test_probability_one_for_drafted_tokens_is_named_with_its_positions():
    """llama-server's speculative path leaves every verified token's probability at 1 (logprob 0) and its top empty."""
    check = logprob_check(CASE, _lines(lambda i, toks, e: e if i == 0 else {str(toks[i]): 0.0}), "raw")
    assert check.passed is False
    assert check.detail["explained"] == "log-probability 0 (probability 1) returned: not computed for these tokens"
    assert "(positions 2, 3, 4; right at 1)" in check.detail["summary"]
    assert check.detail["by_position"]["1"] == [0, 4] and check.detail["by_position"]["2"] == [3, 3]


def test_the_previous_positions_values_are_named_off_by_one():
    def shifted(i, toks, e):
        if i == 0:
            return e
        prev = _row(tuple(toks[:i - 1]))
        return {t: float(prev[int(t)]) for t in e}

    check = logprob_check(CASE, _lines(shifted), "raw")
    assert check.passed is False and check.detail["explained"] == "the values are the previous position's (same token)"


def test_the_next_positions_values_are_named():
    """Values one position late (a row the engine read after committing the token) on every token that has one."""
    def ahead(i, toks, e):
        if i + 1 >= len(toks):
            return e
        nxt = _row(tuple(toks[:i + 1]))
        return {t: float(nxt[int(t)]) for t in e}

    lines = [line for line in _lines(ahead) if len(line["completion_ids"]) > 1]
    check = logprob_check(CASE, lines, "raw")
    assert check.passed is False and check.detail["explained"] == "the values are the next position's (same token)"


def test_processed_values_under_a_raw_declaration_are_named():
    check = logprob_check(CASE, _lines(lambda i, toks, e: {t: float(_row(tuple(toks[:i]), "processed")[int(t)])
                                                           for t in e}), "raw")
    assert check.passed is False and check.detail["explained"] == "the values are the other convention's (same token)"
    # and the processed convention, declared, passes on them
    assert logprob_check(CASE, _lines(lambda i, toks, e: {t: float(_row(tuple(toks[:i]), "processed")[int(t)])
                                                          for t in e}), "processed").passed is True


def test_missing_logprobs_and_a_short_top_fail():
    none = [dict(line, logprobs=None) for line in _lines()]
    check = logprob_check(CASE, none, "raw")
    assert check.passed is False and check.detail["explained"] == "no log-probabilities returned for these tokens"

    def only_sampled(i, toks, e):
        return {str(toks[i]): e[str(toks[i])]}

    check = logprob_check(CASE, _lines(only_sampled), "raw")
    assert check.passed is False and "of the top 3 asked" in check.text


def test_an_engine_without_a_top_list_is_checked_on_the_returned_token_and_says_so():
    """``Conventions.logprobs_top`` False (OpenVINO GenAI returns the sampled token's value only): the values are still
    checked, one wrong value fails, and the text states that no top list was checked."""
    def only_sampled(i, toks, e):
        return {str(toks[i]): e[str(toks[i])]}

    check = logprob_check(CASE, _lines(only_sampled, prompt_logprobs=False), "raw", top=False)
    assert check.passed is True and "no top list" in check.text, check.text
    wrong = logprob_check(CASE, _lines(lambda i, toks, e: {str(toks[i]): e[str(toks[i])] - (0.01 if i == 1 else 0)},
                                       prompt_logprobs=False), "raw", top=False)
    assert wrong.passed is False and wrong.detail["by_position"]["2"] == [3, 3], wrong.text


def test_another_tokens_value_at_the_same_position_is_named():
    """The value of a different token at the same prefix (an engine that returns a draft but the value of the token
    it sampled itself there: OpenVINO GenAI's speculative path, docs/openvino-verdict.md)."""
    def swapped(i, toks, e):
        row = _row(tuple(toks[:i]))
        other = next(t for t in np.argsort(-row, kind="stable") if t != toks[i] and abs(row[t] - row[toks[i]]) > 0.01)
        return {str(toks[i]): float(row[other])}

    check = logprob_check(CASE, _lines(swapped, prompt_logprobs=False), "raw", top=False)
    assert check.passed is False and check.detail["explained"].startswith("each value is another token's"), check.text


def test_wrong_prompt_logprobs_fail():
    lines = _lines()
    lines[1]["prompt_logprobs"][2] = {str(CASE.prompt[2]): 0.0}
    check = logprob_check(CASE, lines, "raw")
    assert check.passed is False and check.detail["prompt_wrong"] == 1 and "prompt token 3" in check.text


@pytest.mark.parametrize("factor, passes", [(0.5, True), (2.0, False)])
def test_the_tolerance_is_the_stated_one(factor, passes):
    def nudged(i, toks, e):
        return {t: v + (factor * TOLERANCE if i == 1 and int(t) == toks[i] else 0.0) for t, v in e.items()}

    assert logprob_check(CASE, _lines(nudged), "raw").passed is passes


def test_the_case_lets_every_named_bug_show():
    """The logprobs case is chosen so that each named bug moves a token of nearly every completion by more than ten
    times the tolerance (the order-2 target's rows change with the position; temperature 0.8 separates the two
    conventions)."""
    effects = bug_effects(CASE)
    assert effects["zero"]["share"] > 0.999 and effects["other convention"]["share"] > 0.999
    assert effects["previous position"]["share"] > 0.9
    assert min(e["median"] for e in effects.values()) > 100 * TOLERANCE


def test_tokens_after_an_impossible_token_are_counted_as_not_checked():
    """An engine that emits a token the model cannot produce (vLLM's defect A sampled <bos>) leaves the rest of that
    line without exact values: skipped and said, never a crash of the check."""
    lines = _lines()
    bos = int(MODEL.bos_id)
    lines[0]["completion_ids"] = [0, bos, 1, 7]
    lines[0]["logprobs"][1] = _entry(_row((0,)), bos)
    check = logprob_check(CASE, lines, "raw")
    assert check.passed is True and check.detail["skipped"] == 2 and "2 tokens after an impossible token" in check.text
