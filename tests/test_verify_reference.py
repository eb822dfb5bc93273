"""Unit tests of the reference verifier: exact greedy, numerical guards, validation, no host sync."""
import pytest
import torch
from hypothesis import given, note

from specdec_properties.strategies import greedy_blocks, sampling_blocks
from specdec_ref.schemes import BlockwiseVerifier, OneHotDraftVerifier, TypicalAcceptanceVerifier
from specdec_ref.verify import BlockVerifier, sample_from_weights, verify_block


@given(block=greedy_blocks())
def test_greedy_is_argmax_decoding_exactly(block):
    """The reference's greedy output is exactly first-index argmax decoding, ties included."""
    note(block.describe())
    m, tokens = verify_block(block.draft_tokens, None, block.target_probs)
    choice = block.target_probs.argmax(-1)
    for b in range(block.draft_tokens.shape[0]):
        expected_m = 0
        while expected_m < block.k and block.draft_tokens[b, expected_m] == choice[b, expected_m]:
            expected_m += 1
        assert int(m[b]) == expected_m
        expected = block.draft_tokens[b, :expected_m].tolist() + [int(choice[b, expected_m])]
        expected += [-1] * (block.k - expected_m)
        assert tokens[b].tolist() == expected


def test_alignment_table():
    """Row i judges d_{i+1}; the bonus comes from row k (the design's alignment test, printed on failure)."""
    vocab = 6
    target = torch.zeros(1, 4, vocab)
    for row, tok in enumerate([1, 2, 3, 4]):  # saved_next -> 1, rows[0] -> 2, rows[1] -> 3, bonus -> 4
        target[0, row, tok] = 1.0
    drafts = torch.tensor([[1, 2, 3]])
    m, tokens = verify_block(drafts, None, target)
    assert (int(m[0]), tokens[0].tolist()) == (3, [1, 2, 3, 4])
    m, tokens = verify_block(torch.tensor([[1, 2, 5]]), None, target)
    assert (int(m[0]), tokens[0].tolist()) == (2, [1, 2, 3, -1]), "d_3 must be judged by rows[1] (token 3)"
    q = torch.full((1, 3, vocab), 1.0 / vocab)
    m, tokens = verify_block(drafts, q, target, generator=torch.Generator().manual_seed(0))
    assert (int(m[0]), tokens[0].tolist()) == (3, [1, 2, 3, 4])


def test_zero_draft_probability_of_drafted_token_is_guarded():
    """q(d) = 0 for a drafted token: accepted iff p(d) > 0 (ratio = inf), never NaN."""
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])
    q = torch.tensor([[[0.0, 0.0, 1.0]]])
    g = torch.Generator().manual_seed(0)
    m, tokens = verify_block(torch.tensor([[0]]), q, p, generator=g)
    assert int(m[0]) == 1 and tokens[0].tolist() == [0, 2]
    m, tokens = verify_block(torch.tensor([[2]]), torch.tensor([[[0.5, 0.5, 0.0]]]), p, generator=g)
    assert int(m[0]) == 0 and tokens[0, 0] in (0, 1)


def test_empty_residual_falls_back_to_target_row():
    """If rounding leaves an empty residual (p == q) the replacement is drawn from p, never from a zero row."""
    v = BlockVerifier()
    p = torch.tensor([[0.25, 0.75, 0.0]])
    weights = v.residual(p.clone(), p.clone())
    assert torch.equal(weights, p)


def test_tiny_masses_are_sampled_in_proportion():
    """Weights like 1e-8 neither vanish nor dominate: the exponential race is exact."""
    weights = torch.tensor([[1e-8, 1.0 - 1e-8]]).expand(2_000_000, -1)
    picks = sample_from_weights(weights, torch.Generator().manual_seed(3))
    assert int((picks == 0).sum()) <= 3  # expected 0.02
    w = torch.tensor([[0.0, 1e-6, 0.0, 3e-6]]).expand(400_000, -1)
    picks = sample_from_weights(w, torch.Generator().manual_seed(4))
    share = float((picks == 3).float().mean())
    assert set(picks.unique().tolist()) <= {1, 3} and abs(share - 0.75) < 0.01


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_low_and_high_precision_inputs_compute_in_float32(dtype):
    block_gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(8, 4, 10, generator=block_gen), -1)
    q = torch.softmax(torch.randn(8, 3, 10, generator=block_gen), -1)
    d = torch.multinomial(q.reshape(-1, 10), 1, generator=block_gen).reshape(8, 3)
    # upcast rows keep the low-precision rounding (sums off by ~1e-3): compare without validation
    ref = verify_block(d, q.to(dtype).float(), p.to(dtype).float(), generator=torch.Generator().manual_seed(1), validate=False)
    got = verify_block(d, q.to(dtype), p.to(dtype), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


@pytest.mark.parametrize(
    "verifier",
    [verify_block, BlockVerifier(bonus=False), OneHotDraftVerifier(), BlockwiseVerifier(), TypicalAcceptanceVerifier()],
    ids=["token", "token-no_bonus", "one_hot_draft", "block", "typical"],
)
def test_no_host_synchronisation(verifier):
    """On the meta device any .item(), .tolist(), nonzero() or data-dependent branch raises: every
    reference scheme's verify must run there."""
    d = torch.zeros(4, 3, dtype=torch.long, device="meta")
    q = torch.empty(4, 3, 7, device="meta")
    p = torch.empty(4, 4, 7, device="meta")
    for draft_probs in (q, None):
        m, tokens = verifier(d, draft_probs, p, validate=False)
        assert m.shape == (4,) and tokens.shape == (4, 4)


@given(block=sampling_blocks())
def test_same_generator_state_same_result(block):
    a = verify_block(block.draft_tokens, block.draft_probs, block.target_probs, generator=torch.Generator().manual_seed(9))
    b = verify_block(block.draft_tokens, block.draft_probs, block.target_probs, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _inputs(B=2, k=3, V=5):
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(B, k + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, k, V, generator=g), -1)
    d = torch.randint(0, V, (B, k), generator=g)
    return d, q, p


BAD_INPUTS = {
    "draft tokens not 2-d": (lambda d, q, p: (d[0], q, p), "draft_tokens must have shape"),
    "k = 0": (lambda d, q, p: (d[:, :0], q[:, :0], p[:, :1]), "k must be >= 1"),
    "float token ids": (lambda d, q, p: (d.float(), q, p), "integer tensor"),
    "token id = V": (lambda d, q, p: (d.index_fill(1, torch.tensor([1]), 5), q, p), "draft_tokens must be in [0, 5)"),
    "negative token id": (lambda d, q, p: (d.index_fill(1, torch.tensor([0]), -1), q, p), "draft_tokens must be in [0, 5)"),
    "target rows != k + 1": (lambda d, q, p: (d, q, p[:, :3]), "target_probs must have shape (2, 4, 5)"),
    "vocab mismatch": (lambda d, q, p: (d, torch.cat([q, torch.zeros(2, 3, 1)], -1), p), "vocabulary mismatch"),
    "batch mismatch": (lambda d, q, p: (d, q[:1], p), "draft_probs must have shape (2, 3, 5)"),
    "NaN probability": (lambda d, q, p: (d, q, p.index_fill(2, torch.tensor([0]), float("nan"))), "NaN or infinity"),
    "negative probability": (lambda d, q, p: (d, q - 0.5 * q.index_fill(2, torch.tensor([1]), 1.0), p), "negative"),
    "row not summing to 1": (lambda d, q, p: (d, q * 1.1, p), "sum to 1"),
    "integer probabilities": (lambda d, q, p: (d, q, p.long()), "floating tensor"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_gives_clear_error(case):
    make, message = BAD_INPUTS[case]
    args = make(*_inputs())
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        verify_block(*args)


def test_validation_can_be_switched_off():
    d, q, p = _inputs()
    verify_block(d, q * 1.1, p, validate=False)  # no check, no error: the caller's responsibility

