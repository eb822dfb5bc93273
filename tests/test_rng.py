"""Per-row generators (specdec_ref.rng): a row's randomness comes only from its own generator, so a seeded row
verifies bit for bit the same alone or anywhere in any batch, for every reference verifier and tree scheme."""
import pytest
import torch

import specdec_ref.rng as rng
from specdec_ref.rng import check_generators, exponential_, exponential_like, uniform
from specdec_ref.schemes import BlockwiseVerifier, OneHotDraftVerifier, TypicalAcceptanceVerifier
from specdec_ref.tree import TREE_VERIFIERS
from specdec_ref.verify import BlockVerifier, verify_block


def _block(B=12, k=3, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(B, k + 1, V, generator=g), -1)
    q = torch.softmax(2 * torch.randn(B, k, V, generator=g), -1)
    d = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, k)
    return d, q, p


def _gens(seeds):
    return [None if s is None else torch.Generator().manual_seed(s) for s in seeds]


def test_per_row_draws_are_the_rows_own_stream():
    seeds = [3, 4, 5]
    u = uniform((3, 4), _gens(seeds), "cpu")
    e = exponential_like(torch.zeros(3, 5), _gens(seeds))
    for b, s in enumerate(seeds):
        assert torch.equal(u[b], torch.rand(4, generator=torch.Generator().manual_seed(s)))
        assert torch.equal(e[b], torch.empty(5).exponential_(generator=torch.Generator().manual_seed(s)))
    assert torch.equal(uniform((2, 3), torch.Generator().manual_seed(1), "cpu"), torch.rand(2, 3, generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("shape", [(65536, 16), (3, 4096), (rng.FAST_EXPONENTIAL_MIN,), (5, 7)])
@pytest.mark.parametrize("seed", [0, 1, 987654321])
def test_the_vectorised_exponential_is_exponential_value_for_value(shape, seed):
    """Guards a fast path that changes the stream (replays, equality with transformers' multinomial): the values and
    the generator state afterwards equal ``Tensor.exponential_``'s, bit for bit."""
    assert rng.float32_exponential_is_log1p(), "this torch build's exponential_ is not -log1p(-u): the fast path is off"
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for _ in range(2):  # and the next draw from each generator
        assert torch.equal(exponential_(torch.empty(shape), g1), torch.empty(shape).exponential_(generator=g2))
    assert torch.equal(g1.get_state(), g2.get_state())


def test_the_fast_exponential_is_off_where_the_identity_does_not_hold(monkeypatch):
    """A torch build whose exponential_ is computed otherwise gets exponential_ itself (no silent change of stream)."""
    called = []
    monkeypatch.setattr(rng, "float32_exponential_is_log1p", lambda: called.append(1) or False)
    e = exponential_(torch.empty(4, 4096), torch.Generator().manual_seed(3))
    assert called and torch.equal(e, torch.empty(4, 4096).exponential_(generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize(
    "generator, error, match",
    [
        ([torch.Generator()], ValueError, "per-row list of 1 entries but the batch has B=2"),
        ([torch.Generator(), 3], ValueError, r"generator\[1\] must be a torch.Generator or None"),
        (7, TypeError, "must be a torch.Generator, a list of one per row, or None"),
    ],
)
def test_bad_generator_arguments_are_clear_errors(generator, error, match):
    with pytest.raises(error, match=match):
        check_generators(generator, 2)
    d, q, p = _block(B=2)
    with pytest.raises(error, match=match):
        verify_block(d, q, p, generator=generator)


@pytest.mark.parametrize(
    "verifier",
    [verify_block, BlockVerifier(bonus=False), OneHotDraftVerifier(), BlockwiseVerifier(), TypicalAcceptanceVerifier()],
    ids=["token", "no_bonus", "one_hot_draft", "block", "typical"],
)
def test_a_seeded_row_is_the_same_alone_and_in_any_batch(verifier):
    d, q, p = _block()
    seeds = [100 + b if b % 3 else None for b in range(d.shape[0])]
    with torch.random.fork_rng():
        torch.manual_seed(1)
        m, t = verifier(d, q, p, generator=_gens(seeds))
    perm = torch.randperm(d.shape[0], generator=torch.Generator().manual_seed(2))
    m2, t2 = verifier(d[perm], q[perm], p[perm], generator=_gens([seeds[int(b)] for b in perm]))
    for b, s in enumerate(seeds):
        if s is None:
            continue
        _, alone = verifier(d[b : b + 1], q[b : b + 1], p[b : b + 1], generator=torch.Generator().manual_seed(s))
        assert torch.equal(alone[0], t[b]) and torch.equal(t2[int((perm == b).nonzero())], t[b])


@pytest.mark.parametrize("scheme", list(TREE_VERIFIERS))
def test_a_seeded_tree_row_is_the_same_alone_and_padded_in_a_ragged_batch(scheme):
    """Row 0 has 4 nodes, the others 6: row 0 is padded in the batch; alone (a one-element list) it is not."""
    d, q, p = _block(B=4, k=6)
    d = torch.stack([torch.randperm(7, generator=torch.Generator().manual_seed(b))[:6] for b in range(4)])  # distinct siblings
    d[0, 4:] = -1
    parents = torch.tensor([-1, -1, 0, 1, 2, 3]).expand(4, 6)
    verifier = TREE_VERIFIERS[scheme]()
    out = verifier(d, parents, q, p, generator=_gens(range(10, 14)))
    alone = verifier(d[:1, :4], parents[:1, :4], q[:1, :4], p[:1, :5], generator=_gens([10]))
    assert torch.equal(alone.tokens[0], out.tokens[0, :5]) and (out.tokens[0, 5:] == -1).all()
    for b in range(1, 4):
        one = verifier(d[b : b + 1], parents[b : b + 1], q[b : b + 1], p[b : b + 1], generator=_gens([10 + b]))
        assert torch.equal(one.tokens[0], out.tokens[b])
