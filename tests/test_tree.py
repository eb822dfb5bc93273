"""The reference tree verifiers (specdec_ref.tree): chains reduce to the chain verifiers bit for bit, no host
synchronisation, clear errors on bad input, the drafting helpers follow their schemes, and every reference
tree scheme is certified by the tree checks."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from conformance.registry import CheckContext, all_cases, run_checks
from conformance.report import certificate_for_records
from specdec_properties import tree_exact
from specdec_properties.markov import markov_pair
from specdec_properties.sampling import BackendOutputError
from specdec_properties.strategies import tree_blocks
from specdec_properties.tree_sampling import check_tree_output, draw_markov_trees, sibling_index
from specdec_ref.backend import deterministic_tree_backend, recursive_tree_backend, reference_backend
from specdec_ref.contract import Capabilities, check_backend
from specdec_ref.schemes import OneHotDraftVerifier
from specdec_ref.tree import (
    TREE_VERIFIERS,
    DeterministicTreeVerifier,
    RecursiveTreeVerifier,
    SpecInferTreeVerifier,
    chain_parents,
    validate_tree_inputs,
)
from specdec_ref.verify import verify_block


def _chain_inputs(B=64, k=4, V=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(B, k + 1, V, generator=g), -1)
    q = torch.softmax(2 * torch.randn(B, k, V, generator=g), -1)
    d = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, k)
    return d, q, p


@pytest.mark.parametrize(
    "tree_verifier, chain_verifier",
    [(SpecInferTreeVerifier(), verify_block), (RecursiveTreeVerifier(), verify_block), (DeterministicTreeVerifier(), OneHotDraftVerifier())],
    ids=["specinfer-token", "recursive-token", "deterministic-one_hot_draft"],
)
def test_a_chain_is_verified_exactly_as_the_chain_verifier_does(tree_verifier, chain_verifier):
    """On a chain every tree scheme is its chain counterpart, bit for bit at the same generator state."""
    d, q, p = _chain_inputs()
    parents = chain_parents(*d.shape)
    for seed in range(5):
        m, tokens = chain_verifier(d, q, p, generator=torch.Generator().manual_seed(seed))
        got = tree_verifier(d, parents, q, p, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got.num_accepted, m) and torch.equal(got.tokens, tokens)
        on_path = torch.arange(d.shape[1])[None, :] < m[:, None]
        assert torch.equal(got.path, torch.where(on_path, torch.arange(d.shape[1]), -1))
    m, tokens = verify_block(d, None, p)
    assert torch.equal(tree_verifier(d, parents, None, p).tokens, tokens)


@pytest.mark.parametrize("scheme", list(TREE_VERIFIERS))
def test_no_host_synchronisation(scheme):
    """On the meta device any .item(), .tolist(), nonzero() or data-dependent branch raises."""
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2]] * 3, device="meta")
    d = torch.zeros(3, 6, dtype=torch.long, device="meta")
    q = torch.empty(3, 6, 7, device="meta")
    p = torch.empty(3, 7, 7, device="meta")
    for draft_probs in (q, None):
        m, path, tokens = TREE_VERIFIERS[scheme]()(d, parents, draft_probs, p, validate=False)
        assert m.shape == (3,) and path.shape == (3, 6) and tokens.shape == (3, 7)


@settings(max_examples=40, deadline=None)
@given(block=tree_blocks(greedy=False))
def test_every_scheme_gives_a_structurally_valid_output_on_drawn_trees(block):
    for cls in TREE_VERIFIERS.values():
        out = cls()(block.draft_tokens, block.parents, block.draft_probs, block.target_probs, generator=torch.Generator().manual_seed(1))
        check_tree_output(block.draft_tokens, block.parents, out, vocab=block.vocab, where=block.describe())


def _tree():
    parents = torch.tensor([[-1, -1, 0]])
    d = torch.tensor([[1, 2, 0]])
    p = torch.full((1, 4, 3), 1 / 3)
    return d, parents, p[:, :3], p


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d, par, q, p: (d, torch.tensor([[-1, 2, 0]]), q, p), "topologically ordered"),
        (lambda d, par, q, p: (torch.tensor([[1, -1, 0]]), par, q, p), "padding must come last"),
        (lambda d, par, q, p: (torch.tensor([[1, 3, 0]]), par, q, p), r"must be in \[0, 3\)"),
        (lambda d, par, q, p: (d, par, q, p[:, :3]), r"target_probs must have shape \[B, n\+1, V\]"),
        (lambda d, par, q, p: (d, par, torch.full((1, 3, 4), 0.25), p), "vocabulary mismatch"),
        (lambda d, par, q, p: (d, par, q, p.index_fill(2, torch.tensor([0]), float("nan"))), "NaN"),
        (lambda d, par, q, p: (d, par[:, :2], q, p), "parents must have the shape"),
        (lambda d, par, q, p: (torch.full((1, 3), -1), par, q, p), "no real node"),
    ],
    ids=["parent_after_child", "padding_first", "token_out_of_range", "target_rows", "vocab_mismatch", "nan", "parents_shape", "all_padding"],
)
def test_bad_input_is_a_clear_error(change, message):
    d, parents, q, p = change(*_tree())
    with pytest.raises(ValueError, match=message):
        validate_tree_inputs(d, parents, q, p)
    with pytest.raises(ValueError, match=message):
        SpecInferTreeVerifier()(d, parents, q, p)


def test_padded_nodes_are_never_accepted_and_their_rows_are_not_read():
    d = torch.tensor([[2, -1, -1]])
    parents = torch.tensor([[-1, 0, 0]])
    p = torch.zeros(1, 4, 3)
    p[0, 0, 2] = 1.0
    p[0, 1, 0] = 1.0  # rows of padded nodes (2, 3) are all zero: not validated, not read
    out = SpecInferTreeVerifier()(d, parents, None, p)
    assert out.num_accepted.tolist() == [1] and out.path.tolist() == [[0, -1, -1]] and out.tokens.tolist() == [[2, 0, -1, -1]]


def test_structure_helper_names_the_broken_rule():
    d = torch.tensor([[1, 2, 0]])
    parents = torch.tensor([[-1, -1, 0]])
    good = (torch.tensor([2]), torch.tensor([[0, 2, -1]]), torch.tensor([[1, 0, 0, -1]]))
    check_tree_output(d, parents, good, vocab=3, where="t")
    with pytest.raises(BackendOutputError, match="not a root-to-node path"):
        check_tree_output(d, parents, (torch.tensor([2]), torch.tensor([[1, 2, -1]]), torch.tensor([[2, 0, 0, -1]])), vocab=3, where="t")
    with pytest.raises(BackendOutputError, match="are not the tokens"):
        check_tree_output(d, parents, (torch.tensor([1]), torch.tensor([[1, -1, -1]]), torch.tensor([[1, 0, -1, -1]])), vocab=3, where="t")
    with pytest.raises(BackendOutputError, match="must be -1"):
        check_tree_output(d, parents, (torch.tensor([0]), torch.tensor([[0, -1, -1]]), torch.tensor([[1, -1, -1, -1]])), vocab=3, where="t")


def test_drafting_follows_each_scheme():
    pair = markov_pair()
    parents = np.array([-1, -1, -1, 0, 0])
    assert sibling_index(parents).tolist() == [0, 1, 2, 0, 1]
    starts = torch.full((4000,), pair.start)
    tokens, _, qs, p = draw_markov_trees("recursive", parents, pair, starts, torch.Generator().manual_seed(0))
    assert (tokens[:, 0] != tokens[:, 1]).all() and (tokens[:, 1] != tokens[:, 2]).all() and (tokens[:, 3] != tokens[:, 4]).all()
    tokens, _, _, _ = draw_markov_trees("specinfer", parents, pair, starts, torch.Generator().manual_seed(0))
    assert (tokens[:, 0] == tokens[:, 1]).any()  # with replacement
    tokens, _, qs, p = draw_markov_trees("deterministic", parents, pair, starts[:2], torch.Generator().manual_seed(0))
    top = np.argsort(-pair.draft[pair.start], kind="stable")[:3]
    assert tokens[0, :3].tolist() == top.tolist()
    assert torch.equal(p[0, 1], torch.tensor(pair.target[int(tokens[0, 0])], dtype=torch.float32))
    assert torch.equal(qs[0, 3], torch.tensor(pair.draft[int(tokens[0, 0])], dtype=torch.float32))


def test_reference_law_given_a_tree_matches_the_oracle_to_sampling_error():
    """A quick cross-check outside the suite (the suite's tree_sampling_path_law does it at stated power)."""
    pair = markov_pair()
    parents = np.array([-1, -1, 0, 0, 1])
    for scheme, cls in TREE_VERIFIERS.items():
        tokens, tree, qs, p = draw_markov_trees(scheme, parents, pair, torch.tensor([2]), torch.Generator().manual_seed(3))
        law = tree_exact.outcome_law(scheme, parents, tokens[0].numpy(), p[0].double().numpy(), qs[0].double().numpy())
        rows = 200_000
        out = cls()(tokens.expand(rows, -1), tree.expand(rows, -1), qs.expand(rows, -1, -1), p.expand(rows, -1, -1), generator=torch.Generator().manual_seed(4))
        end = torch.where(out.num_accepted > 0, out.path.gather(1, (out.num_accepted - 1).clamp_min(0)[:, None]).squeeze(1) + 1, 0)
        cells = end * pair.vocab + out.tokens.gather(1, out.num_accepted[:, None]).squeeze(1)
        freq = np.bincount(cells.numpy(), minlength=law.size) / rows
        assert 0.5 * np.abs(freq - law.reshape(-1)).sum() < 0.01, scheme


def test_capabilities_declare_a_tree_scheme():
    assert Capabilities().tree_scheme == "specinfer" and Capabilities().tree_lossless
    assert not Capabilities(tree_scheme="lossy").tree_lossless
    with pytest.raises(ValueError, match="unknown tree scheme"):
        Capabilities(tree_scheme="medusa")
    assert recursive_tree_backend().capabilities.tree_scheme == "recursive"
    assert deterministic_tree_backend().capabilities.tree_scheme == "deterministic"
    check_backend(reference_backend())


#: Every tree-verifier check.
TREE_CHECKS = sorted({c.check.name for c in all_cases() if c.check.family == "tree"})


@pytest.mark.parametrize("factory", [recursive_tree_backend, deterministic_tree_backend], ids=lambda f: f.__name__)
def test_each_reference_tree_scheme_is_certified_by_the_tree_checks(factory):
    """`pytest conformance/ --specdec-backend=specdec_ref.backend:<factory>` (tree checks), at the ci profile;
    the default reference (specinfer) is certified by `pytest conformance/` itself."""
    backend = factory()
    records = run_checks(backend, CheckContext(profile="ci"), names=TREE_CHECKS)
    bad = [(r.id, r.status, r.message[:500]) for r in records if r.status != "passed"]
    assert not bad, bad
    assert certificate_for_records(records, backend=backend, profile="ci")["verdict"]["headline"] == "CERTIFIED"


@pytest.mark.parametrize("factory", [recursive_tree_backend, deterministic_tree_backend], ids=lambda f: f.__name__)
def test_each_reference_tree_scheme_decodes_losslessly(factory):
    """The tree decoder drafting as each scheme requires passes the sequence law on the exactly-known order-2
    checkpoint (the default reference, specinfer, is certified by `pytest conformance/` itself)."""
    backend = factory()
    records = run_checks(backend, CheckContext(profile="ci"), names=["tree_decoder_sequence_law"])
    assert [r.status for r in records] == ["passed", "passed"], [(r.id, r.message[:500]) for r in records]  # position, position_limit
    assert all(s["power"] >= 0.99 for r in records for s in r.statistics)


def _node_by_node(cls):
    """``cls`` with its own ``tried`` re-stated: the greedy walk then runs its loop over nodes (the fast path is only
    taken when the decisions are the reference's own)."""
    return type(f"NodeByNode{cls.__name__}", (cls,), {"tried": lambda self, parents_i, current, real_i: real_i & (parents_i == current)})


@settings(max_examples=150, deadline=None, derandomize=True)
@given(block=tree_blocks(greedy=True))
def test_greedy_path_without_the_loop_is_the_walk(block):
    """The greedy walk's vectorised path (pointer doubling over the parents) is node for node the loop's result:
    ragged and padded trees, ties broken by first index, deep chains and wide stars (Hypothesis trees)."""
    for cls in TREE_VERIFIERS.values():
        fast, slow = cls(), _node_by_node(cls)()
        assert fast._greedy_steps_are_the_reference() and not slow._greedy_steps_are_the_reference()
        a = fast(block.draft_tokens, block.parents, None, block.target_probs)
        b = slow(block.draft_tokens, block.parents, None, block.target_probs)
        for x, y in zip(a, b):
            assert torch.equal(x, y), (cls.__name__, a, b)


def test_greedy_path_without_the_loop_on_a_deep_chain():
    """A chain of 40 nodes all matching (every doubling step needed), then broken at node 17."""
    n, vocab = 40, 5
    p = torch.zeros(1, n + 1, vocab)
    p[0, :, 2] = 1.0
    tokens = torch.full((1, n), 2)
    parents = torch.arange(-1, n - 1)[None]
    for cls in TREE_VERIFIERS.values():
        a, b = cls()(tokens, parents, None, p), _node_by_node(cls)()(tokens, parents, None, p)
        assert int(a.num_accepted) == n and all(torch.equal(x, y) for x, y in zip(a, b))
        tokens[0, 17] = 3  # the path breaks at node 17
        a, b = cls()(tokens, parents, None, p), _node_by_node(cls)()(tokens, parents, None, p)
        assert int(a.num_accepted) == 17 and all(torch.equal(x, y) for x, y in zip(a, b))
        tokens[0, 17] = 2
