"""The reference forward (``specdec_ref.forward``): ids coercion, weight fingerprints, cached copies, oracles."""
import copy
import gc

import pytest
import torch

from specdec_ref.forward import (
    as_ids,
    as_prompt,
    check_id_range,
    fresh_prefill,
    model_copy,
    reference_logits,
    token_list,
    WeightsWatch,
    weights_fingerprint,
)
from specdec_ref.models import ARCHS, model_dims, tiny_lm
from specdec_ref.warp import (
    GREEDY,
    SamplingConfig,
    nucleus_masses,
    scale_temperature,
    top_k_filter,
    top_p_filter,
    warp,
    warp_logits,
)

IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_lm(request.param, seed=2, init_scale=2.0)


def _old_high_precision(model, ids):
    """The float64 oracle as ``next_token_logits(high_precision=True)`` computed it before."""
    run = copy.deepcopy(model).to(torch.float64)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    with torch.no_grad():
        return run(input_ids=ids, position_ids=positions, use_cache=False).logits.to(torch.float64)


# --------------------------------------------------------------------------- reference_logits


def test_float64_logits_equal_the_old_deep_copy_computation(model):
    z64 = reference_logits(model, IDS, dtype=torch.float64)
    assert z64.dtype == torch.float64 and z64.shape == (2, IDS.shape[1], 16)
    assert torch.equal(z64, _old_high_precision(model, IDS))
    assert next(model.parameters()).dtype == torch.float32  # a copy is upcast, not the model


def test_default_runs_the_model_itself_and_returns_float32(model):
    with torch.no_grad():
        direct = model(input_ids=IDS, position_ids=torch.arange(8).expand(2, -1), use_cache=False).logits
    z = reference_logits(model, IDS)
    assert z.dtype == torch.float32 and torch.equal(z, direct)
    assert torch.equal(reference_logits(model, IDS[0]), reference_logits(model, IDS[:1]))  # [n]: a batch of one
    assert torch.equal(reference_logits(model, IDS.tolist()), z)  # lists are accepted
    bf16 = tiny_lm("llama", dtype="bfloat16")
    assert reference_logits(bf16, IDS).dtype == torch.float32
    assert reference_logits(bf16, IDS, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_rows_are_causal(model):
    full = reference_logits(model, IDS, dtype=torch.float64)
    head = reference_logits(model, IDS[:, :5], dtype=torch.float64)
    torch.testing.assert_close(full[:, :5], head, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- fresh_prefill


def test_fresh_prefill_shapes_and_logits(model):
    dims = model_dims(model)
    tokens = IDS[0].tolist()
    logits, kv = fresh_prefill(model, tokens)
    assert logits.dtype == torch.float32 and logits.shape == (1, len(tokens), dims["vocab_size"])
    assert len(kv) == dims["num_layers"]
    for k, v in kv:
        assert k.shape == v.shape == (1, dims["num_kv_heads"], len(tokens), dims["head_dim"])
        assert k.dtype == v.dtype == torch.float32
    torch.testing.assert_close(logits, reference_logits(model, [tokens]), atol=1e-5, rtol=1e-4)
    same_logits, same_kv = fresh_prefill(model, torch.tensor(tokens))  # a tensor works too
    assert torch.equal(same_logits, logits) and all(torch.equal(a[0], b[0]) for a, b in zip(same_kv, kv))


def test_fresh_prefill_of_nothing(model):
    dims = model_dims(model)
    logits, kv = fresh_prefill(model, [])
    assert logits is None and len(kv) == dims["num_layers"]
    for k, v in kv:
        assert k.shape == v.shape == (1, dims["num_kv_heads"], 0, dims["head_dim"])
    with pytest.raises(ValueError, match="batch 1"):
        fresh_prefill(model, [[1, 2], [3, 4]])


# --------------------------------------------------------------------------- ids


def test_as_ids_accepts_tensors_and_lists():
    assert torch.equal(as_ids([1, 2, 3]), torch.tensor([[1, 2, 3]]))
    assert torch.equal(as_ids((1, 2)), torch.tensor([[1, 2]]))
    assert torch.equal(as_ids([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 4]]))
    out = as_ids(torch.tensor([5, 6], dtype=torch.int32), vocab=7)
    assert out.dtype == torch.long and out.shape == (1, 2)
    assert torch.equal(as_ids(IDS), IDS)
    assert torch.equal(as_prompt([4, 5]), torch.tensor([[4, 5]]))
    assert as_ids([[]], allow_empty=True).shape == (1, 0)


@pytest.mark.parametrize(
    "bad, kwargs, match",
    [
        ([], {}, "ids is empty"),
        (torch.zeros((1, 0), dtype=torch.long), {}, r"n >= 1"),
        (torch.zeros((0, 3), dtype=torch.long), {}, "empty"),
        (torch.tensor(3), {}, r"\[B, n\] \(or \[n\]\) with n >= 1, got shape \(\)"),
        (torch.zeros((1, 1, 2), dtype=torch.long), {}, r"got shape \(1, 1, 2\)"),
        (torch.tensor([[1.0, 2.0]]), {}, "ids must be a LongTensor.*float32"),
        ([1.5, 2], {}, "float"),
        (torch.tensor([True, False]), {}, "bool"),
        ([[1, 2], [3]], {}, "list of token ids"),
        ("12", {}, "got str"),
        (7, {}, "got int"),
        ([1, 16], {"vocab": 16}, r"token ids must be in \[0, 16\), got min 1, max 16"),
        ([-1, 2], {"vocab": 16}, "min -1"),
        ([[1], [2]], {"batch": 1, "what": "prompt"}, r"prompt must have shape \[1, n\] \(batch 1\)"),
    ],
)
def test_as_ids_errors(bad, kwargs, match):
    with pytest.raises(ValueError, match=match):
        as_ids(bad, **kwargs)


def test_as_prompt_messages_name_the_prompt():
    with pytest.raises(ValueError, match="prompt is empty"):
        as_prompt(torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match="prompt token ids must be in"):
        as_prompt([1, 99], vocab=16)
    with pytest.raises(ValueError, match="prompt must be"):
        as_prompt(torch.tensor([[1.0]]))


def test_token_list_and_check_id_range():
    assert token_list(torch.tensor([[1, 2, 3]])) == [1, 2, 3]
    assert token_list((4, 5)) == [4, 5] and token_list(range(3)) == [0, 1, 2]
    assert token_list([]) == [] and token_list(torch.zeros(0, dtype=torch.long)) == []
    with pytest.raises(ValueError, match="float"):
        token_list(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"byte token ids must be in \[0, 256\)"):
        token_list([300], vocab=256, what="byte")
    check_id_range(torch.zeros(0, dtype=torch.long), 1)  # nothing to check
    check_id_range(torch.tensor([[0, 15]]), 16)
    check_id_range(torch.tensor([[99]]), None)
    with pytest.raises(ValueError, match=r"feed: token ids must be in \[0, 16\), got min 0, max 16"):
        check_id_range(torch.tensor([[0, 16]]), 16, "feed:")


# --------------------------------------------------------------------------- fingerprints and the copy cache


def test_fingerprint_tracks_in_place_edits_and_replacement():
    m = tiny_lm("llama")
    fp = weights_fingerprint(m)
    assert weights_fingerprint(m) == fp
    with torch.no_grad():
        m.lm_head.weight[0, 0] += 1.0
    fp2 = weights_fingerprint(m)
    assert fp2 != fp
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone(), requires_grad=False)
    assert weights_fingerprint(m) != fp2


@pytest.mark.parametrize(
    "change",
    ["in_place", "parameter_replaced", "submodule_replaced", "cast"],
)
def test_weights_watch_sees_what_the_fingerprint_sees(change):
    """The static cache's cheap staleness check fires on every event the fingerprint sees (an unseen change would
    decode with stale fused weights: a silent wrong answer)."""
    m = tiny_lm("llama", seed=3)
    watch = WeightsWatch(m)
    fp = weights_fingerprint(m)
    assert watch.unchanged()
    if change == "in_place":
        with torch.no_grad():
            m.model.layers[0].mlp.down_proj.weight[0, 0] += 1.0
    elif change == "parameter_replaced":
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone(), requires_grad=False)
    elif change == "submodule_replaced":
        m.model.layers[0].self_attn.q_proj = copy.deepcopy(m.model.layers[0].self_attn.q_proj)
    else:
        m.to(torch.bfloat16)
    assert weights_fingerprint(m) != fp
    assert not watch.unchanged(), change


def test_static_cache_refuses_stale_fused_weights():
    """A cache opened after a parameter was replaced computes with the new weights (fused copies are re-made)."""
    from specdec_ref.static_cache import StaticModelCache

    m = tiny_lm("llama", seed=4)
    ids = torch.tensor([[1, 2, 3]])
    before = StaticModelCache(m).feed(ids)
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach() * 2, requires_grad=False)
    after = StaticModelCache(m).feed(ids)
    assert not torch.allclose(before, after)
    assert torch.allclose(after, m(ids).logits.float(), atol=1e-5, rtol=1e-4)


def test_model_copy_is_cached_and_invalidated_by_an_in_place_edit():
    m = tiny_lm("qwen2", seed=5)
    first = model_copy(m)
    assert model_copy(m) is first and model_copy(m, torch.float64) is first
    assert next(first.parameters()).dtype == torch.float64 and not first.training
    assert all(not p.requires_grad for p in first.parameters())
    half = model_copy(m, torch.bfloat16)  # one cached copy per dtype
    assert half is not first and next(half.parameters()).dtype == torch.bfloat16 and model_copy(m) is first
    before = reference_logits(m, IDS, dtype=torch.float64)
    with torch.no_grad():
        m.lm_head.weight[0].add_(1.0)
    second = model_copy(m)
    assert second is not first
    after = reference_logits(m, IDS, dtype=torch.float64)
    assert not torch.equal(after, before)
    assert torch.equal(after, _old_high_precision(m, IDS))


def test_model_copy_dies_with_its_model():
    from specdec_ref import forward

    m = tiny_lm("llama")
    model_copy(m)
    assert m in forward._COPIES
    n = len(forward._COPIES)
    del m
    gc.collect()
    assert len(forward._COPIES) == n - 1


# --------------------------------------------------------------------------- warp steps

CONFIGS = [
    SamplingConfig(),
    SamplingConfig(temperature=0.7),
    SamplingConfig(top_k=3),
    SamplingConfig(top_k=16),
    SamplingConfig(top_p=0.8),
    SamplingConfig(top_p=1.0),
    SamplingConfig(temperature=1.3, top_k=5, top_p=0.9),
    SamplingConfig(temperature=0.5, top_p=0.3),
]


@pytest.mark.parametrize("config", CONFIGS + [GREEDY], ids=lambda c: str(c.as_dict()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_warp_steps_compose_to_warp(config, dtype):
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(11)) * 3
    x[0, 0, :5] = 2.0  # a tie at the top-k cut
    if config.greedy:
        steps = x.to(dtype)
    else:
        steps = top_p_filter(top_k_filter(scale_temperature(x.to(dtype), config.temperature), config.top_k), config.top_p)
    assert torch.equal(warp_logits(x, config, dtype), steps)
    assert torch.equal(warp(x, config, dtype), torch.softmax(steps, dim=-1))


def test_warp_steps_semantics():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    assert scale_temperature(x, 1.0) is x
    assert torch.equal(scale_temperature(x, 2.0), x / 2)
    assert top_k_filter(x, None) is x and top_k_filter(x, 5) is x
    assert torch.isinf(top_k_filter(x, 2)).tolist() == [[False, True, False, False, True]]  # tie at k kept
    assert top_p_filter(x, None) is x and top_p_filter(x, 1.0) is x
    kept = ~torch.isinf(top_p_filter(x, 0.5))
    order, sorted_p, before = nucleus_masses(x)
    assert torch.equal(before, sorted_p.cumsum(-1) - sorted_p) and int(order[0, 0]) == 0
    assert kept[0, 0] and int(kept.sum()) == int((before < 0.5).sum())
