"""Tiny seeded models: determinism, arch coverage, draft agreement ordering, init_scale peakedness."""

from __future__ import annotations

import json

import pytest
import torch

from specdec_ref.models import (
    ARCHS,
    acceptance_rate,
    build_from_recipe,
    distribution_stats,
    make_draft,
    model_dims,
    next_token_logits,
    peakedness,
    recipe_json,
    tiny_lm,
)

PROMPT = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]])



def _same_params(a, b) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def target(arch):
    return tiny_lm(arch)


def test_seed_determinism_and_global_rng_untouched(arch):
    state = torch.random.get_rng_state()
    a = tiny_lm(arch, seed=7)
    b = tiny_lm(arch, seed=7)
    c = tiny_lm(arch, seed=8)
    assert torch.equal(state, torch.random.get_rng_state()), "tiny_lm must not consume the global RNG"
    assert _same_params(a, b)
    assert not _same_params(a, c)
    assert torch.equal(next_token_logits(a, PROMPT), next_token_logits(b, PROMPT))


def test_arch_coverage(arch, target):
    expected_cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gpt2": "GPT2LMHeadModel"}[arch]
    assert type(target).__name__ == expected_cls
    assert not target.training
    assert target.config._attn_implementation == "eager"
    assert target.get_output_embeddings().weight is not target.get_input_embeddings().weight
    dims = model_dims(target)
    assert dims["vocab_size"] == 16 and dims["num_layers"] == 2 and dims["max_positions"] == 256
    assert dims["num_kv_heads"] == (4 if arch == "gpt2" else 2)
    logits = next_token_logits(target, PROMPT)
    assert logits.shape == (1, PROMPT.shape[1], 16) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # 1-D ids are accepted as a batch of one; batch rows are independent
    assert torch.equal(next_token_logits(target, PROMPT[0]), logits)
    two = next_token_logits(target, torch.cat([PROMPT, PROMPT.flip(1)]))
    torch.testing.assert_close(two[:1], logits, atol=1e-5, rtol=1e-5)


def test_next_token_logits_is_causal_and_high_precision_agrees(target):
    full = next_token_logits(target, PROMPT)
    prefix = next_token_logits(target, PROMPT[:, :10])
    torch.testing.assert_close(full[:, :10], prefix, atol=1e-5, rtol=1e-5)
    hp = next_token_logits(target, PROMPT, high_precision=True)
    assert hp.dtype == torch.float64
    torch.testing.assert_close(hp.float(), full, atol=1e-4, rtol=1e-4)
    assert next(target.parameters()).dtype == torch.float32  # the oracle upcasts a copy


def test_recipe_roundtrip(arch, target):
    recipe = json.loads(recipe_json(target))
    assert recipe["kind"] == "tiny_lm" and recipe["arch"] == arch and recipe["seed"] == 0
    assert _same_params(build_from_recipe(recipe_json(target)), target)
    for family, kw in (("identical", {}), ("noisy", {"noise": 0.2, "seed": 5}), ("independent", {"seed": 9})):
        draft = make_draft(target, family, **kw)
        rebuilt = build_from_recipe(json.dumps(draft.specdec_recipe))
        assert _same_params(rebuilt, draft), family
        assert draft.specdec_recipe["target"] == target.specdec_recipe


def test_draft_agreement_ordering(arch, target):
    identical = acceptance_rate(target, make_draft(target, "identical"), PROMPT)
    small = acceptance_rate(target, make_draft(target, "noisy", noise=0.02), PROMPT)
    large = acceptance_rate(target, make_draft(target, "noisy", noise=0.5), PROMPT)
    indep = acceptance_rate(target, make_draft(target, "independent", seed=1), PROMPT)
    assert identical == {"alpha": 1.0, "greedy": 1.0}
    assert 1.0 > small["alpha"] > large["alpha"] > indep["alpha"]
    assert small["alpha"] > 0.9
    assert small["greedy"] >= indep["greedy"]


def test_noisy_draft_is_deterministic_and_noise_zero_is_identical(target):
    a = make_draft(target, "noisy", noise=0.1, seed=3)
    b = make_draft(target, "noisy", noise=0.1, seed=3)
    c = make_draft(target, "noisy", noise=0.1, seed=4)
    assert _same_params(a, b) and not _same_params(a, c)
    assert _same_params(make_draft(target, "noisy", noise=0.0), target)
    assert not _same_params(a, target)


def test_independent_draft_can_be_smaller(target):
    draft = make_draft(target, "independent", seed=2, hidden_size=16, num_layers=1)
    dims = model_dims(draft)
    assert dims["num_layers"] == 1 and dims["vocab_size"] == 16
    assert next_token_logits(draft, PROMPT).shape == (1, PROMPT.shape[1], 16)
    with pytest.raises(ValueError, match="vocab"):
        make_draft(target, "independent", vocab_size=32)


def test_init_scale_controls_peakedness(arch):
    flat = peakedness(tiny_lm(arch, init_scale=0.25), PROMPT)
    base = peakedness(tiny_lm(arch, init_scale=1.0), PROMPT)
    sharp = peakedness(tiny_lm(arch, init_scale=4.0), PROMPT)
    assert 1 / 16 < flat < base < sharp < 1
    stats_flat = distribution_stats(tiny_lm(arch, init_scale=0.25), PROMPT)
    stats_sharp = distribution_stats(tiny_lm(arch, init_scale=4.0), PROMPT)
    assert stats_flat["mean_entropy"] > stats_sharp["mean_entropy"]
    assert stats_flat["mean_top1_top2_gap"] < stats_sharp["mean_top1_top2_gap"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="arch"):
        tiny_lm("mamba")
    with pytest.raises(ValueError, match="divisible"):
        tiny_lm("llama", hidden_size=30, num_heads=4)
    target = tiny_lm("llama")
    with pytest.raises(ValueError, match="family"):
        make_draft(target, "clone")
    with pytest.raises(ValueError, match="independent"):
        make_draft(target, "noisy", hidden_size=16)
    with pytest.raises(ValueError, match="n >= 1"):
        next_token_logits(target, torch.zeros((1, 0), dtype=torch.long))


def test_dtype_and_recipe_dtype():
    m = tiny_lm("qwen2", dtype="bfloat16")
    assert next(m.parameters()).dtype == torch.bfloat16
    assert m.specdec_recipe["dtype"] == "bfloat16"
    assert next_token_logits(m, PROMPT).dtype == torch.float32


def test_model_dims_follow_config_changes():
    """model_dims is memoised per model; a changed config field (or a new config) is never served stale."""
    model = tiny_lm("llama", vocab_size=16, seed=0)
    assert model_dims(model)["max_positions"] == 256
    model.config.max_position_embeddings = 64
    assert model_dims(model)["max_positions"] == 64
    dims = model_dims(model)
    dims["vocab_size"] = 99  # callers get a copy
    assert model_dims(model)["vocab_size"] == 16
    model.config = type(model.config)(**{**model.config.to_dict(), "vocab_size": 32})
    assert model_dims(model)["vocab_size"] == 32
