"""The exact efficiency of llama.cpp's sample-and-match speculation (``draft-simple``), without llama.cpp:
hand cases, the equivalence with one-hot rejection sampling, a direct simulation of the server's rule, and the
totals test of :func:`conformance.engines.efficiency.compare`."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.engines import efficiency as eff
from specdec_ref.exact import exact_pair
from specdec_ref.warp import SamplingConfig

T = 0.7


def _rows(pair_name="order1-close", temperature=T):
    pair, _ = eff.tables(pair_name, SamplingConfig(temperature=temperature), "token")
    raw_q = np.asarray(exact_pair(pair_name).draft.next_logits([[a] for a in range(8)]), dtype=np.float64)
    return pair, raw_q


def test_draft_path_is_the_argmax_chain_cut_by_p_min():
    _, raw_q = _rows()
    assert eff.draft_path(raw_q, 6, 4) == [4, 5, 0, 0]  # argmax rows: 6 -> 4 -> 5 -> 0 -> 0
    # confidences (softmax of the raw draft logits at T = 1): row 6 0.584, row 4 0.418, row 5 0.813, row 0 0.712
    assert eff.draft_path(raw_q, 6, 4, p_min=0.5) == [4]
    assert eff.draft_path(raw_q, 5, 3, p_min=0.5) == [0, 0, 0]
    assert eff.draft_path(raw_q, 4, 3, p_min=0.5) == []
    tied = raw_q.copy()
    tied[2, :2] = tied[2].max()
    with pytest.raises(ValueError, match="tied argmax"):
        eff.draft_path(tied, 2, 2)


def test_a_sample_and_match_round_is_one_hot_rejection_sampling():
    """Keeping argmax drafts while they equal the target's samples has the round law of rejection sampling with
    one-hot drafts (accept d with p(d), replace from p without d): the oracle of specdec_properties.exact."""
    pair, raw_q = _rows()
    one_hot, oracle = eff.tables("order1-close", SamplingConfig(temperature=T), "one_hot")
    for start in range(8):
        for L in (1, 2, 3):
            path = eff.draft_path(raw_q, start, L)
            mine = eff.sample_match_round(pair.target, path, start)
            assert abs(mine.sum() - 1) < 1e-12
            np.testing.assert_allclose(mine, eff.round_law(one_hot, oracle, start, L), atol=1e-12)


def test_three_tokens_by_hand():
    """max_new_tokens 3: the prefill samples y ~ p[b]; two tokens remain, so the server drafts min(k, 2 - 1) = 1
    token: one round, one draft token, accepted with p[y, argmax q[y]]; rejection sampling would accept
    sum_x min(p[y, x], q[y, x]) of that draft."""
    pair, raw_q = _rows()
    p, q = pair.target, pair.draft
    b = [3, 3, 5]
    e = eff.sample_match_expected("order1-close", T, 3, b, 3)
    assert np.allclose(e["mean"][0], 3) and np.isclose(e["cov"][0, 0], 0)
    assert np.allclose(e["totals"]["mean"][0], 3) and np.isclose(e["totals"]["cov"][0, 0], 0)
    acc = np.array([p[y, raw_q[y].argmax()] for y in range(8)])
    want = 2 * p[3] @ acc + p[5] @ acc
    assert np.isclose(e["totals"]["mean"][1], want) and np.isclose(e["mean"][1], want)
    assert np.isclose(e["mean"][2], 0) and np.isclose(e["mean"][3], 0)  # a one-token draft reaches no later position
    rs = np.minimum(p, q).sum(1)
    assert np.isclose(e["rejection_acceptance_per_token"], (2 * p[3] @ rs + p[5] @ rs) / 3)
    one = eff.sample_match_expected("order1-close", T, 3, [3], 3)
    m = one["totals"]["mean"][1]
    assert np.isclose(one["totals"]["cov"][1, 1], m * (1 - m))  # a Bernoulli
    two = eff.sample_match_expected("order1-close", T, 3, [3], 2)
    assert np.allclose(two["totals"]["mean"], 0)  # one token after the prefill: never a draft


def _simulate(pair_name, k, prompts_last, max_new, *, p_min=0.0, n_min=0, n=20000, seed=0):
    """llama.cpp's server loop, in numpy: the first token at prefill, then per step a draft of the draft model's
    argmax while its confidence >= p_min, at most min(k, remaining - 1) long, dropped below n_min; the target
    samples each position and keeps drafts while they equal its samples."""
    pair, raw_q = _rows(pair_name)
    p = pair.target
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(p, 1)
    sample = lambda a: int(min(np.searchsorted(cdf[a], rng.random(), side="right"), 7))  # noqa: E731
    tot = np.zeros(3 + k)  # drafts, per_pos[k], draft_tokens, accepted
    per_req = []
    for i in range(n):
        x = np.zeros(3 + k)
        last, r = sample(prompts_last[i % len(prompts_last)]), max_new - 1
        while r > 0:
            path = eff.draft_path(raw_q, last, min(k, r - 1), p_min)
            if len(path) < max(n_min, 1):
                last, r = sample(last), r - 1
                continue
            m, ctx = 0, last
            for d in path:
                y = sample(ctx)
                if y != d:
                    break
                m, ctx = m + 1, d
            else:
                y = sample(ctx)
            x[0] += 1
            x[1:1 + m] += 1
            x[1 + k] += len(path)
            x[2 + k] += m
            last, r = y, r - m - 1
        per_req.append(x)
    arr = np.array(per_req)
    return arr.sum(0)


@pytest.mark.parametrize("k,p_min,n_min", [(3, 0.0, 0), (5, 0.0, 0), (3, 0.5, 2)])
def test_expectation_agrees_with_a_direct_simulation_of_the_server_rule(k, p_min, n_min):
    prompts = [a for a in range(7)]
    n, max_new = 6000, 10
    sim = _simulate("order1-close", k, prompts, max_new, p_min=p_min, n_min=n_min, n=n, seed=k)
    e = eff.sample_match_expected("order1-close", T, k, [prompts[i % 7] for i in range(n)], max_new, p_min=p_min,
                                  n_min=n_min)
    mean = np.concatenate([e["mean"], e["totals"]["mean"]])
    sd = np.sqrt(np.concatenate([np.diag(e["cov"]), np.diag(e["totals"]["cov"])]))
    for j in range(len(mean)):
        if sd[j] > 0:
            assert abs(sim[j] - mean[j]) < 5 * sd[j], (j, sim[j], mean[j], sd[j])
        else:
            assert np.isclose(sim[j], mean[j]), (j, sim[j], mean[j])


def test_compare_tests_totals_one_sided():
    e = eff.sample_match_expected("order1-close", T, 3, [a for a in range(7)] * 600, 10)
    tm = e["totals"]["mean"]
    base = {"drafts": int(round(e["mean"][0])), "draft_tokens": int(round(tm[0])), "accepted": int(round(tm[1])),
            "accepted_per_pos": None}
    good = eff.compare(base, e, k=3)
    assert good["passed"] and good["verdict"].startswith("matches the exact expectation")
    assert good["positions"] == [] and good["totals"]["position"] == "total"
    assert "token-wise rejection sampling with the draft's law would accept" in good["verdict"]
    assert good["rejection_acceptance_per_token"] > good["expected_acceptance_per_token"]
    se = good["totals"]["se"] * tm[0]
    low = eff.compare({**base, "accepted": int(tm[1] - 6 * se)}, e, k=3)
    assert not low["passed"] and "per draft token" in low["verdict"]
    high = eff.compare({**base, "accepted": int(tm[1] + 6 * se)}, e, k=3)  # one-sided: more acceptance passes
    assert high["passed"]
    # with per-position counters, positions and the totals are both tested
    per_pos = [int(round(x)) for x in e["mean"][1:]]
    both = eff.compare({**base, "accepted_per_pos": per_pos}, e, k=3)
    assert both["passed"] and len(both["positions"]) == 3 and "totals" in both


def test_compare_without_totals_is_unchanged():
    exp = {"mean": np.array([1000.0, 800, 600, 400]), "cov": np.diag([100.0, 150, 200, 200])}
    out = eff.compare({"drafts": 1000, "draft_tokens": 3000, "accepted": 1800, "accepted_per_pos": [800, 600, 400]},
                      exp, k=3)
    assert out["verdict"] == "matches the exact expectation" and "totals" not in out
    assert np.isclose(out["expected_acceptance_per_token"], 1800 / 3000)


def test_expectation_for_routes_sample_match():
    x = eff.expectation_for("order1-close", "sample_match", T, 3, tuple(range(7)) * 10, 10, True)
    assert len(x["mean"]) == 4 and len(x["totals"]["mean"]) == 2
    ratio = x["totals"]["mean"][1] / x["totals"]["mean"][0]
    assert 0 < ratio < x["rejection_acceptance_per_token"] < 1
    import json

    json.dumps(x)
