"""The logic of vLLM fixes D and E (``conformance.engines.vllm.patch``), without vLLM: the replacement functions take
the vLLM pieces they call as arguments, so stand-ins written from vLLM 0.32.0's source exercise them here. The vLLM
stage checks the same fixes on the engine (``engine_tests/test_vllm_seeds.py``, the ``patch A,C,D,E`` matrix).

D: a seeded request's sampled drafts are a function of its own generator only (not of the global generator's state,
nor of its neighbours in the batch). E: a step's draft rows are per request: cached rows where they exist, a one-hot
row at a real draft and a zero row at a ``-1`` placeholder where they do not, instead of None for the whole step.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conformance.engines.vllm.patch import VLLMPatchError, _make_draft_probs_per_request, _make_seeded_draft_sample, apply

# ------------------------------------------------------------------ stand-ins for the vLLM pieces the fixes call


def _unseeded_original(logits, sampling_metadata, use_fp64_gumbel=False):
    """vLLM 0.32.0's compute_probs_and_sample_next_token, as written there: the noise from the global generator."""
    logits.div_(sampling_metadata.temperature.view(-1, 1))
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return (probs.clone() / q).argmax(-1), probs


_OPS = SimpleNamespace(
    empty_exponential_noise_like=lambda probs, fp64: torch.empty(probs.shape, dtype=torch.float64 if fp64 else probs.dtype),
    sample_with_exponential_noise=lambda probs, q: probs.div_(q).argmax(-1).view(-1),
)
_PROPOSER = SimpleNamespace(_SAMPLING_EPS=1e-5)


def _metadata(rows: int, seeds: dict[int, int]) -> SimpleNamespace:
    return SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((rows,), 0.9),
                           generators={i: torch.Generator().manual_seed(s) for i, s in seeds.items()},
                           output_token_ids=[[] for _ in range(rows)])


def _drafts(fn, logits, seeds, global_seed):
    torch.manual_seed(global_seed)
    tokens, _ = fn(logits.clone(), _metadata(logits.shape[0], seeds))
    return tokens.tolist()


def test_fix_d_draws_a_seeded_requests_drafts_from_its_own_generator():
    """Seeded row 1 keeps its drafts whatever the global generator's state and its neighbours; unpatched it does not."""
    torch.manual_seed(0)
    logits = torch.randn(3, 64)
    fixed = _make_seeded_draft_sample(_unseeded_original, _PROPOSER, _OPS)
    seeds = {1: 1234}
    mine = [_drafts(fixed, logits, seeds, g)[1] for g in range(40)]
    assert len(set(mine)) == 1, f"fix D: a seeded row's draft changed with the global generator: {mine}"
    moved = torch.cat([torch.randn(1, 64), logits[1:2], torch.randn(2, 64)])  # row 1 of another batch
    assert _drafts(fixed, moved, {1: 1234}, 7)[1] == mine[0]
    unpatched = [_drafts(_unseeded_original, logits, seeds, g)[1] for g in range(40)]
    assert len(set(unpatched)) > 1, "the stand-in of vLLM's original must show defect D (drafts from the global generator)"
    other = [_drafts(fixed, logits, seeds, g)[0] for g in range(40)]
    assert len(set(other)) > 1, "an unseeded row keeps the global generator's draws"


def test_fix_d_keeps_the_draft_law():
    """The seeded draws are still samples of softmax(logits / T): 4 000 seeds (seeds 0..3999, deterministic) against
    the exact row, the suite's chi-square at alpha 1e-6 with its power stated against TV 0.1 (a draw from the wrong
    row, e.g. untempered, departs by TV 0.02 here: this guards the plumbing, not the temperature)."""
    from specdec_properties.stats import assert_fits

    logits = torch.tensor([[1.0, 0.2, -0.5, 0.8]])
    fixed = _make_seeded_draft_sample(_unseeded_original, _PROPOSER, _OPS)
    counts = [0] * 4
    for s in range(4000):
        counts[_drafts(fixed, logits, {0: s}, 0)[0]] += 1
    law = torch.softmax(logits[0].double() / 0.9, -1).tolist()
    fit = assert_fits(counts, law, what="fix D's seeded draft draws", labels=[str(i) for i in range(4)], alpha=1e-6,
                      tv=0.1)
    assert fit.power >= 0.99, fit


def _runner(cached_ids, req_ids, probs):
    return SimpleNamespace(_draft_probs=probs, _draft_prob_req_ids=cached_ids,
                           input_batch=SimpleNamespace(req_ids=req_ids))


def test_fix_e_builds_the_steps_rows_per_request():
    """Request "b" joined with placeholder drafts (no cached rows): zero rows for it, the cached rows for "a" and "c"
    (unpatched: None for the whole step, so "a" and "c" would be verified one-hot)."""
    vocab, k = 5, 2
    probs = torch.softmax(torch.randn(2, k, vocab), -1)
    runner = _runner(["a", "c"], ["a", "b", "c", "d"], probs)
    meta = SimpleNamespace(draft_token_ids=torch.tensor([3, 1, -1, -1, 4, 0], dtype=torch.int32),
                           num_draft_tokens=[2, 2, 2, 0])
    rows = _make_draft_probs_per_request(None)(runner, meta)
    assert rows.shape == (6, vocab)
    assert torch.equal(rows[0:2], probs[0]) and torch.equal(rows[4:6], probs[1])
    assert torch.equal(rows[2:4], torch.zeros(2, vocab)), "a placeholder's row must be zero (its residual is p)"
    real = _runner(["a"], ["a", "b"], probs[:1])
    meta = SimpleNamespace(draft_token_ids=torch.tensor([3, 1, 2, 4], dtype=torch.int32), num_draft_tokens=[2, 2])
    rows = _make_draft_probs_per_request(None)(real, meta)
    assert torch.equal(rows[2:4], torch.nn.functional.one_hot(torch.tensor([2, 4]), vocab).float()), (
        "a real draft without a cached row is verified one-hot, as the fallback did")
    assert _make_draft_probs_per_request(None)(_runner(None, ["a"], None), meta) is None


def test_fix_e_is_refused_without_fix_c():
    with pytest.raises(VLLMPatchError, match="needs fix C"):
        apply("E")
