"""The tree decoder drafting with Medusa heads (specdec_ref.tree_heads) and the exact greedy tree of a round
(properties.proposals.greedy_tree_round)."""
import pytest
import torch

from fixtures.mutants.tree_decoder import TreeMedusaFeatureOfLastNode
from properties.proposals import greedy_tree_round, law_of
from specdec_ref.contract import NotSupportedError
from specdec_ref.decode import autoregressive_decode
from specdec_ref.exact_heads import exact_eagle_head, exact_medusa_heads
from specdec_ref.exact_models import exact_model, exact_pair
from specdec_ref.proposers import Ngram
from specdec_ref.tree_decode import TreeSpeculativeDecoder
from specdec_ref.warp import GREEDY, SamplingConfig

TARGET = "order1-target"
SHAPES = ((1, 2), (2, 2), (3, 2), (3, 3), (2, 4), (5, 2))


@pytest.fixture(scope="module")
def target():
    return exact_pair("order1-close").target.load(torch.float32)


def _rounds(decoder, target, spec, prompt, depth, width, **kw):
    seen = []
    res = decoder.decode(target, spec, torch.tensor([prompt]), depth=depth, width=width, max_new_tokens=20,
                         on_round=lambda r, t, d: seen.append((r.target_len, d.tentative_length, r.committed_len)), **kw)
    return res, seen


def test_greedy_medusa_trees_equal_ar_and_follow_the_exact_tree(target):
    """Greedy: the output is AR's, the caches' invariant holds after every round, and every round but the last drafts
    and accepts exactly what the text determines (depth 5 on three heads: capped at three levels)."""
    spec, dec = exact_medusa_heads(target, TARGET, heads=3), TreeSpeculativeDecoder()
    law, table = law_of(spec, TARGET), exact_model(TARGET)
    checked = 0
    for prompt in ([3], [5, 2], [1, 2, 1, 2], [0, 6, 4]):
        want = autoregressive_decode(target, torch.tensor([prompt]), max_new_tokens=20).tokens
        for depth, width in SHAPES:
            res, seen = _rounds(dec, target, spec, prompt, depth, width)
            assert res.tokens == want, (prompt, depth, width)
            assert all(t == d == c - 1 for t, d, c in seen), seen
            text = prompt + res.tokens
            assert res.rounds[0].proposed == (0 if len(prompt) == 1 else res.rounds[0].proposed)
            for r in res.rounds[:-1]:
                expected = greedy_tree_round(table, law, text[: r.start], depth, width)
                if expected is not None:
                    checked += 1
                    assert (r.proposed, r.accepted) == expected, (prompt, depth, width, r)
            assert max(r.accepted for r in res.rounds) <= 3
    assert checked >= 100


def test_sampled_medusa_trees_keep_the_invariant_and_report_phases(target):
    spec = exact_medusa_heads(target, TARGET, heads=3, sample=True)
    res, seen = _rounds(TreeSpeculativeDecoder(), target, spec, [2, 5], 3, 2, sampling=SamplingConfig(temperature=1.0),
                        generator=torch.Generator().manual_seed(0), timed=True)
    assert len(res.tokens) == 20 and all(t == d == c - 1 for t, d, c in seen)
    assert set(res.seconds) == {"prefill", "draft", "verify", "repair"}


def test_the_feature_of_the_blocks_last_node_changes_the_trees(target):
    """The rollback bug the greedy tree check is built for (the next round's feature from the block's last node, not
    the last accepted one) changes the trees of many rounds, not just one by accident."""
    spec = exact_medusa_heads(target, TARGET, heads=3)
    changed = 0
    for prompt in ([3], [5, 2], [1, 2, 1, 2], [0, 6, 4]):
        for depth, width in SHAPES[:5]:
            good, _ = _rounds(TreeSpeculativeDecoder(), target, spec, prompt, depth, width)
            bad, _ = _rounds(TreeMedusaFeatureOfLastNode(), target, spec, prompt, depth, width)
            assert bad.tokens == good.tokens  # greedy output stays exact
            changed += sum((a.proposed, a.accepted) != (b.proposed, b.accepted) for a, b in zip(good.rounds, bad.rounds))
    assert changed >= 20, changed


def test_chain_proposers_are_refused_by_name(target):
    dec = TreeSpeculativeDecoder()
    for spec, kind in ((Ngram(1, 2), "ngram"), (exact_eagle_head(target, TARGET), "eagle")):
        with pytest.raises(NotSupportedError, match=f"not {kind}"):
            dec.decode(target, spec, torch.tensor([[1, 2]]), depth=2, width=2, max_new_tokens=4, sampling=GREEDY)
