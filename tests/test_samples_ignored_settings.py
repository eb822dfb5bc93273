"""A setting the engine accepts and does not apply is NOT CERTIFIED with the setting named, never a bare chi-square.

Bug class: ``logit_bias`` (or ``min_tokens``, a penalty, ``min_p``) silently dropped under speculation (vLLM only
warns that logit_bias and min_p do not work with speculative decoding). Files come from a numpy sampler written here
(``order1-target``'s table, the bias added to the logits, softmax at temperature 1), independent of
``specdec_ref.history``. The case is the engine matrix's ``logit-bias`` case: prompt (2, 5), bias {2: +1, 5: -1},
three tokens, no EOS stop; dropping the bias moves the law of the three tokens by TV 0.225 (0.031 on the first token
alone), far above the TV 0.03 the tool's power is stated against at N = 20 000.
"""
import numpy as np
import pytest

from conformance.samples import certify_samples, main, write_jsonl
from conformance.samples.conventions import IGNORABLE, ignored_alternatives
from conformance.samples.law import parse_logit_bias
from specdec_properties.sequences import continuation_law
from specdec_ref.exact import exact_model
from specdec_ref.warp import SamplingConfig

MODEL, PROMPT, MAX_NEW, N = "order1-target", (2, 5), 3, 20_000
BIAS = {2: 1.0, 5: -1.0}


def biased_sampler(bias: dict, *, seed: int, temperature: float = 1.0, n: int = N) -> list[dict]:
    """n completions of PROMPT, each token from the softmax of (table row of the last token + bias) / temperature."""
    table = np.asarray(exact_model(MODEL).next_logits([[t] for t in range(8)]), dtype=np.float64)
    for t, b in bias.items():
        table[:, t] += b
    x = table / temperature
    p = np.exp(x - x.max(1, keepdims=True))
    cum = (p / p.sum(1, keepdims=True)).cumsum(1)
    rng = np.random.default_rng(seed)
    last, seqs = np.full(n, PROMPT[-1]), [[] for _ in range(n)]
    for _ in range(MAX_NEW):
        last = np.minimum((rng.random(n)[:, None] > cum[last]).sum(1), 7)
        for i in range(n):
            seqs[i].append(int(last[i]))
    return [{"prompt_ids": list(PROMPT), "completion_ids": s, "seed": i} for i, s in enumerate(seqs)]


def _certify(lines, **settings):
    return certify_samples(lines, model=MODEL, sampling=SamplingConfig(temperature=1.0, **settings),
                           max_new_tokens=MAX_NEW)


def test_a_file_without_the_bias_is_not_certified_and_the_verdict_names_logit_bias(tmp_path):
    verdict = _certify(biased_sampler({}, seed=1), logit_bias=BIAS)
    report = verdict.report()
    assert verdict.level == "not_certified", report  # the level stays
    assert verdict.explained.startswith("logit_bias has no effect: the file fits the law without it "
                                        "(declared --logit-bias 2:1,5:-1), p = "), report
    assert report.splitlines()[1] == f"explained: {verdict.explained}"
    assert verdict.explained_by["ignored"] == ["logit_bias"] and verdict.explained_by["level"] == "certified"
    assert verdict.explained_by["sampling"]["logit_bias"] == [] and "--logit-bias" not in verdict.explained_by["replay"]
    assert verdict.as_record()["explained"] == verdict.explained


def test_a_file_with_the_bias_is_certified_from_the_command_line_with_its_replay(tmp_path, capsys):
    path = write_jsonl(tmp_path / "biased.jsonl", biased_sampler(BIAS, seed=2))
    rc = main(["--model", MODEL, "--temperature", "1", "--max-new-tokens", str(MAX_NEW), "--logit-bias", "2:1,5:-1",
               str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("CERTIFIED\n") and "explained:" not in out, out
    assert "logit_bias=2:1,5:-1" in out and "--logit-bias 2:1,5:-1" in out, out  # the settings and the replay


def test_a_departure_that_is_not_an_ignored_setting_gets_no_explanation():
    """The bias applied but the temperature wrong (0.6): the file fits neither the declared law nor the law without
    the bias, so no line blames the bias."""
    verdict = _certify(biased_sampler(BIAS, seed=3, temperature=0.6), logit_bias=BIAS)
    assert verdict.level == "not_certified" and verdict.explained is None, verdict.report()


def test_two_settings_dropped_together_are_named_together():
    """logit_bias and min_new_tokens declared, both dropped (min_new_tokens 3 masks EOS, token 7, at every position):
    neither alone fits, both together do."""
    em = exact_model(MODEL)
    law = continuation_law(em, list(PROMPT), MAX_NEW, SamplingConfig(temperature=1.0), eos_id=7)
    keys = list(law)
    p = np.array([float(law[k]) for k in keys])
    picks = np.random.default_rng(4).choice(len(keys), size=N, p=p / p.sum())
    lines = [{"prompt_ids": list(PROMPT), "completion_ids": list(keys[i]), "seed": j} for j, i in enumerate(picks)]
    verdict = certify_samples(lines, model=MODEL, sampling=SamplingConfig(temperature=1.0, logit_bias=BIAS,
                                                                          min_new_tokens=3),
                              max_new_tokens=MAX_NEW, eos_id=7)
    assert verdict.level == "not_certified", verdict.report()
    assert verdict.explained and verdict.explained.startswith(
        "min_new_tokens and logit_bias have no effect: the file fits the law without them"), verdict.report()
    assert verdict.explained_by["ignored"] == ["min_new_tokens", "logit_bias"]


def test_the_alternatives_are_each_declared_setting_then_all_of_them():
    s = SamplingConfig(temperature=0.8, logit_bias=BIAS, frequency_penalty=0.5, min_p=0.1)
    alts = ignored_alternatives(s)
    assert [tuple(x.name for x in what) for what, _ in alts] == [
        ("min_p",), ("frequency_penalty",), ("logit_bias",), ("min_p", "frequency_penalty", "logit_bias")]
    assert alts[-1][1] == SamplingConfig(temperature=0.8)
    assert ignored_alternatives(SamplingConfig(temperature=0.8)) == []
    assert ignored_alternatives(SamplingConfig(greedy=True, min_p=0.1)) == []  # greedy ignores min_p by definition
    assert {x.name for x in IGNORABLE} >= {"logit_bias", "min_new_tokens", "frequency_penalty"}


def test_logit_bias_flag_values():
    assert parse_logit_bias("5:-1,2:1.5") == ((2, 1.5), (5, -1.0))
    with pytest.raises(ValueError, match="not TOKEN:BIAS"):
        parse_logit_bias("2=1")


def test_a_malformed_or_out_of_vocabulary_bias_is_an_input_error(tmp_path, capsys):
    path = write_jsonl(tmp_path / "f.jsonl", biased_sampler(BIAS, seed=5, n=50))
    base = ["--model", MODEL, "--max-new-tokens", str(MAX_NEW), str(path)]
    with pytest.raises(SystemExit) as exc:
        main(["--logit-bias", "2=1", *base])
    assert exc.value.code == 2
    assert "argument --logit-bias: logit bias '2=1' is not TOKEN:BIAS" in capsys.readouterr().err
    assert main(["--logit-bias", "9:1", *base]) == 2
    assert "logit_bias names token 9, outside the vocabulary [0, 8)" in capsys.readouterr().err


def _greedy_lines(completion, n=200):
    return [{"prompt_ids": [4], "completion_ids": list(completion), "seed": i} for i in range(n)]


def test_greedy_files_are_judged_under_their_history_settings_and_a_dropped_one_is_named():
    """Greedy decoding applies the history settings too: from ``[4]`` the bias {2: +1, 5: -1} turns the greedy
    continuation ``5 0 0`` into ``2 1 2``. A file that applied the bias is CERTIFIED under it; one that dropped it is
    NOT CERTIFIED, and the verdict says the bias had no effect (the greedy check once compared with the unbiased
    argmax: it passed the second file and failed the first)."""
    greedy = dict(model=MODEL, max_new_tokens=MAX_NEW)
    biased = SamplingConfig(greedy=True, logit_bias=BIAS)
    ok = certify_samples(_greedy_lines((2, 1, 2)), sampling=biased, **greedy)
    assert ok.level == "certified", ok.report()
    dropped = certify_samples(_greedy_lines((5, 0, 0)), sampling=biased, **greedy)
    assert dropped.level == "not_certified", dropped.report()
    assert dropped.explained.startswith("logit_bias has no effect: the file fits the law without it "
                                        "(declared --logit-bias 2:1,5:-1), every completion equals that law's greedy continuation"), dropped.report()
