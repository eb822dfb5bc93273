"""An impossible token is the engine's failure, not the file's: NOT CERTIFIED, counted and shown, the rest still tested.

Input errors proper (an unreadable file, bad JSON, missing fields, an id outside the vocabulary, an invalid prompt)
stay named errors with their own exit code, 2, so that a CI gate tells misuse (2) from a failing engine (1).
"""
import json
import re

import numpy as np
import pytest
import torch

from conformance.samples import CERTIFIED, NOT_CERTIFIED, SamplesInputError, certify_samples, main, write_jsonl
from specdec_properties.sequences import continuation_law, processed_logits64
from specdec_properties.transitions import AFTER_IMPOSSIBLE, first_impossible, tie_split_mask
from specdec_ref.exact import exact_model
from specdec_ref.warp import GREEDY, SamplingConfig, warp

MODEL = "order2-target"
BOS, EOS = 6, 7
PROMPT = [BOS, 0]
SAMPLING = SamplingConfig(temperature=1.0, top_k=2)
MAX_NEW = 3
N = 20_000


def exact_file(n: int, sampling: SamplingConfig, *, seed: int) -> list[dict]:
    """Completions drawn from the exact law of the tables (the law under test when ``sampling`` is SAMPLING)."""
    law = continuation_law(exact_model(MODEL), PROMPT, MAX_NEW, sampling, eos_id=EOS)
    seqs = list(law)
    probs = np.array([law[s] for s in seqs])
    draws = np.random.default_rng(seed).choice(len(seqs), size=n, p=probs / probs.sum())
    return [{"prompt_ids": list(PROMPT), "completion_ids": list(seqs[i]), "seed": j} for j, i in enumerate(draws)]


def with_bos_inside(records: list[dict], fraction: float, *, seed: int) -> tuple[list[dict], dict[int, int]]:
    """``<bos>`` written over one non-EOS token of ``fraction`` of the completions (what unpatched vLLM emits);
    returns the records and {line: position}."""
    rng = np.random.default_rng(seed)
    out, where = [dict(r, completion_ids=list(r["completion_ids"])) for r in records], {}
    for i in rng.choice(len(out), size=int(fraction * len(out)), replace=False):
        c = out[i]["completion_ids"]
        spots = [p for p, t in enumerate(c) if t != EOS]
        if spots:
            p = int(rng.choice(spots))
            c[p] = BOS
            where[int(i) + 1] = p + 1
    return out, where


@pytest.fixture(scope="module")
def contaminated():
    return with_bos_inside(exact_file(N, SAMPLING, seed=1), 0.03, seed=2)


def test_bos_inside_completions_is_not_certified_counted_shown_and_the_rest_still_tested(contaminated, tmp_path):
    records, where = contaminated
    path = write_jsonl(tmp_path / "bos.jsonl", records)
    verdict = certify_samples(path, model=MODEL, sampling=SAMPLING, max_new_tokens=MAX_NEW, eos_id=True)  # no raise
    report = verdict.report()
    k = len(where)
    assert 0.025 * N < k <= 0.03 * N
    assert verdict.level == "not_certified" and verdict.exit_code == 1, report
    assert verdict.headline == (f"{NOT_CERTIFIED}: {k} completion(s) in {k} request(s) hold a token of probability 0 "
                                "(the other tokens fit the law)"), report
    # every one found, at its own line and position, whatever the position (first token, drafted positions)
    assert {d["line"]: d["position"] for d in verdict.impossible} == where
    by_position = verdict.impossible_by_position
    assert sorted(by_position) == [1, 2, 3] and sum(by_position.values()) == k
    first = verdict.impossible[0]
    assert first["token"] == BOS and first["name"] == "<bos>" and first["context"] == PROMPT + records[first["line"] - 1][
        "completion_ids"][: first["position"] - 1]
    assert (f"impossible tokens: {k} of {N} completion(s), in {k} request(s), hold a token the exact law gives "
            "probability 0") in report
    assert f"bos.jsonl:{first['line']}: prompt {PROMPT}, position {first['position']}, context {first['context']}: " \
           "token 6 (<bos>), probability 0" in report and f"... {k - 5} more" in report
    # the statistical tests ran on the whole file: the impossible tokens are impossible outcomes there ...
    assert verdict.positions_tested == [1, 2, 3] and verdict.transitions is not None
    assert sum(c for _, c in verdict.transitions.impossible) == by_position[2] + by_position[3]
    assert sum(c for _, c in verdict.fits[0].impossible) == sum(c for p, c in by_position.items() if p <= verdict.prompts[0].length)
    for pos, fit in verdict.position_fits:  # the localisation names the impossible tokens of each position
        assert sum(c for _, c in fit.impossible) == by_position[pos] and f"position {pos}: " in report
    assert f", {by_position[2]} impossible: departs" in report
    # ... the tokens after one are not tested, and the rest of the file, tested as usual, fits the law
    assert verdict.transition_excluded[AFTER_IMPOSSIBLE] > 0
    assert len(verdict.rest_fits) == 2 and all(f.passed and not f.impossible for f in verdict.rest_fits), report
    length = verdict.prompts[0].length
    assert verdict.rest_fits[0].n == N - sum(c for p, c in by_position.items() if p <= length)
    assert report.count("the rest, tested as usual:") == 2 and "fits the law" in report
    record = json.loads(json.dumps(verdict.as_record()))
    assert record["impossible"]["completions"] == k and record["impossible"]["requests"] == k
    assert record["impossible"]["by_position"] == {str(p): c for p, c in by_position.items()}
    assert len(record["impossible"]["examples"]) == 20 and record["impossible"]["examples"][0]["token"] == BOS
    assert [r["passed"] for r in record["impossible"]["rest"]] == [True, True]


def test_the_rest_of_the_file_is_really_tested():
    """The same contamination over completions sampled at the wrong temperature: the rest departs too, and says so."""
    records, where = with_bos_inside(exact_file(N, SamplingConfig(temperature=0.6, top_k=2), seed=3), 0.03, seed=4)
    verdict = certify_samples(records, model=MODEL, sampling=SAMPLING, max_new_tokens=MAX_NEW, eos_id=True)
    report = verdict.report()
    assert verdict.level == "not_certified" and len(verdict.impossible) == len(where), report
    assert "hold a token of probability 0, " in verdict.headline and "the other tokens fit" not in verdict.headline
    assert "1 of 1 prompt(s) fail the sequence law" in verdict.headline, verdict.headline
    assert not any(f.passed for f in verdict.rest_fits) and "departs from the law too" in report


def test_requests_with_several_samples_are_counted_once():
    records = exact_file(40, SAMPLING, seed=5)
    for r in records:
        r["seed"], r["index"] = r["seed"] // 4, r["seed"] % 4  # 10 requests of 4 samples each
    for i in (0, 1, 2, 9):  # 3 completions of request 0, one of request 2
        c = records[i]["completion_ids"]
        c[0] = BOS
    verdict = certify_samples(records, model=MODEL, sampling=SAMPLING, max_new_tokens=MAX_NEW, eos_id=True)
    assert len(verdict.impossible) == 4 and verdict.impossible_requests == 2
    assert "4 completion(s) in 2 request(s) hold a token of probability 0" in verdict.headline


def test_tokens_a_top_k_drops_are_impossible_and_tied_tokens_a_top_p_cut_splits_are_not():
    """The walk judges every token under the declared settings; where a top-p cut splits a tie (the law there is
    undetermined and the context is left out of the tests) the tied tokens it drops are not called impossible."""
    model = exact_model("order1-target")
    split = SamplingConfig(temperature=1.0, top_p=0.8)  # after token 0, tokens 1, 2, 3 tie and the cut keeps some
    rows = processed_logits64(model, [1], [(0,)], split)
    tied_out = torch.nonzero(tie_split_mask(rows, split)[0]).flatten().tolist()
    dropped = torch.nonzero(warp(rows, split, dtype=torch.float64)[0] == 0).flatten().tolist()
    assert tied_out and set(tied_out) < set(dropped)
    beyond = next(t for t in dropped if t not in tied_out)
    found = first_impossible(model, [([1], [0, tied_out[0], 0]), ([1], [0, beyond, 0])], split, eos_id=7)
    assert found[0] is None and (found[1].position, found[1].context, found[1].token) == (2, (1, 0), beyond)
    top_k = first_impossible(model, [([1], [2, 1, 2])], SamplingConfig(top_k=1), eos_id=7)  # argmax 2 after 1, 1 after 2
    assert top_k == [None]
    (cut,) = first_impossible(model, [([1], [2, 0, 2])], SamplingConfig(top_k=1), eos_id=7)  # row 2: argmax is 1
    assert (cut.position, cut.token) == (2, 0)


def test_greedy_files_classify_an_impossible_token_as_a_divergence():
    law = continuation_law(exact_model(MODEL), PROMPT, MAX_NEW, GREEDY, eos_id=EOS)
    (seq,) = list(law)
    bad = [BOS] + list(seq[1:])
    verdict = certify_samples([{"prompt_ids": PROMPT, "completion_ids": bad}], model=MODEL, sampling=GREEDY,
                              max_new_tokens=MAX_NEW, eos_id=True)
    assert verdict.level == "not_certified" and verdict.divergences[0]["position"] == 0, verdict.report()
    assert verdict.divergences[0]["got"] == BOS


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"prompt_ids": [6, 0], "completion_ids": [0, 8, 1]}', r"bad\.jsonl:1: 'completion_ids'\[1\] = 8 is outside the vocabulary \[0, 8\)"),
        ('{"prompt_ids": [6, 0]}', r"bad\.jsonl:1: missing field\(s\) completion_ids"),
        ("{not json", r"bad\.jsonl:1: not valid JSON"),
        ('{"prompt_ids": [0, 1], "completion_ids": [0, 1, 2]}', r"bad\.jsonl:1: prompt_ids \[0, 1\] is not a valid context"),
        (None, r"cannot read .*missing\.jsonl"),
    ],
)
def test_input_errors_keep_their_named_message_and_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / ("bad.jsonl" if text is not None else "missing.jsonl")
    if text is not None:
        path.write_text(text + "\n")
    with pytest.raises(SamplesInputError, match=message):
        certify_samples(path, model=MODEL, sampling=SAMPLING, max_new_tokens=MAX_NEW, eos_id=True)
    args = ["--model", MODEL, "--temperature", "1", "--top-k", "2", "--max-new-tokens", str(MAX_NEW), "--eos", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("INPUT ERROR: ") and re.search(message, err), err


def test_exit_codes_tell_a_failing_engine_from_misuse(contaminated, tmp_path, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", exact_file(N, SAMPLING, seed=6))
    bad = write_jsonl(tmp_path / "bos.jsonl", contaminated[0])
    args = ["--model", MODEL, "--temperature", "1", "--top-k", "2", "--max-new-tokens", str(MAX_NEW), "--eos"]
    assert main(args + [good]) == 0
    assert capsys.readouterr().out.startswith(CERTIFIED + "\n")
    assert main(args + ["--json", str(tmp_path / "v.json"), bad]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{NOT_CERTIFIED}: {len(contaminated[1])} completion(s)") and "impossible tokens:" in out
    assert json.loads((tmp_path / "v.json").read_text())["impossible"]["completions"] == len(contaminated[1])
    assert main(args + ["--length", "9", good]) == 2  # a bad option value: misuse
    assert "INPUT ERROR: length must be an int in [1, max_new_tokens=3]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["--temperature", "1", good])  # no --model: argparse's usage error
    assert usage.value.code == 2
