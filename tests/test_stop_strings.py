"""Stop strings and streamed text: the stopping rule, the law with stopped sequences as leaves, the black-box tool's
invariants on token ids, finish_reason and text, and the engine runner on a planted engine with each public bug."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conformance.engines import runner
from conformance.engines.adapter import Conventions
from conformance.engines.features import text_note, twin_check
from conformance.engines.matrix import case
from conformance.samples import certify_samples
from conformance.samples.command import replay_command
from specdec_properties.sequences import continuation_law
from specdec_properties.stops import StopStrings
from specdec_ref.exact import exact_model
from specdec_ref.warp import SamplingConfig

pytestmark = pytest.mark.xdist_group("fake_engine")

MODEL = exact_model("order1-target")
STOPS = ("t6 t4", "2 t1", "t5", "t6")  # the stop-strings case under vLLM's token prefix
RULE = StopStrings.for_model(MODEL, STOPS, " ")
T1 = SamplingConfig(temperature=1.0)


def test_the_rule_stops_at_the_token_that_completes_the_first_stop_string():
    assert RULE.pieces[:2] == (" t0", " t1") and RULE.pieces[7] == ""  # <eos> renders as nothing
    assert RULE.end([0, 2, 1, 3]) == 3 and RULE.matched([0, 2, 1, 3]) == "2 t1"
    assert RULE.returned_text([0, 2, 1]) == " t0 t"  # cut inside the token where the stop string starts
    # the later-listed 't6' completes before 't6 t4': it wins, and nothing after it is kept
    assert RULE.end([6, 4]) == 1 and RULE.matched([6, 4]) == "t6" and RULE.returned_text([6]) == " "
    assert RULE.end([0, 0, 3, 7]) is None and RULE.returned_text([0, 0, 3, 7]) == " t0 t0 t3"
    plain = StopStrings.for_model(MODEL, ("2t1",), "")
    assert plain.end([2, 1]) == 2 and plain.returned_text([0, 2, 1]) == "t0t"
    with pytest.raises(ValueError, match="non-empty"):
        StopStrings.for_model(MODEL, ("",))


def test_the_stopped_law_is_the_free_law_cut_at_each_stop():
    """Exact identity: every continuation of the law without stop strings, cut where the rule stops it, carries its
    probability to the cut sequence; the law with the rule must be exactly that push-forward."""
    free = continuation_law(MODEL, [0], 4, T1, eos_id=7)
    pushed: dict = {}
    for seq, p in free.items():
        end = RULE.end(seq)
        key = seq[:end] if end is not None else seq
        pushed[key] = pushed.get(key, 0.0) + p
    stopped = continuation_law(MODEL, [0], 4, T1, eos_id=7, stop=RULE)
    assert set(stopped) == set(pushed)
    assert max(abs(stopped[k] - pushed[k]) for k in pushed) < 1e-12
    assert math.isclose(sum(stopped.values()), 1.0, abs_tol=1e-9)
    assert sum(p for s, p in stopped.items() if RULE(s)) > 0.3  # the case stops often: the rule matters


def _records(n: int, seed: int, mutate=None):
    """Exact completions of the stop-strings case (prompt [0], T 1, max 5, EOS on) with their text."""
    from specdec_fixtures.engines import _next

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = []
        while len(ids) < 5 and RULE.end(ids) is None and not (ids and ids[-1] == 7):
            p = _next("order1-target", (0,), tuple(ids), T1, True)
            ids.append(int(rng.choice(len(p), p=p)))
        finish = "stop" if RULE.end(ids) is not None or ids[-1] == 7 else "length"
        rec = {"prompt_ids": [0], "completion_ids": ids, "seed": seed * 100_000 + i, "finish_reason": finish,
               "text": RULE.returned_text(ids)}
        out.append(mutate(rec) if mutate else rec)
    return out


def _certify(records):
    return certify_samples(records, model="order1-target", sampling=T1, max_new_tokens=5, eos_id=True, stop=RULE)


def test_exact_completions_with_their_text_are_certified_and_the_replay_states_the_stops():
    v = _certify(_records(3000, 1))
    assert v.certified and not v.violations, v.report()
    assert "stop 't6 t4', '2 t1', 't5', 't6' (token prefix ' ')" in v.report()
    assert replay_command("order1-target", T1, max_new_tokens=5, eos=True, length=None, source="f.jsonl",
                          stop=RULE).endswith("--eos '--stop=t6 t4' '--stop=2 t1' --stop=t5 --stop=t6 "
                                              "'--token-prefix= ' f.jsonl")


def test_the_command_line_takes_the_stops_and_the_token_prefix(tmp_path, capsys):
    """The replay command of a verdict runs: the same file, the same law, the same words."""
    import shlex

    from conformance.samples.cli import main

    path = _write(tmp_path / "stops.jsonl", _records(600, 5))
    v = certify_samples(str(path), model="order1-target", sampling=T1, max_new_tokens=5, eos_id=True, stop=RULE)
    assert main(shlex.split(v.replay)[3:]) == 0
    assert v.headline in capsys.readouterr().out
    bad = _write(tmp_path / "uncut.jsonl", [_stop_not_cut(r) for r in _records(600, 5)])
    assert main(shlex.split(v.replay.replace(str(path), str(bad)))[3:]) == 1
    assert "the stop string was not cut" in capsys.readouterr().out


def _past_stop(rec):
    """Bug: the rest of an accepted block kept after a stop completed inside it (one more token)."""
    ids = rec["completion_ids"]
    if RULE.end(ids) is not None and len(ids) < 5:
        rec = dict(rec, completion_ids=ids + [0])
    return rec


def _stop_not_cut(rec):
    return dict(rec, text=RULE.text(rec["completion_ids"]))


def _length_first(rec):
    ids = rec["completion_ids"]
    return dict(rec, finish_reason="length") if len(ids) == 5 and RULE.end(ids) == 5 else rec


@pytest.mark.parametrize("mutate, says", [
    (_past_stop, "token(s) [0] after the stop string"),
    (_stop_not_cut, "(the stop string was not cut from the text)"),
    (_length_first, "finish_reason 'length' but the completion ends with the stop string"),
], ids=["tokens-past-the-stop", "stop-string-left-in-the-text", "max-tokens-judged-before-the-stop"])
def test_each_stop_string_bug_is_not_certified_with_its_line(mutate, says):
    v = _certify(_records(3000, 2, mutate))
    assert v.level == "not_certified" and any(says in x for x in v.violations), v.report()


def test_an_engine_that_ignores_stop_strings_is_not_certified():
    """Without the rule applied by the engine every completion runs to EOS or max_tokens: tokens after the stop."""
    from specdec_fixtures.engines import _next

    rng = np.random.default_rng(3)
    recs = []
    for i in range(2000):
        ids = []
        while len(ids) < 5 and not (ids and ids[-1] == 7):
            p = _next("order1-target", (0,), tuple(ids), T1, True)
            ids.append(int(rng.choice(len(p), p=p)))
        recs.append({"prompt_ids": [0], "completion_ids": ids, "seed": i})
    v = _certify(recs)
    assert v.level == "not_certified" and sum("after the stop string" in x for x in v.violations) > 300


def test_a_case_with_text_is_rendered_per_engine_and_twins_share_seeds():
    c = case("stop-strings")
    assert c.stops == ("t6{p}t4", "2{p}t1", "t5", "t6") and c.eos
    with pytest.raises(ValueError, match="template"):
        c.stop_rule()
    llama = Conventions(token_prefix="").under(c)
    assert llama.stops == ("t6t4", "2t1", "t5", "t6") and llama.stop_rule().pieces[0] == "t0"
    with pytest.raises(ValueError, match="declares no token_prefix"):
        Conventions().under(c)
    stream = case("stop-stream")
    assert stream.stream and stream.same_seeds_as == "stop-strings" and stream.seed(5) == c.seed(5)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_text_note_names_held_back_text_and_the_twin_check_compares_seeds(tmp_path):
    c = Conventions(token_prefix=" ").under(case("stop-stream"))
    good = _records(400, 4)
    held = [dict(r, text=r["text"][:-2]) if r["finish_reason"] == "length" and RULE.text(r["completion_ids"]).endswith(" t2")
            else r for r in good]
    assert sum(a != b for a, b in zip(good, held)) > 3
    note = text_note(c, _write(tmp_path / "held.jsonl", held))
    assert note.passed is False and note.detail["explains"] and "held back" in note.text, note.text
    assert text_note(c, _write(tmp_path / "good.jsonl", good)) is None
    same = twin_check(c, tmp_path / "good.jsonl", tmp_path / "good.jsonl")
    assert same.passed is True and same.detail["compared"] == 400
    differ = twin_check(c, tmp_path / "held.jsonl", tmp_path / "good.jsonl")
    assert differ.passed is False and differ.detail["differing"] == sum(a != b for a, b in zip(good, held))


def test_the_runner_names_each_planted_stop_string_bug(tmp_path):
    """FAKE_TEXT (fixtures/engines.py): the exact control is certified and its stream per seed identical to its
    non-streamed twin; each planted public bug is NOT CERTIFIED with its line or its explanation."""
    assert runner.main(["specdec_fixtures.engines:FAKE_TEXT", "--out", str(tmp_path), "--scale", "0.25"]) == 0
    configs = json.loads((tmp_path / "verdicts.json").read_text())["configs"]
    control = configs["control"]["cases"]
    assert control["stop-strings"]["level"] in ("certified", "reduced"), control["stop-strings"]["headline"]
    assert control["stop-stream"]["level"] in ("certified", "reduced") and control["stop-stream"]["twin"]["passed"]
    for cfg, says in (("past-block", "after the stop string"), ("first-listed", "after the stop string 't6'"),
                      ("length-first", "finish_reason 'length' but the completion ends with the stop string")):
        c = configs[cfg]["cases"]["stop-strings"]
        assert c["level"] == "not_certified", (cfg, c["headline"])
        assert says in c["report"], (cfg, c["report"])
    held = configs["held-back"]["cases"]["stop-stream"]
    assert held["level"] == "not_certified" and "held back" in held["explained"], held
    assert configs["held-back"]["cases"]["stop-strings"]["level"] in ("certified", "reduced")


def test_a_request_the_engine_ended_itself_is_a_named_violation():
    """vLLM ends a request whose token its grammar matcher cannot advance with finish_reason 'error': a violation
    naming the tokens it returned, never an input error."""
    recs = _records(400, 6)
    recs[3] = dict(recs[3], completion_ids=[5], finish_reason="error", text="")
    v = _certify(recs)
    assert v.level == "not_certified"
    assert any("finish_reason 'error': the engine ended the request itself after 1 token(s) [5]" in x
               for x in v.violations), v.violations


def test_each_way_a_text_departs_is_named():
    """RULE.returned_text([0, 2, 1]) is ' t0 t' (stop '2 t1'); [0, 0, 2] stops nowhere and ends with '2', the start of
    '2 t1'."""
    assert RULE.departure([0, 2, 1], " t0 t") is None
    assert RULE.departure([0, 2, 1], " t0 t2 t1") == "not_cut"
    assert RULE.departure([0, 0, 2], " t0 t0 t") == "held_back"
    assert RULE.departure([0, 0, 3], " t0 t0 t") == "missing_end"  # ' t3' begins no stop string
    assert RULE.departure([0, 2, 1], " t0 t2") == "past_end"
    assert RULE.departure([0, 2, 1], " t1 t") == "other"
