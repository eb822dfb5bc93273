"""The tree oracle (``specdec_properties.tree_exact``) against the contract's definitions, independently of
``specdec_ref``: every exact scheme, drafted by its own protocol, is lossless on every tree shape
(round after round its text law is the target's); a mismatched protocol is not; chains reduce to the
chain schemes of ``specdec_properties.exact``; greedy follows the argmax path; hand-computed examples."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_properties import exact
from specdec_properties import markov
from specdec_properties import tree_exact as te
from specdec_properties.markov import MarkovPair, markov_pair, sequence_law

EXACT = ("specinfer", "recursive", "deterministic")


def _random_tree(seed: int, n: int, max_children: int = 3) -> np.ndarray:
    """A random topologically ordered tree; no node has more than ``max_children`` children."""
    rng = np.random.default_rng(seed)
    parents = []
    for i in range(n):
        while True:
            parent = int(rng.integers(-1, i))
            if parents.count(parent) < max_children:
                break
        parents.append(parent)
    return np.array(parents)


SHAPES = {
    "chain(3)": te.chain(3),
    "star(3)": te.star(3),
    "kary(2,2)": te.kary(2, 2),
    "eagle_like(2,3)": te.eagle_like(2, 3),
    "random(5)": _random_tree(1, 5),
    "random(7)": _random_tree(2, 7),
}


def _random_pair(seed: int, vocab: int, sparse: bool = False) -> MarkovPair:
    """Random tables; ``sparse``: peaked targets and one zero in every draft row."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.4 if sparse else 1.0), size=vocab)
    draft = rng.dirichlet(np.ones(vocab), size=vocab)
    if sparse:
        draft[np.arange(vocab), rng.integers(0, vocab, vocab)] = 0.0
        draft /= draft.sum(-1, keepdims=True)
    return MarkovPair("random", target, draft, int(rng.integers(vocab)), "random tables")


PAIRS = {
    "markov_pair": markov_pair(),
    "random V=4": _random_pair(3, 4),
    "random V=5": _random_pair(4, 5),
    "sparse V=5": _random_pair(5, 5, sparse=True),
}


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


# ----------------------------------------------------------------------------- shapes and structure


def test_standard_shapes():
    assert te.chain(3).tolist() == [-1, 0, 1]
    assert te.star(3).tolist() == [-1, -1, -1]
    assert te.kary(2, 2).tolist() == [-1, -1, 0, 0, 1, 1]
    assert te.eagle_like(2, 3).tolist() == [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3]
    assert te.eagle_like(3, 2).tolist() == [-1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert te.tree_shape("kary", width=3, depth=2).size == 12
    assert te.depths(te.eagle_like(2, 3)).tolist() == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert te.path_to(te.eagle_like(2, 3), 7) == [0, 2, 7]
    assert te.path_to(te.chain(3), -1) == []
    with pytest.raises(ValueError):
        te.depths([-1, 1])
    with pytest.raises(ValueError):
        te.tree_shape("ring", n=3)


# ----------------------------------------------------------------------------- losslessness


@pytest.mark.parametrize("pair_name", list(PAIRS))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("scheme", EXACT)
def test_every_exact_scheme_is_lossless_on_every_shape(scheme, shape, pair_name):
    pair = PAIRS[pair_name]
    law = te.tree_sequence_law(scheme, SHAPES[shape], pair, 3)
    np.testing.assert_allclose(law, sequence_law(pair, 3), rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme", EXACT)
def test_round_law_is_a_law_whose_first_token_follows_the_target(scheme):
    pair = markov_pair()
    law = te.tree_round_law(scheme, te.eagle_like(2, 3), pair, pair.start)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert max(map(len, law)) == 4  # three accepted, then the final token
    first = np.zeros(pair.vocab)
    for tokens, mass in law.items():
        first[tokens[0]] += mass
    np.testing.assert_allclose(first, pair.target[pair.start], atol=1e-12)


@pytest.mark.parametrize("judge, drafting", [("specinfer", "recursive"), ("specinfer", "deterministic")])
def test_a_mismatched_drafting_protocol_is_not_lossless(judge, drafting):
    """Non-vacuity: the same walks, judging trees drafted by another scheme's protocol, are biased."""
    pair = markov_pair()
    law = te.tree_sequence_law(judge, te.star(3), pair, 3, drafting=drafting)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert _tv(law, sequence_law(pair, 3)) > 1e-3


@pytest.mark.parametrize("drafting", ["specinfer", "recursive"])
def test_deterministic_judging_is_lossless_whatever_the_drafting(drafting):
    """One-hot acceptance never reads q: any tokens drawn independently of the target, even repeated
    siblings (i.i.d. drafting), keep the text law exact. So the mismatch is only a specinfer matter."""
    pair = markov_pair()
    law = te.tree_sequence_law("deterministic", te.kary(2, 2), pair, 3, drafting=drafting)
    np.testing.assert_allclose(law, sequence_law(pair, 3), rtol=0, atol=1e-12)


def test_greedy_decodes_the_target_greedy_text():
    pair = markov_pair()
    expected, last = 0, pair.start
    for _ in range(3):
        last = int(np.argmax(pair.target[last]))
        expected = expected * pair.vocab + last
    for parents in SHAPES.values():
        law = te.tree_sequence_law("greedy", parents, pair, 3)
        assert law[expected] == 1.0 and law.sum() == 1.0


# ----------------------------------------------------------------------------- chains reduce to chain schemes


@pytest.mark.parametrize("tree_scheme, chain_scheme", [("specinfer", "token"), ("recursive", "token"),
                                                        ("deterministic", "one_hot_draft")])
@pytest.mark.parametrize("seed", range(4))
def test_a_chain_is_the_chain_verifier(tree_scheme, chain_scheme, seed):
    rng = np.random.default_rng(seed)
    k, vocab = 4, 5
    p = rng.dirichlet(np.ones(vocab), size=k + 1)
    q = rng.dirichlet(np.ones(vocab), size=k)
    drafts = np.array([rng.choice(vocab, p=row) for row in q])
    stop, final = exact.outcome_given_drafts(exact.SchemeSpec(chain_scheme), p[None], q[None], drafts[None])
    law = te.outcome_law(tree_scheme, te.chain(k), drafts, p, q)
    np.testing.assert_allclose(law, stop[0, :, None] * final[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("tree_scheme, chain_scheme", [("specinfer", "token"), ("deterministic", "one_hot_draft")])
def test_chain_efficiency_is_the_chain_schemes(tree_scheme, chain_scheme):
    """``specinfer`` chains: the token-wise moments of ``specdec_properties.markov``; ``deterministic`` chains are
    drafted as the draft's argmax chain, each draft accepted w.p. its target probability."""
    pair = markov_pair(vocab=5)
    mean, var = te.tree_accepted_moments(tree_scheme, te.chain(3), pair)
    if tree_scheme == "specinfer":
        ref_mean, ref_var = markov.accepted_moments(pair, exact.SchemeSpec(chain_scheme), 3)
        np.testing.assert_allclose(mean, ref_mean, atol=1e-12)
        np.testing.assert_allclose(var, ref_var, atol=1e-12)
        np.testing.assert_allclose(te.tree_tokens_per_round(tree_scheme, te.chain(3), pair),
                                   markov.tokens_per_round(pair, exact.SchemeSpec(chain_scheme), 3), atol=1e-12)
    else:  # deterministic: the argmax chain accepted w.p. target(d) at each step
        for a in range(pair.vocab):
            reach, last, law = 1.0, a, []
            for _ in range(3):
                d = int(np.argmax(pair.draft[last]))
                law.append(reach * (1 - pair.target[last, d]))
                reach *= pair.target[last, d]
                last = d
            law.append(reach)
            m = np.arange(4)
            assert mean[a] == pytest.approx(np.dot(law, m), abs=1e-12)
            assert var[a] == pytest.approx(np.dot(law, m**2) - np.dot(law, m) ** 2, abs=1e-12)


# ----------------------------------------------------------------------------- given the tree


STAR_P = np.array([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
STAR_Q = np.array([[0.3, 0.55, 0.15]] * 2)
STAR_TOKENS = np.array([0, 1])


@pytest.mark.parametrize("scheme, ends", [
    # specinfer: accept 0 w.p. .1/.3 = 1/3; r = norm([p - q]_+) = (0, .25, .75); accept 1 w.p. .25/.55 = 5/11;
    # then r = norm([r - q]_+) = (0, 0, 1)
    ("specinfer", {0: (2 / 3 * 6 / 11, [0, 0, 1]), 1: (1 / 3, STAR_P[1]), 2: (2 / 3 * 5 / 11, STAR_P[2])}),
    # recursive: the second try is against q without token 0, (0, 11/14, 3/14): accept 1 w.p. .25 * 14/11 = 7/22
    ("recursive", {0: (2 / 3 * 15 / 22, [0, 0, 1]), 1: (1 / 3, STAR_P[1]), 2: (2 / 3 * 7 / 22, STAR_P[2])}),
    # deterministic: accept 0 w.p. .1; r = (0, 2/3, 1/3); accept 1 w.p. 2/3; then r = (0, 0, 1)
    ("deterministic", {0: (0.3, [0, 0, 1]), 1: (0.1, STAR_P[1]), 2: (0.6, STAR_P[2])}),
    # greedy: argmax of row 0 is token 1 (node 1); the final token is the argmax of row 2, token 0
    ("greedy", {0: (0.0, [0, 0, 1]), 1: (0.0, STAR_P[1]), 2: (1.0, [1, 0, 0])}),
])
def test_two_child_star_by_hand(scheme, ends):
    law = te.outcome_law(scheme, te.star(2), STAR_TOKENS, STAR_P, STAR_Q)
    expected = np.array([mass * np.asarray(row, dtype=np.float64) for mass, row in (ends[e] for e in range(3))])
    np.testing.assert_allclose(law, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme", te.TREE_ORACLE_SCHEMES)
@pytest.mark.parametrize("seed", range(3))
def test_outcome_law_sums_to_one_and_ends_only_where_reachable(scheme, seed):
    rng = np.random.default_rng(seed)
    parents, vocab = _random_tree(10 + seed, 8), 6
    n = parents.size
    p = rng.dirichlet(np.ones(vocab), size=n + 1)
    parent_q = rng.dirichlet(np.ones(vocab), size=n + 1)  # row per node; row 0 for the root
    q = parent_q[parents + 1]
    tokens = np.empty(n, dtype=np.int64)
    for i in range(n):  # distinct sibling tokens, drawn without replacement
        taken = [tokens[j] for j in range(i) if parents[j] == parents[i]]
        rest = np.delete(np.arange(vocab), taken)
        tokens[i] = rng.choice(rest, p=q[i, rest] / q[i, rest].sum())
    law = te.outcome_law(scheme, parents, tokens, p, q)
    assert law.shape == (n + 1, vocab)
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(law >= 0)


def test_greedy_follows_the_longest_argmax_path_with_first_maximal_ties():
    #        root (row 0: tie 1 / 2 -> 1)
    #        /      \
    #   n0 tok 2   n1 tok 1          n0 is a maximiser too, but not the first: rejected
    #              /      \
    #         n2 tok 0   n3 tok 3    row 2 (after n1): argmax 3 -> n3
    #                       \
    #                      n4 tok 2  row 4 (after n3): tie 0 / 1 / 2 -> 0, n4 rejected
    parents = np.array([-1, -1, 1, 1, 3])
    tokens = np.array([2, 1, 0, 3, 2])
    p = np.array([
        [0.1, 0.4, 0.4, 0.1],
        [0.25, 0.25, 0.25, 0.25],
        [0.2, 0.1, 0.2, 0.5],
        [0.25, 0.25, 0.25, 0.25],
        [0.3, 0.3, 0.3, 0.1],
        [0.25, 0.25, 0.25, 0.25],
    ])
    law = te.outcome_law("greedy", parents, tokens, p)
    expected = np.zeros_like(law)
    expected[3 + 1, 0] = 1.0
    np.testing.assert_array_equal(law, expected)
    assert te.path_to(parents, 3) == [1, 3]


# ----------------------------------------------------------------------------- efficiency


def test_recursive_accepts_at_least_as_much_as_specinfer_on_a_star():
    pair = markov_pair()
    spec, _ = te.tree_accepted_moments("specinfer", te.star(3), pair)
    rec, _ = te.tree_accepted_moments("recursive", te.star(3), pair)
    assert np.all(rec >= spec - 1e-12)
    assert rec.mean() > spec.mean() + 1e-3
    # a star accepts at most one node: its mean is P(some child accepted)
    assert np.all(rec <= 1.0 + 1e-12)


def test_drafting_protocols_that_cannot_be_followed_raise():
    pair = _random_pair(5, 5, sparse=True)  # every draft row has support 4
    with pytest.raises(ValueError, match="support"):
        te.tree_round_law("recursive", te.star(5), pair, 0)
    with pytest.raises(ValueError, match="vocabulary"):
        te.tree_round_law("deterministic", te.star(6), pair, 0)
    assert sum(te.tree_round_law("deterministic", te.star(5), pair, 0).values()) == pytest.approx(1.0, abs=1e-12)
