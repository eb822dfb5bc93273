"""The tree decoder drafting with heads (specdec_ref.tree_heads: Medusa, EAGLE, EAGLE-3, MTP) and the exact greedy
tree of a round (specdec_properties.tree_proposals.greedy_tree_round)."""
import pytest
import torch

from specdec_fixtures.mutants.tree_decoder import (TreeHeadFeaturesOfBlockEnd, TreeMedusaFeatureOfLastNode,
                                           TreeNodeFedFirstNodesFeature)
from specdec_properties.proposals import law_of
from specdec_properties.tree_proposals import greedy_tree_round
from specdec_ref.contract import NotSupportedError
from specdec_ref.decode import autoregressive_decode
from specdec_ref.exact.deep import deep_target
from specdec_ref.exact.heads import exact_eagle3_head, exact_eagle_head, exact_medusa_heads, exact_mtp_head
from specdec_ref.exact import exact_model, exact_pair
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


def test_prompt_lookup_is_refused_by_name(target):
    with pytest.raises(NotSupportedError, match="not ngram"):
        TreeSpeculativeDecoder().decode(target, Ngram(1, 2), torch.tensor([[1, 2]]), depth=2, width=2, max_new_tokens=4,
                                        sampling=GREEDY)


def _head(kind, target, sample=False):
    """The exactly-known head of ``kind`` and the target it drafts for (EAGLE-3 fuses layers of the deep target)."""
    if kind == "eagle3":
        deep = deep_target(TARGET, layers=3)
        return exact_eagle3_head(deep, TARGET, sample=sample), deep
    if kind == "medusa":
        return exact_medusa_heads(target, TARGET, heads=3, sample=sample), target
    make = {"eagle": exact_eagle_head, "mtp": exact_mtp_head}[kind]
    return make(target, TARGET, sample=sample), target


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "mtp"])
def test_greedy_head_trees_equal_ar_and_follow_the_exact_tree(target, kind):
    """Greedy trees from every head: the output is AR's, the heads' view reports the committed length after every
    round, and every round but the last drafts and accepts exactly the tree its text determines (Medusa: one row per
    level, depth 5 on three heads capped at three levels; the EAGLE family: rows that depend on the path)."""
    spec, model = _head(kind, target)
    dec, law, table = TreeSpeculativeDecoder(), law_of(spec, TARGET), exact_model(TARGET)
    checked = 0
    for prompt in ([3], [5, 2], [1, 2, 1, 2], [0, 6, 4]):
        want = autoregressive_decode(model, torch.tensor([prompt]), max_new_tokens=20).tokens
        for depth, width in SHAPES:
            res, seen = _rounds(dec, model, spec, prompt, depth, width)
            assert res.tokens == want, (prompt, depth, width)
            assert all(t == d == c - 1 for t, d, c in seen), seen
            assert res.rounds[0].proposed == 0 or len(prompt) > 1
            for r in res.rounds[:-1]:
                expected = greedy_tree_round(table, law, (prompt + res.tokens)[: r.start], depth, width)
                if expected is not None:
                    checked += 1
                    assert (r.proposed, r.accepted) == expected, (prompt, depth, width, r)
            assert kind != "medusa" or max(r.accepted for r in res.rounds) <= 3
    assert checked >= 60, checked


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_sampled_head_trees_keep_the_head_cache_to_the_committed_pairs(target, kind):
    """Sampled EAGLE / MTP trees: after every round the head's own cache holds exactly the pairs it has read (none of
    the tree's nodes), and the target's cache the committed text but the pending token."""
    spec, model = _head(kind, target, sample=True)
    lengths = []
    dec = TreeSpeculativeDecoder()
    res = dec.decode(model, spec, torch.tensor([[2, 5, 1]]), depth=3, width=2, max_new_tokens=20,
                     sampling=SamplingConfig(temperature=0.8), generator=torch.Generator().manual_seed(3),
                     on_round=lambda r, t, d: lengths.append((r.target_len, r.committed_len)))
    assert len(res.tokens) == 20 and all(t == c - 1 for t, c in lengths)
    assert sum(r.accepted for r in res.rounds) > 0


def test_a_rejected_branchs_features_change_the_head_trees(target):
    """The rollback bug of EAGLE-family trees (the committed tokens read with the block's last nodes' features) changes
    the trees of many rounds, for every head: the greedy check sees it round by round."""
    for kind in ("eagle", "eagle3", "mtp"):
        spec, model = _head(kind, target)
        changed = 0
        for prompt in ([5, 2], [1, 2, 1, 2], [0, 6, 4]):
            for depth, width in SHAPES[:5]:
                good, _ = _rounds(TreeSpeculativeDecoder(), model, spec, prompt, depth, width)
                bad, _ = _rounds(TreeHeadFeaturesOfBlockEnd(), model, spec, prompt, depth, width)
                assert bad.tokens == good.tokens
                changed += sum((a.proposed, a.accepted) != (b.proposed, b.accepted) for a, b in zip(good.rounds, bad.rounds))
        assert changed >= 5, (kind, changed)


def test_a_node_fed_another_nodes_feature_changes_the_trees_not_the_counts(target):
    """What the docs state about the expansion-feature bug (``tree_node_fed_first_nodes_feature``): from the 64
    two-token prompts, trees (3, 2), (4, 2), (3, 3), it changes the accepted counts of 2 sequences of 192 for EAGLE and
    16 for MTP, and the drafted trees (tokens and parents) of 91 and 77: only the drafts show it."""
    counts, trees = {}, {}
    for kind in ("eagle", "mtp"):
        spec, model = _head(kind, target)
        counts[kind] = trees[kind] = 0
        for shape in ((3, 2), (4, 2), (3, 3)):
            for a in range(8):
                for b in range(8):
                    good, _ = _rounds(TreeSpeculativeDecoder(), model, spec, [a, b], *shape)
                    bad, _ = _rounds(TreeNodeFedFirstNodesFeature(), model, spec, [a, b], *shape)
                    counts[kind] += [r.accepted for r in good.rounds] != [r.accepted for r in bad.rounds]
                    trees[kind] += [(r.drafts, r.parents) for r in good.rounds] != [(r.drafts, r.parents) for r in bad.rounds]
    assert counts == {"eagle": 2, "mtp": 16}, counts
    assert trees == {"eagle": 91, "mtp": 77}, trees
