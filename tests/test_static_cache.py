"""StaticModelCache: equality with ModelCache / fresh prefills, the stateful property, greedy decode equality, speed."""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from specdec_properties.stateful_cache import compare_kv, fresh_prefill, run_cache_machine
from specdec_ref.cache import ATOL, RTOL, ModelCache
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.models import next_token_logits, tiny_lm
from specdec_ref.pretrained import load_trained_pair, sample_prompts
from specdec_ref.static_cache import StaticKV, StaticModelCache, supports

TOKENS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]


@pytest.fixture(scope="module")
def pair():
    return load_trained_pair()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2", "target", "draft"])
def model(request, pair):
    if request.param == "target":
        return pair[0]
    if request.param == "draft":
        return pair[1]
    return tiny_lm(request.param, vocab_size=16, init_scale=2.0)


def ids(tokens, batch=1):
    return torch.tensor([tokens], dtype=torch.long).expand(batch, len(tokens))


def full_forward_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=ids(tokens)).logits.float()


def assert_close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


# ---------------------------------------------------------------------- equality with ModelCache


def test_feed_matches_model_cache_and_full_forward(model):
    """Block feeds, one-token feeds and re-feeds after trims: logits equal ModelCache's and a full forward."""
    ref, static = ModelCache(model), StaticModelCache(model)
    fed: list[int] = []

    def step(block):
        start = len(fed)
        a, b = ref.feed(ids(block)), static.feed(ids(block))
        fed.extend(block)
        assert b.dtype == torch.float32 and b.shape == a.shape
        assert_close(b, a)
        assert_close(b, full_forward_logits(model, fed)[:, start:])
        compare_kv(static.layer_kv(), ref.layer_kv())

    def trim(n):
        ref.trim(n)
        static.trim(n)
        del fed[n:]
        assert static.tentative_length == ref.tentative_length == n
        compare_kv(static.layer_kv(), fresh_prefill(model, fed)[1])

    step(TOKENS[:8])  # block from 0 (plain causal)
    step(TOKENS[8:9])  # one token
    step(TOKENS[9:14])  # block on top of the cache (offset causal mask)
    trim(10)
    step(TOKENS[14:15])
    step(TOKENS[15:20])
    trim(3)
    step(TOKENS[20:24])
    trim(0)
    step(TOKENS[5:7])
    for t in TOKENS[:6]:
        step([t])


def test_commit_reset_and_validation_like_model_cache(model):
    cache = StaticModelCache(model, max_length=32)
    assert isinstance(cache.hf_cache, StaticKV) and cache.hf_cache.max_length == 32
    assert (cache.tentative_length, cache.committed_length) == (0, 0)
    for k, v in cache.layer_kv():
        assert k.shape == v.shape == (1, cache.num_kv_heads, 0, cache.head_dim)
    cache.feed(ids(TOKENS[:10]))
    cache.commit(6)
    assert (cache.tentative_length, cache.committed_length) == (6, 6)
    cache.check()
    with pytest.raises(ValueError, match=r"commit\(5\)"):
        cache.commit(5)
    with pytest.raises(ValueError, match=r"trim\(7\)"):
        cache.trim(7)
    with pytest.raises(TypeError, match="Python int"):
        cache.trim(True)
    with pytest.raises(TypeError, match="Python int"):
        cache.trim(torch.tensor(2))
    with pytest.raises(ValueError, match="batch"):
        cache.feed(ids(TOKENS[:2], batch=2))
    with pytest.raises(ValueError, match="empty"):
        cache.feed(torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must be in"):
        cache.feed(ids([cache.vocab_size]))
    with pytest.raises(ValueError, match="exceed"):
        cache.feed(ids([1] * 27))  # 6 + 27 > max_length 32
    cache.feed(ids([1] * 26))  # exactly fills the buffers
    assert cache.tentative_length == 32
    cache.trim(2)
    assert cache.committed_length == 2
    cache.reset()
    assert (cache.tentative_length, cache.committed_length) == (0, 0)
    logits = cache.feed(ids(TOKENS[:5]))
    assert_close(logits, full_forward_logits(model, TOKENS[:5]))
    with pytest.raises(ValueError, match="max_length"):
        StaticModelCache(model, max_length=model.config.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="max_length"):
        StaticModelCache(model, max_length=0)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_batch_rows_match_model_cache(arch):
    model = tiny_lm(arch, vocab_size=16, init_scale=2.0)
    ref, static = ModelCache(model, batch_size=2), StaticModelCache(model, batch_size=2)
    x = torch.tensor([TOKENS[:6], TOKENS[6:12]])
    assert_close(static.feed(x), ref.feed(x))
    ref.trim(4), static.trim(4)
    y = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert_close(static.feed(y), ref.feed(y))
    compare_kv(static.layer_kv(), ref.layer_kv())


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_bfloat16_close_to_model_cache(arch):
    model = tiny_lm(arch, vocab_size=16, init_scale=2.0, dtype=torch.bfloat16)
    ref, static = ModelCache(model), StaticModelCache(model)
    a = torch.cat([ref.feed(ids(TOKENS[:8])), ref.feed(ids(TOKENS[8:9]))], 1)
    b = torch.cat([static.feed(ids(TOKENS[:8])), static.feed(ids(TOKENS[8:9]))], 1)
    assert b.dtype == torch.float32
    assert static.layer_kv()[0][0].dtype == torch.bfloat16
    torch.testing.assert_close(b, a, atol=0.1, rtol=0.05)


def test_logits_are_ordinary_tensors(model):
    """Computed under inference_mode, returned as normal tensors callers may modify in place."""
    logits = StaticModelCache(model).feed(ids(TOKENS[:3]))
    assert not logits.is_inference()
    logits.add_(1.0)


# ---------------------------------------------------------------------- the stateful property


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_stateful_machine(arch):
    model = tiny_lm(arch, vocab_size=16, init_scale=2.0)
    run_cache_machine(lambda: StaticModelCache(model), model)


def test_stateful_machine_batch2_short_buffers():
    model = tiny_lm("llama", vocab_size=16, init_scale=2.0)
    run_cache_machine(lambda: StaticModelCache(model, batch_size=2, max_length=40), model, batch_size=2)


# ---------------------------------------------------------------------- unsupported archs


def test_unsupported_gpt2_variants_raise_clear_errors():
    """GPT-2 runs lean with the tanh GELU and no cross-attention; another activation or the reordered upcast attention
    gets a named error (the verdict follows a config changed after a cache was opened)."""
    model = tiny_lm("gpt2", vocab_size=16)
    assert supports(model)
    StaticModelCache(model)
    model.config.activation_function = "relu"
    assert not supports(model)
    with pytest.raises(ValueError, match=r"GPT-2 with the tanh GELU only .*'relu'"):
        StaticModelCache(model)
    model.config.activation_function = "gelu_new"
    model.config.reorder_and_upcast_attn = True
    with pytest.raises(ValueError, match=r"reorder_and_upcast_attn=True"):
        StaticModelCache(model)
    model.config.reorder_and_upcast_attn = False
    model.config.model_type = "opt"
    with pytest.raises(ValueError, match=r"StaticModelCache supports llama, qwen2 and gpt2 configs, got .*opt"):
        StaticModelCache(model)


def test_supports(pair):
    assert supports(pair[0]) and supports(pair[1])
    assert supports(tiny_lm("llama")) and supports(tiny_lm("qwen2")) and supports(tiny_lm("gpt2"))


# ---------------------------------------------------------------------- end to end


def test_greedy_speculative_equals_autoregressive(pair):
    target, draft = pair
    decoder = SpeculativeDecoder(make_cache=StaticModelCache)
    for prompt in sample_prompts(4, length=64, seed=0):
        spec = decoder.decode(target, draft, prompt, k=4, max_new_tokens=64)
        ar = autoregressive_decode(target, prompt, max_new_tokens=64)
        assert spec.tokens == ar.tokens
        assert len(spec.tokens) == 64


def greedy_static(target, prompt, max_new_tokens):
    """autoregressive_decode's greedy loop on a StaticModelCache (that function hard-codes ModelCache)."""
    cache = StaticModelCache(target, check_ids=False)
    logits = cache.feed(prompt)[:, -1]
    tokens = []
    while True:
        token = logits.argmax(-1)
        tokens.append(int(token.item()))
        if len(tokens) == max_new_tokens:
            return tokens
        logits = cache.feed(token[:, None])[:, -1]


def test_greedy_static_loop_equals_autoregressive(pair):
    prompt = sample_prompts(1, length=64, seed=0)[0]
    assert greedy_static(pair[0], prompt, 64) == autoregressive_decode(pair[0], prompt, max_new_tokens=64).tokens


# ---------------------------------------------------------------------- speed (printed, not asserted)


def _median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def test_speed_report(pair, capsys):
    prompt = sample_prompts(1, length=64, seed=0)[0]
    lines = []
    for name, model in zip(("target", "draft"), pair):
        caches = {"ModelCache": ModelCache(model, check_ids=False), "StaticModelCache": StaticModelCache(model, check_ids=False)}
        for c in caches.values():
            c.feed(prompt)
        one = prompt[:, -1:]
        times = {k: [] for k in caches}
        for _ in range(5):  # interleaved repeats
            for key, c in caches.items():
                times[key].append(_median_ms(lambda c=c: (c.feed(one), c.trim(64)), 100))
        med = {k: statistics.median(v) for k, v in times.items()}
        lines.append(
            f"{name}: one-token feed ModelCache {med['ModelCache']:.3f} ms, StaticModelCache "
            f"{med['StaticModelCache']:.3f} ms ({med['ModelCache'] / med['StaticModelCache']:.2f}x)"
        )
    target, draft = pair
    prompts = sample_prompts(2, length=64, seed=0)
    runs = {
        "AR ModelCache": lambda p: autoregressive_decode(target, p, max_new_tokens=64),
        "AR StaticModelCache": lambda p: greedy_static(target, p, 64),
        "spec ModelCache": lambda p: SpeculativeDecoder().decode(target, draft, p, k=4, max_new_tokens=64),
        "spec StaticModelCache": lambda p: SpeculativeDecoder(make_cache=StaticModelCache).decode(
            target, draft, p, k=4, max_new_tokens=64
        ),
    }
    tps = {k: [] for k in runs}
    for _ in range(3):
        for key, fn in runs.items():
            for p in prompts:
                t0 = time.perf_counter()
                out = fn(p)
                n = len(out if isinstance(out, list) else out.tokens)
                tps[key].append(n / (time.perf_counter() - t0))
    for key, v in tps.items():
        lines.append(f"{key}: {statistics.median(v):.0f} tokens/s (spec: k=4; 64 new tokens; median)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_fused_weights_are_shared_and_invalidated_by_in_place_changes():
    model = tiny_lm("llama", vocab_size=16, seed=3)
    first, second = StaticModelCache(model), StaticModelCache(model)
    ids = torch.tensor([[1, 2, 3]])
    before = first.feed(ids)
    assert second._layers is first._layers  # not re-fused for the second cache
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
    third = StaticModelCache(model)
    assert third._layers is not first._layers
    after = third.feed(ids)
    expected = next_token_logits(model, ids)
    assert not torch.allclose(before, after) and torch.allclose(after, expected, atol=1e-5, rtol=1e-4)


def test_rope_tables_are_shared_per_length_and_rebuilt_when_inv_freq_changes():
    model = tiny_lm("llama", vocab_size=16, seed=3)
    first, second = StaticModelCache(model, max_length=12), StaticModelCache(model, max_length=12)
    assert second._cos is first._cos and second._causal is first._causal  # not recomputed per cache
    assert StaticModelCache(model, max_length=8)._cos.shape[1] == 8
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model.model.rotary_emb.inv_freq.mul_(2.0)  # a different RoPE: the tables must follow
    third = StaticModelCache(model, max_length=12)
    assert third._cos is not first._cos
    torch.testing.assert_close(third.feed(ids), next_token_logits(model, ids), atol=1e-5, rtol=1e-4)


def test_support_verdict_follows_a_config_change_after_a_cache_was_opened():
    """The memoised support verdict is re-decided when a field it reads changes: a config that stops being supported
    gets the named error, never a lean forward of the wrong architecture."""
    from specdec_ref.models import tiny_lm
    from specdec_ref.static_cache import StaticModelCache, supports

    m = tiny_lm("llama", seed=9)
    StaticModelCache(m)
    m.config.hidden_act = "gelu"
    assert not supports(m)
    with pytest.raises(ValueError, match="SiLU MLP only"):
        StaticModelCache(m)
    m.config.hidden_act = "silu"
    assert supports(m)
