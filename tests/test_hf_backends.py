"""The transformers adapters (specdec_ref.adapters.hf_backends) run and map outputs to our contract; the verdict exists."""
from __future__ import annotations

import pathlib

import pytest
import torch

from specdec_properties.stateful_cache import compare_kv, fresh_prefill
from specdec_ref.decode import autoregressive_decode
from specdec_ref.adapters.hf_backends import (
    ForwardProbe,
    HFDynamicCache,
    _logits,
    hf_assisted_decoder,
    hf_assisted_drafts,
    hf_cache,
    hf_greedy_select,
    hf_verifier,
    transformers_version,
)
from specdec_ref.models import make_draft, tiny_lm
from specdec_ref.verify import verify_block
from specdec_ref.warp import GREEDY, SamplingConfig

VERDICT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "transformers-verdict.md"


def _block(batch=6, k=4, vocab=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=g) * 2, -1)
    draft = torch.softmax(torch.randn(batch, k, vocab, generator=g) * 2, -1)
    drafts = torch.stack([torch.multinomial(draft[b], 1, generator=g)[:, 0] for b in range(batch)])
    return drafts, draft, target


def _assert_structure(drafts, m, tokens, vocab):
    batch, k = drafts.shape
    assert m.shape == (batch,) and m.dtype == torch.long
    assert tokens.shape == (batch, k + 1) and tokens.dtype == torch.long
    for b in range(batch):
        mb = int(m[b])
        assert 0 <= mb <= k
        assert tokens[b, :mb].tolist() == drafts[b, :mb].tolist()
        assert 0 <= int(tokens[b, mb]) < vocab
        assert (tokens[b, mb + 1 :] == -1).all()


@pytest.mark.parametrize("k", [1, 2, 5])
def test_verifier_sampling_maps_output(k):
    backend = hf_verifier()
    assert not backend.capabilities.batched and backend.version == transformers_version()
    drafts, q, p = _block(k=k)
    m, tokens = backend.verify(drafts, q, p, generator=torch.Generator().manual_seed(1))
    _assert_structure(drafts, m, tokens, 10)


def test_verifier_sampling_reproducible_and_restores_global_rng():
    backend = hf_verifier()
    drafts, q, p = _block(batch=32)
    state = torch.random.get_rng_state()
    a = backend.verify(drafts, q, p, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.random.get_rng_state(), state), "fork_rng must restore the caller's global RNG"
    b = backend.verify(drafts, q, p, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_verifier_without_generator_uses_global_rng_like_transformers():
    backend = hf_verifier()
    drafts, q, p = _block(batch=64)
    torch.manual_seed(5)
    a = backend.verify(drafts, q, p)
    torch.manual_seed(5)
    b = backend.verify(drafts, q, p)
    assert torch.equal(a[1], b[1])


def test_verifier_greedy_equals_reference_argmax():
    backend = hf_verifier()
    drafts, _, p = _block(batch=16, k=3)
    drafts[::2] = p[::2, :3].argmax(-1)  # some rows accept everything
    drafts[1::4, 1] = p[1::4, 1].argmax(-1)
    m, tokens = backend.verify(drafts, None, p)
    _assert_structure(drafts, m, tokens, 10)
    rm, rt = verify_block(drafts, None, p)
    assert torch.equal(m, rm) and torch.equal(tokens, rt)
    assert (m[::2] == 3).all()


def _equal_rows(vocab, k, seed):
    """Target rows (k+1, V) in float32 with zeros and tiny masses; the draft rows are exactly the first k."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=g, dtype=torch.float64) * 4
    logits[torch.rand(k + 1, vocab, generator=g) < 0.3] = -float("inf")
    logits[:, 0] = 3.0  # every row keeps some mass
    logits[:, 1] = -18.0  # a tiny one (~1e-9)
    target = torch.softmax(logits, -1).to(torch.float32)
    return target[:k].clone(), target


@pytest.mark.parametrize("vocab,k", [(2, 1), (7, 4), (33, 8), (1000, 3)])
def test_verifier_p_equals_q_never_rejects_and_residual_is_zero(vocab, k):
    """With draft rows equal to the target rows, transformers sees ratios of exactly 1: no rejection, no residual."""
    q, p = _equal_rows(vocab, k, seed=vocab * 31 + k)
    # what _speculative_sampling computes from the adapter's logits
    seen_q, seen_p = _logits(q[None]).softmax(-1), _logits(p[None]).softmax(-1)
    assert torch.equal(seen_p[:, :k], seen_q), "transformers must see p == q row for row"
    assert torch.equal(torch.clamp(seen_p[:, :k] - seen_q, min=0), torch.zeros_like(seen_q)), "the residual of p == q must be exactly 0"
    batch = 256
    g = torch.Generator().manual_seed(k)
    drafts = torch.multinomial(q, batch, replacement=True, generator=g).T.contiguous()
    m, tokens = hf_verifier().verify(drafts, q.expand(batch, -1, -1), p.expand(batch, -1, -1), generator=g)
    assert (m == k).all(), f"p == q but {int((m < k).sum())} of {batch} rows rejected a draft"
    assert (p[k][tokens[:, k]] > 0).all(), "a bonus token has zero probability under row k"


def test_adapter_logits_keep_the_probabilities_to_float64_precision():
    """transformers sees softmax(logits) = p / sum(p) to float64 rounding, not float32's (~1e-7 relative)."""
    _, p = _equal_rows(50, 4, seed=3)
    seen = _logits(p).softmax(-1)
    assert seen.dtype == torch.float64
    exact = p.double() / p.double().sum(-1, keepdim=True)
    assert torch.allclose(seen, exact, rtol=1e-12, atol=0), f"max relative error {float(((seen - exact).abs() / exact.clamp_min(1e-300)).max()):.3g}"


def test_verifier_greedy_near_ties_follow_the_reference_argmax():
    """Adjacent float32 probabilities stay distinct: the greedy choice is the true maximum, as in verify_block.

    In float32, ``log`` maps about a third of adjacent float32 values to one logit; the argmax then
    picks the first of the (now tied) pair instead of the larger probability.
    """
    g = torch.Generator().manual_seed(0)
    low = torch.rand(4000, generator=g) * 0.4 + 0.05
    high = torch.nextafter(low, torch.ones_like(low))
    rows = torch.rand(4000, 6, generator=g) * 0.01
    rows[:, 0], rows[:, 1] = low, high  # the maximum is at index 1, a hair above index 0
    rows = rows / rows.sum(-1, keepdim=True)
    keep = rows[:, 1] > rows[:, 0]  # normalisation may round the pair together; keep strict near-ties
    p = rows[keep][:, None, :].expand(-1, 2, -1).contiguous()  # k = 1: row 0 judges the draft, row 1 is the bonus row
    drafts = torch.zeros(p.shape[0], 1, dtype=torch.long)  # draft index 0, the runner-up
    m, tokens = hf_verifier().verify(drafts, None, p)
    rm, rt = verify_block(drafts, None, p)
    assert (rm == 0).all() and (rt[:, 0] == 1).all()
    assert torch.equal(m, rm) and torch.equal(tokens, rt), f"{int((m != rm).sum())} of {len(m)} near-tie rows accepted the runner-up"


def test_hf_assisted_drafts_from_target_calls():
    # prompt 5; round 0: prompt + 3 drafts on an empty cache; round 1 starts at cur_len 7 ([last, 2 drafts] on 6 cached)
    assert hf_assisted_drafts([(8, 0), (3, 6)], prompt_len=5) == [(3, 5), (2, 7)]


def test_forward_probe_records_calls_and_removes_its_hooks():
    model = tiny_lm("llama", seed=2)
    probe = ForwardProbe(model)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    assert probe.calls == [(3, 0)] and probe.seconds > 0
    probe.reset()
    assert probe.calls == [] and probe.seconds == 0.0
    probe.remove()
    with torch.no_grad():
        model(torch.tensor([[1]]))
    assert probe.calls == []


def test_greedy_select_is_transformers_branch():
    cand = torch.tensor([[7, 1, 2, 3]])  # cur_len 1, candidates [1, 2, 3]
    logits = torch.full((1, 4, 5), -1.0)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 4] = logits[0, 3, 0] = 1.0
    assert hf_greedy_select(cand, 1, logits).tolist() == [[1, 2, 4]]


def test_hf_cache_rollback_matches_fresh_prefill(monkeypatch):
    model = tiny_lm("llama", seed=4)
    backend = hf_cache()
    assert backend.capabilities.cache and not backend.capabilities.verifier
    cache = backend.make_cache(model)
    assert isinstance(cache, HFDynamicCache)
    calls = []
    original = type(cache.hf_cache).crop
    monkeypatch.setattr(type(cache.hf_cache), "crop", lambda self, n: (calls.append(n), original(self, n))[1])
    tokens = [1, 2, 3, 4, 5]
    cache.feed(torch.tensor([tokens]))
    cache.trim(3)
    assert calls == [-2], "transformers removes a negative count of tokens"
    compare_kv(cache.layer_kv(), fresh_prefill(model, tokens[:3])[1])
    cache.feed(torch.tensor([[9]]))
    compare_kv(cache.layer_kv(), fresh_prefill(model, tokens[:3] + [9])[1])
    cache.trim(0)  # crop(-4): transformers' own call for "remove everything"
    assert calls[-1] == -4 and cache.tentative_length == 0
    cache.feed(torch.tensor([[6, 7]]))
    compare_kv(cache.layer_kv(), fresh_prefill(model, [6, 7])[1])


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=11, init_scale=2.0)
    return target, make_draft(target, "noisy", noise=0.2, seed=12)


@pytest.mark.parametrize("k", [1, 3])
def test_assisted_decoder_greedy_equals_ar(pair, k):
    target, draft = pair
    backend = hf_assisted_decoder()
    assert backend.capabilities.decoder and not backend.capabilities.cache and not backend.capabilities.batched
    before = draft.generation_config.to_dict()
    for seed in range(2):
        prompt = torch.randint(0, 16, (1, 5), generator=torch.Generator().manual_seed(seed))
        ar = autoregressive_decode(target, prompt, max_new_tokens=12)
        out = backend.decode(target, draft, prompt, k=k, max_new_tokens=12, sampling=GREEDY)
        assert out.tokens == ar.tokens
        assert out.finished_by == "max_new_tokens" and out.prompt_len == 5
        assert sum(r.emitted for r in out.rounds) == 12
        assert all(r.proposed <= k for r in out.rounds)
    assert draft.generation_config.to_dict() == before, "the draft's generation_config must be restored"


def test_assisted_decoder_eos_and_sampling(pair):
    target, draft = pair
    backend = hf_assisted_decoder()
    prompt = torch.tensor([[3, 1, 4]])
    ar = autoregressive_decode(target, prompt, max_new_tokens=10)
    eos = ar.tokens[4]
    out = backend.decode(target, draft, prompt, k=3, max_new_tokens=10, sampling=GREEDY, eos_id=eos)
    assert out.tokens == ar.tokens[: ar.tokens.index(eos) + 1] and out.finished_by == "eos"
    cfg = SamplingConfig(temperature=0.8, top_k=5)
    a = backend.decode(target, draft, prompt, k=2, max_new_tokens=8, sampling=cfg, generator=torch.Generator().manual_seed(9))
    b = backend.decode(target, draft, prompt, k=2, max_new_tokens=8, sampling=cfg, generator=torch.Generator().manual_seed(9))
    assert a.tokens == b.tokens and len(a.tokens) == 8 and all(0 <= t < 16 for t in a.tokens)


def test_assisted_decoder_rejects_bad_input(pair):
    target, draft = pair
    with pytest.raises(ValueError):
        hf_assisted_decoder().decode(target, draft, torch.tensor([[1, 2]]), k=0, max_new_tokens=4, sampling=GREEDY)


def test_verdict_exists_and_names_transformers_version():
    text = VERDICT.read_text()
    assert transformers_version() in text
    for name in ("hf_verifier", "hf_cache", "hf_assisted_decoder"):
        assert name in text
