"""The wide exact pair (specdec_ref.wide_exact): its logits are the order1 tables bit for bit, at any width and depth,
through the transformers forward and the lean static-cache forward, at any position."""
from __future__ import annotations

import pytest
import torch

from specdec_ref.exact_models import EXACT_MODELS
from specdec_ref.static_cache import fastest_cache
from specdec_ref.wide_exact import WideSpec, build_wide_exact, wide_exact_pair

SMALL = WideSpec(hidden=128, intermediate=256, layers=3, heads=4, max_positions=512)  # 128 = 2 x 8^2: two dims per token


def _table_logits(name: str, ids: torch.Tensor) -> torch.Tensor:
    """The order1 law after every prefix of ``ids``: ``T[last token]`` (the shipped checkpoints stop at 128 positions,
    the law does not: it ignores position), checked against ExactModel.next_logits on the first 128."""
    exact = EXACT_MODELS[name]
    rows = torch.from_numpy(exact.table[ids[0].numpy()]).float()
    assert torch.equal(rows[:128], exact.next_logits([ids[0, : i + 1].tolist() for i in range(128)]).float())
    return rows


@pytest.mark.parametrize("name,spec", [("order1-target", SMALL), ("order1-draft-close", WideSpec(64, 128, 1, 2, 512))])
def test_logits_equal_the_table_bit_for_bit(name, spec):
    model = build_wide_exact(name, spec, seed=3)
    ids = torch.randint(0, 8, (1, 300), generator=torch.Generator().manual_seed(0))
    table = _table_logits(name, ids)
    assert torch.equal(model(ids).logits[0], table)
    cache = fastest_cache(model, check_ids=False, max_length=400)
    lean = torch.cat([cache.feed(ids[:, :200]), cache.feed(ids[:, 200:201]), cache.feed(ids[:, 201:])], 1)[0]
    assert torch.equal(lean, table)


def test_the_work_is_real():
    model = build_wide_exact("order1-target", SMALL)
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.abs().sum() > 0 and layer.mlp.up_proj.weight.abs().sum() > 0
    assert sum(p.numel() for p in model.parameters()) > 3 * 128 * 128 * 4


def test_default_pair_shapes_and_bad_width():
    target, draft = wide_exact_pair(WideSpec(256, 512, 2, 4), WideSpec(64, 128, 1, 2))
    assert target.config.hidden_size == 256 and draft.config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="no room"):
        build_wide_exact("order1-target", WideSpec(hidden=4, intermediate=8, layers=1, heads=1))
    with pytest.raises(ValueError, match="order1"):
        build_wide_exact("order2-target", SMALL)
