"""A draft with fewer positions than its target: the shorter checkpoint copy, and the rounds check that compares only
the requests whose whole context fits the draft (past it there is no draft law), so that a batch whose drafts an engine
zeroes because one request is past the draft's limit (vLLM #57941) is named on the requests that fit."""
from __future__ import annotations

import json

import pytest

from conformance.engines import rounds as R
from conformance.engines.conditions import condition
from conformance.engines.vllm.adapter import ADAPTER
from specdec_ref.exact.head_files import short_positions_folder
from specdec_ref.exact import exact_model


def test_the_short_copy_states_fewer_positions_and_keeps_the_weights(tmp_path):
    folder = short_positions_folder("order2-draft", 64, root=tmp_path)
    assert json.loads((folder / "config.json").read_text())["max_position_embeddings"] == 64
    src = exact_model("order2-draft").path
    assert (folder / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert short_positions_folder("order2-draft", 64, root=tmp_path) == folder  # written once
    with pytest.raises(ValueError, match="0 < positions < 128"):
        short_positions_folder("order2-draft", 128, root=tmp_path)


def _records(case, law, k):
    """The engine's rounds where it drafts the draft's argmax (per request, as vLLM reports them)."""
    out = []
    for i in range(8):
        prompt = list(case.prompts[i % len(case.prompts)])
        completion = [0, 3, 3, 0, 2, 3, 0, 4][: case.max_new_tokens]
        rounds = R.reconstruct(law, prompt, completion, k)
        out.append({"prompt_ids": prompt, "completion_ids": completion,
                    "rounds": [[len(r.drafts), r.accepted] for r in rounds]})
    return out


def _check(tmp_path, records, case, cfg):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return R.case_rounds(ADAPTER, cfg, case, {"status": "ok", "dir": str(tmp_path), "file": "c.jsonl"})


def test_only_the_requests_that_fit_the_draft_are_compared_and_a_zeroed_one_among_them_is_named(tmp_path):
    cfg = ADAPTER.config("draft-greedy")
    (case,) = condition("short-draft").cases
    law = R.proposal_law(cfg.proposer, ADAPTER.families[case.family])
    records = _records(case, law, ADAPTER.k_of(cfg))
    for r in records:
        if len(r["prompt_ids"]) > 64:  # past the draft: whatever the engine drafted is not judged
            r["rounds"] = [[3, 0]] * len(r["rounds"])
    ok = _check(tmp_path, records, case, cfg)
    assert ok["passed"], ok["text"]
    assert "4 requests past the draft's 64 positions not compared" in ok["text"]
    short = next(r for r in records if len(r["prompt_ids"]) <= 64 and r["rounds"])
    short["rounds"][-1] = [3, 0] if short["rounds"][-1][1] else [3, 1]  # a zeroed draft block on a request that fits
    bad = _check(tmp_path, records, case, cfg)
    assert not bad["passed"] and "request 0" in bad["text"], bad["text"]
