"""The wide exact pair (specdec_ref.exact.wide): its logits are the order1 tables bit for bit, at any width and depth,
through the transformers forward and the lean static-cache forward, at any position."""
from __future__ import annotations

import pytest
import torch

from specdec_ref.exact import EXACT_MODELS
from specdec_ref.static_cache import fastest_cache
from specdec_ref.exact.wide import WideSpec, build_wide_exact, wide_exact_pair

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


def test_the_exact_eagle_head_is_exact_on_a_wide_target():
    """The EAGLE head's fc is built from the target's embeddings (orthogonal rows of one norm), so on a wide target it
    proposes by the same float64 law as on the order-1 checkpoint, bit for bit, first step and chained."""
    import numpy as np

    from specdec_properties.proposals import law_of
    from specdec_ref.exact.heads import exact_eagle_head

    target = build_wide_exact("order1-target", SMALL)
    spec = exact_eagle_head(target, "order1-target", layer=False)
    law = law_of(spec, "order1-target")
    embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    for x in range(8):
        for y in range(8):
            h = torch.nn.functional.linear(torch.cat([embed[x], embed[y]]), spec.fc)  # the feature of y is its embedding
            assert np.array_equal(torch.nn.functional.linear(h, head).double().numpy(), law.raw([y, x], []))
            h2 = torch.nn.functional.linear(torch.cat([embed[(x + y) % 8], h]), spec.fc)
            assert np.array_equal(torch.nn.functional.linear(h2, head).double().numpy(), law.raw([y, x], [(x + y) % 8]))


@pytest.mark.parametrize("proposer", ["ngram", "eagle"])
def test_profile_with_a_proposer_without_a_draft_model(proposer):
    """``specdec-bench profile --proposer``: prompt lookup costs no draft forward (C_D = 0), the EAGLE head one decoder
    layer of the target's width; neither feeds anything in the repair (no f_k C_D term); greedy equals AR."""
    from specdec_bench.profile import profile

    wide = dict(layers=1, hidden=128, intermediate=128)
    report = profile(None, pair="wide-exact", proposer=proposer, ks=(1, 2), prompts=1, prompt_length=8, new_tokens=12,
                     repeats=1, cost_seconds=0.005, wide=wide, log=None)
    assert report["proposer"] == proposer and proposer in report["title"]
    assert report["costs"]["feeds_bonus"] == 0.0
    assert (report["costs"]["C_D"] == 0.0) == (proposer == "ngram")
    assert report["greedy_mismatches"] == 0 and report["verdict"]
    with pytest.raises(ValueError, match="wide-exact"):
        profile(None, pair="trained", proposer="eagle", ks=(1,), log=None)
