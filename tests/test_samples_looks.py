"""The black-box tool's planned looks (conformance.samples.looks): a file, or a growing one, decided on its prefixes.

Correct files pass at an early-pass look on part of their lines with the whole procedure's power stated; a biased
one is rejected at the first look whose evidence is conclusive and reads no further; a file too short for a decision
is INCONCLUSIVE (a partial sample), never passed; a file grown look by look gets the verdict the whole file gets.
"""
from __future__ import annotations

import json

import pytest

from conformance.engines.matrix import case
from conformance.samples import certify_samples
from conformance.engines.calibration import draw_lines
from conformance.samples.cli import main as cli
from conformance.samples.looks import Looks, run_looks
from conformance.samples.growing import GrowingFile
from specdec_properties.early_pass import reserve_scale

WARP = case("warp")


def _certify(lines, c=WARP, **kw):
    return certify_samples(lines, model=c.model, sampling=c.sampling, max_new_tokens=c.max_new_tokens,
                           eos_id=True if c.eos else None, **kw)


def test_the_schedule_is_the_main_jobs():
    looks = Looks(20_000)
    assert [(x.kind, x.n) for x in looks.schedule()] == [
        ("interim", 1000), ("early_pass", 5000), ("early_pass", 7000), ("early_pass", 10000), ("early_pass", 14000),
        ("full", round(20_000 * reserve_scale()))]
    assert [(x.kind, x.n) for x in looks.schedule(greedy=True)] == [("full", looks.full_n)]
    assert Looks.whole(1234).full_n == 1234
    assert looks.family_alpha(1e-6) == pytest.approx(1e-6 * (1 + 5 * 0.01))
    with pytest.raises(ValueError):
        Looks(0)
    with pytest.raises(ValueError):
        Looks(100, early_pass_fractions=(0.5, 0.25))


def test_a_correct_file_passes_early_stating_the_procedures_power():
    looks = Looks(20_000)
    lines = draw_lines(WARP, looks.full_n, seed=3)
    v = _certify(lines, looks=looks)
    assert v.level == "certified" and v.sequential.decided, v.report()
    assert v.sequential.deciding.kind == "early_pass" and v.n < looks.nominal_n
    rec = v.as_record()
    assert rec["sequential"]["n_used"] == v.n and rec["family_alpha"] == pytest.approx(1.05e-6)
    # every test states the whole procedure's power (its full look's, net of the looks' beta): >= 0.99 at TV 0.03
    assert all(s["power"] >= 0.99 and s["detects"] <= 0.03 and "early_pass" in s for s in rec["statistics"])
    assert "passed at an early-pass look" in v.headline and f"N={v.n}" in v.headline
    assert "the procedure (every look together): power >=" in v.report()
    # the same file without looks keeps today's meaning: one look on every line
    whole = _certify(lines)
    assert whole.n == len(lines) and whole.sequential is None and "sequential" not in whole.as_record()


def test_a_grossly_biased_file_is_rejected_at_the_interim_look_and_reads_no_further():
    biased = WARP.__class__(**{**WARP.__dict__, "sampling": WARP.sampling.__class__(temperature=0.5, top_k=4, top_p=0.6)})
    lines = draw_lines(biased, Looks(20_000).full_n, seed=1)
    v = _certify(lines, looks=Looks(20_000))
    assert v.level == "not_certified" and v.n == 1000 and v.sequential.deciding.kind == "interim", v.report()
    assert "rejected at the interim look, N=1000" in v.headline
    assert all(s["alpha"] <= 1e-8 for s in v.as_record()["statistics"])  # stated at the alpha it rejected at


def test_an_impossible_token_is_rejected_at_the_first_look():
    lines = draw_lines(WARP, 2000, seed=2)
    lines[10] = {**lines[10], "completion_ids": [0, 0, 0]}  # top-k 4 / top-p 0.6 never keeps token 0 after 6
    v = _certify(lines, looks=Looks(20_000))
    assert v.level == "not_certified" and v.n == 1000 and v.impossible, v.report()


def test_a_partial_sample_is_inconclusive_and_names_the_next_look():
    lines = draw_lines(WARP, 3000, seed=4)
    v = _certify(lines, looks=Looks(20_000))
    assert v.level == "inconclusive" and not v.sequential.decided and v.sequential.next_n == 5000
    assert "a partial sample" in v.headline and "5000" in v.headline
    assert v.exit_code == 1


def test_a_growing_file_gets_the_whole_files_verdict_and_runs_each_look_once(tmp_path, monkeypatch):
    from conformance.samples import verdict as verdict_module

    looks = Looks(20_000)
    lines = draw_lines(case("position"), looks.full_n, seed=5)
    path = tmp_path / "grow.jsonl"
    path.write_text("")
    c = case("position")
    calls = []
    judge = verdict_module._judge
    monkeypatch.setattr(verdict_module, "_judge", lambda *a, **k: calls.append(len(a[2])) or judge(*a, **k))
    g = GrowingFile(path, looks=looks, model=c.model, sampling=c.sampling, max_new_tokens=c.max_new_tokens, eos_id=True)
    have = 0
    while not g.decided:
        target = g.next_n
        with open(path, "a") as fh:
            fh.writelines(json.dumps(x) + "\n" for x in lines[have:target])
        have = target
        g.update()
    grown = g.verdict
    assert sorted(calls) == sorted(set(calls)), calls  # no look judged twice
    whole = _certify(str(path), c=c, looks=looks)
    assert (whole.level, whole.n, whole.headline) == (grown.level, grown.n, grown.headline)
    assert grown.sequential.as_record()["taken"] == whole.sequential.as_record()["taken"]


def test_greedy_files_get_one_look_and_a_divergence_on_part_of_them_rejects():
    g = case("greedy")
    looks = Looks.whole(g.n)
    from specdec_properties.sequences import continuation_law
    from specdec_ref.exact import exact_model

    em = exact_model(g.model)
    (path,) = continuation_law(em, list(g.prompt), g.max_new_tokens, g.sampling, eos_id=int(em.eos_id)).keys()
    good = [{"prompt_ids": list(g.prompt), "completion_ids": list(path), "seed": g.seed(i)} for i in range(g.n)]
    v = _certify(good, c=g, looks=looks)
    assert v.level == "certified" and v.n == g.n and [x.kind for x in v.sequential.taken] == ["full"]
    wrong = [dict(x) for x in good[:50]]
    wrong[7]["completion_ids"] = [list(path)[0], (list(path)[1] + 1) % 8] + list(path)[2:]
    v = _certify(wrong, c=g, looks=looks)
    assert v.level == "not_certified" and v.divergences and v.n == 50, v.report()


def test_run_looks_resumes_only_an_undecided_run_of_the_same_looks():
    looks = Looks(1000)
    _, seq = run_looks([], looks, lambda *a: None, alpha=1e-6)
    seq.decided = True
    with pytest.raises(ValueError):
        run_looks([], looks, lambda *a: None, alpha=1e-6, resume=seq)


def test_the_command_line_takes_looks_and_a_planned_n(tmp_path, capsys):
    path = tmp_path / "warp.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in draw_lines(WARP, Looks(20_000).full_n, seed=6)))
    args = ["--model", WARP.model, "--temperature", "1.5", "--top-k", "4", "--top-p", "0.6", "--max-new-tokens", "3",
            "--eos", str(path)]
    assert cli(args[:-1] + ["--planned-n", "20000", str(path)]) == 0
    out = capsys.readouterr().out
    assert "CERTIFIED" in out and "--planned-n 20000" in out
    assert cli(args[:-1] + ["--planned-n", "200000", str(path)]) == 1  # 21 406 lines: the first early look needs 50 000
    assert "INCONCLUSIVE: a partial sample" in capsys.readouterr().out
    assert cli(args[:-1] + ["--looks", str(path)]) == 0
    assert "--looks" in capsys.readouterr().out
