"""The proposer seam (specdec_ref.proposers, specdec_ref.heads), the exactly-known heads (specdec_ref.exact_heads) and
their float64 laws (properties.proposals): exactness of the heads, the effect each proposer bug has, the contract."""
import numpy as np
import pytest
import torch

from properties.exact import TOKEN
from properties.proposals import EagleLaw, NgramLaw, greedy_round, law_of, round_acceptance
from specdec_ref.contract import Request
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.exact_heads import eagle_mix, exact_eagle_head, exact_medusa_heads, medusa_table, order1_table
from specdec_ref.exact_models import exact_model, exact_pair
from specdec_ref.proposers import Ngram
from specdec_ref.static_cache import FINAL
from specdec_ref.warp import SamplingConfig

TARGET = "order1-target"


@pytest.fixture(scope="module")
def target():
    return exact_pair("order1-close").target.load(torch.float32)


def _specs(target, sample):
    return {"ngram": Ngram(1, 3), "eagle": exact_eagle_head(target, TARGET, sample=sample),
            "medusa": exact_medusa_heads(target, TARGET, heads=3, sample=sample)}


def test_exact_eagle_head_logits_are_the_tables_bit_for_bit(target):
    """The head's float32 forward (fc, zeroed layer, the target's lm_head) equals the float64 law from the tables, at
    the first step and chained on its own feature."""
    from specdec_ref.heads import _target_parts

    spec = exact_eagle_head(target, TARGET, layer=False)
    embed, head = _target_parts(target)
    law = law_of(spec, TARGET)
    for x in range(8):
        for y in range(8):
            f = torch.zeros(16)
            f[y] = 4.0  # the order-1 target's feature after token y
            h = torch.nn.functional.linear(torch.cat([embed[x], f]), spec.fc)
            assert np.array_equal(torch.nn.functional.linear(h, head).double().numpy(), law.raw([y, x], []))
            for d in range(8):  # the second step reads the head's own feature
                h2 = torch.nn.functional.linear(torch.cat([embed[d], h]), spec.fc)
                assert np.array_equal(torch.nn.functional.linear(h2, head).double().numpy(), law.raw([y, x], [d]))


def test_exact_medusa_heads_are_the_tables(target):
    spec = exact_medusa_heads(target, TARGET, heads=3)
    for i, w in enumerate(spec.lm_heads):
        for y in range(8):
            f = torch.zeros(16)
            f[y] = 4.0
            assert np.array_equal(torch.nn.functional.linear(f, w).double().numpy(), medusa_table(TARGET, i + 2)[y])


def test_target_features_are_the_last_hidden_state_after_the_final_norm(target):
    """What the heads read: the target's hidden state after its final norm, ``4 e_t`` at a position holding ``t``."""
    from specdec_ref.static_cache import StaticModelCache

    cache = StaticModelCache(target, max_length=16)
    cache.capture = (0, 1, FINAL)
    cache.feed(torch.tensor([[3, 5, 0]]))
    feats = cache.features()
    for layer in (0, 1, FINAL):
        assert torch.equal(feats[layer][0], 4 * torch.eye(16)[[3, 5, 0]])


@pytest.mark.parametrize("kind", ["ngram", "eagle", "medusa"])
def test_greedy_equals_ar_and_the_rounds_follow_the_text(target, kind):
    """Greedy decoding equals AR for prompts of 1 to 5 tokens and k = 1..4, and every round's record keeps the decoder's
    invariant (the proposer's state holds the committed text but the pending token)."""
    dec = SpeculativeDecoder()
    spec = _specs(target, False)[kind]
    for prompt in ([3], [1, 2, 1, 2], [5, 0, 5, 0, 5]):
        want = autoregressive_decode(target, torch.tensor([prompt]), max_new_tokens=20).tokens
        for k in (1, 2, 3, 4):
            seen = []
            res = dec.decode(target, spec, torch.tensor([prompt]), k=k, max_new_tokens=20,
                             on_round=lambda r, t, d: seen.append((r.target_len, d.tentative_length, r.committed_len)))
            assert res.tokens == want, (kind, prompt, k)
            assert all(t == d == c - 1 for t, d, c in seen), seen
    if kind == "medusa":  # three heads: a round drafts at most three tokens
        res = dec.decode(target, spec, torch.tensor([[1, 2]]), k=5, max_new_tokens=20)
        assert max(r.proposed for r in res.rounds) == 3


@pytest.mark.parametrize("kind, sample", [("ngram", False), ("eagle", False), ("eagle", True), ("medusa", False),
                                          ("medusa", True)])
def test_seeded_rows_reproduce_alone_in_any_batch(target, kind, sample):
    """Batch invariance with proposers (prompt lookup has only one-hot drafts), one-token prompts among longer ones
    (their first round drafts nothing while their neighbours draft): a seeded row decodes bit for bit the same alone."""
    dec = SpeculativeDecoder()
    spec = _specs(target, sample)[kind]
    reqs = [Request(prompt=[1, 2, 1, 2][: 1 + s % 4], max_new_tokens=12, sampling=SamplingConfig(temperature=1.0),
                    eos_ids=7, seed=s) for s in range(8)]
    batch = [r.tokens for r in dec.decode_batch(target, spec, reqs, k=3)]
    assert batch == [dec.decode_batch(target, spec, [r], k=3)[0].tokens for r in reqs]
    assert batch == [dec.decode_batch(target, spec, list(reversed(reqs)), k=3)[len(reqs) - 1 - i].tokens
                     for i in range(len(reqs))]


def test_ngram_follows_vllm_rule():
    """The longest suffix in [min_n, max_n] wins; the first earlier occurrence; fewer tokens at the end; none without a
    match (the reference's Ngram and the independent law agree)."""
    spec, law = Ngram(1, 3), NgramLaw(1, 3)
    cases = {
        (1, 2, 3, 9, 2, 3, 4, 1, 2, 3): [9, 2],  # "1 2 3" at 0 (longest) beats "2 3" at 4
        (5, 1, 6, 1, 7, 1): [6, 1],  # "1" first at 1 (not the later one at 3)
        (4, 5, 4): [5, 4],
        (4, 5, 6): [],
        (2, 2): [2],
    }
    for text, want in cases.items():
        assert spec.lookup(list(text), 2) == want == law.proposal(text, 2), text
    assert Ngram(2, 2).lookup([1, 2, 9, 2], 3) == []  # min_n: a single repeated token is not enough
    with pytest.raises(ValueError):
        Ngram(3, 2)


def _stationary_acceptance(law_correct, law_buggy):
    """Mean probability that the first draft is accepted (sampled at temperature 0.8, token scheme), over the target's
    stationary chain of (z, y, x), x pending: the correct head reads y's feature, the buggy one z's."""
    t = order1_table(TARGET)
    p = np.exp((t - t.max(1, keepdims=True)) / 0.8)
    p /= p.sum(1, keepdims=True)
    w, v = np.linalg.eig(p.T)
    pi = np.real(v[:, np.argmax(np.real(w))])
    pi /= pi.sum()
    cfg = SamplingConfig(temperature=0.8)
    m = exact_model(TARGET)
    out = {"correct": 0.0, "bug": 0.0}
    for z in range(8):
        for y in range(8):
            for x in range(8):
                weight = pi[z] * p[z, y] * p[y, x]
                out["correct"] += weight * (1 - round_acceptance(m, law_correct, [z, y, x], [], cfg, 1, TOKEN)[0])
                out["bug"] += weight * (1 - round_acceptance(m, law_buggy, [z, y, x], [], cfg, 1, TOKEN)[0])
    return out


def test_a_feature_of_the_previous_position_costs_acceptance_beyond_the_detected_shift(target):
    """The effect the acceptance check is sized for: the EAGLE head reading the feature one position early (the token
    two before the pending one) accepts the first draft 0.05 less often on average (0.833 -> 0.779 at temperature
    0.8), a shift of at least ACCEPT_SHIFT, detected with power 0.99 at ci (sampled and argmax drafts)."""
    from conformance.proposer_checks import ACCEPT_SHIFT

    law = EagleLaw(TARGET, 0.5, True)
    bug = EagleLaw(TARGET, 0.5, True, feature_back=2)
    acc = _stationary_acceptance(law, bug)
    assert acc["correct"] == pytest.approx(0.833, abs=0.002) and acc["bug"] == pytest.approx(0.779, abs=0.002), acc
    assert acc["correct"] - acc["bug"] >= ACCEPT_SHIFT


def test_each_proposer_bug_changes_the_greedy_rounds(target):
    """On the greedy prompts the deterministic check decodes, every state bug changes some round's drafts (a wrong
    feature proposes differently, not the same tokens by accident): counted here from the laws alone."""
    from conformance.proposer_checks import GREEDY_PROMPTS, PROPOSER_K

    m = exact_model(TARGET)
    eagle = EagleLaw(TARGET, 0.5, False)
    differs = {"feature of the previous position": 0, "medusa heads shifted": 0}
    for prompt in GREEDY_PROMPTS:
        text = list(prompt) + autoregressive_decode(target, torch.tensor([prompt]), max_new_tokens=24).tokens
        for end in range(3, len(text)):
            ctx = text[:end]
            a = greedy_round(m, eagle, ctx, PROPOSER_K)
            b = greedy_round(m, EagleLaw(TARGET, 0.5, False, feature_back=2), ctx, PROPOSER_K)
            differs["feature of the previous position"] += a is not None and b is not None and a != b
            drafts = [int(medusa_table(TARGET, i + 2)[ctx[-2]].argmax()) for i in range(PROPOSER_K)]
            shifted = [int(medusa_table(TARGET, (i + 1) % 3 + 2)[ctx[-2]].argmax()) for i in range(PROPOSER_K)]
            differs["medusa heads shifted"] += drafts != shifted
    assert all(n >= 10 for n in differs.values()), differs


def test_eagle_mix_is_a_law_in_eighths():
    c = eagle_mix(TARGET)
    assert np.all(c * 8 == np.round(c * 8)) and np.allclose(c.sum(1), 1, atol=0.5)


def test_bad_proposer_specs_are_named_errors(target):
    dec = SpeculativeDecoder()
    with pytest.raises(ValueError, match="proposer spec"):
        dec.decode(target, object(), torch.tensor([[1, 2]]), k=2, max_new_tokens=4)
    spec = exact_eagle_head(target, TARGET)
    bad = type(spec)(fc=spec.fc[:, :20])
    with pytest.raises(ValueError, match="fc must be"):
        dec.decode(target, bad, torch.tensor([[1, 2]]), k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="exact heads expect"):
        exact_eagle_head(exact_pair("order2-close").target.load(torch.float32), TARGET)
