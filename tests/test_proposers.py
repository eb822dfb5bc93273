"""The proposer seam (specdec_ref.proposers, specdec_ref.heads), the exactly-known heads (specdec_ref.exact.heads) and
their float64 laws (specdec_properties.proposals): exactness of the heads, the effect each proposer bug has, the contract."""
import numpy as np
import pytest
import torch

from specdec_properties.exact import TOKEN
from specdec_properties.proposals import Eagle3Law, EagleLaw, MtpLaw, NgramLaw, greedy_round, law_of, round_acceptance
from specdec_ref.contract import Request
from specdec_ref.decode import SpeculativeDecoder, autoregressive_decode
from specdec_ref.exact.deep import deep_channel, deep_target
from specdec_ref.exact.heads import (EAGLE3_VOCAB, eagle_mix, exact_eagle3_head, exact_eagle_head, exact_medusa_heads,
                                     exact_mtp_head, medusa_table, order1_table)
from specdec_ref.exact import exact_model, exact_pair
from specdec_ref.proposers import Ngram
from specdec_ref.static_cache import FINAL
from specdec_ref.warp import SamplingConfig

TARGET = "order1-target"


@pytest.fixture(scope="module")
def target():
    return exact_pair("order1-close").target.load(torch.float32)


def _specs(target, sample):
    return {"ngram": Ngram(1, 3), "eagle": exact_eagle_head(target, TARGET, sample=sample),
            "medusa": exact_medusa_heads(target, TARGET, heads=3, sample=sample),
            "mtp": exact_mtp_head(target, TARGET, sample=sample)}


def _target_and_spec(target, kind, sample):
    """EAGLE-3 drafts for the deep target (several layers that differ); the others for the order-1 target."""
    if kind == "eagle3":
        deep = deep_target(TARGET)
        return deep, exact_eagle3_head(deep, TARGET, sample=sample)
    return target, _specs(target, sample)[kind]


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


@pytest.mark.parametrize("kind", ["ngram", "eagle", "eagle3", "mtp", "medusa"])
def test_greedy_equals_ar_and_the_rounds_follow_the_text(target, kind):
    """Greedy decoding equals AR for prompts of 1 to 5 tokens and k = 1..4, and every round's record keeps the decoder's
    invariant (the proposer's state holds the committed text but the pending token)."""
    dec = SpeculativeDecoder()
    target, spec = _target_and_spec(target, kind, False)
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


@pytest.mark.parametrize("kind, sample", [("ngram", False), ("eagle", False), ("eagle", True), ("eagle3", False),
                                          ("eagle3", True), ("mtp", False), ("mtp", True), ("medusa", False),
                                          ("medusa", True)])
def test_seeded_rows_reproduce_alone_in_any_batch(target, kind, sample):
    """Batch invariance with proposers (prompt lookup has only one-hot drafts), one-token prompts among longer ones
    (their first round drafts nothing while their neighbours draft; the heads' catch-up pads the shorter rows): a
    seeded row decodes bit for bit the same alone."""
    dec = SpeculativeDecoder()
    target, spec = _target_and_spec(target, kind, sample)
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


def _chain_at_08():
    """The target's transition law at temperature 0.8 and its stationary law."""
    t = order1_table(TARGET)
    p = np.exp((t - t.max(1, keepdims=True)) / 0.8)
    p /= p.sum(1, keepdims=True)
    w, v = np.linalg.eig(p.T)
    pi = np.real(v[:, np.argmax(np.real(w))])
    return p, pi / pi.sum()


def _stationary_acceptance(law_correct, law_buggy):
    """Mean probability that the first draft is accepted (sampled at temperature 0.8, token scheme), over the target's
    stationary chain of (z, y, x), x pending: the correct head reads y's feature, the buggy one z's."""
    p, pi = _chain_at_08()
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


# ----------------------------------------------------------------------------- EAGLE-3 and MTP


def test_deep_target_is_the_table_with_layers_that_differ():
    """The deep target's logits are the order-1 table bit for bit (float32 and bfloat16, with its KV cache), and the
    stream entering layer ``l`` at a position holding ``t`` is exactly ``4 e_c``, ``c = deep_channel(t, l)``: each layer's
    hidden state is a different one-hot."""
    from specdec_ref.static_cache import StaticModelCache

    ids = [3, 5, 0, 7, 1, 2, 6, 4, 4]
    want = exact_model(TARGET).next_logits([[a] for a in ids]).float()
    for dtype in (torch.float32, torch.bfloat16):
        cache = StaticModelCache(deep_target(TARGET, dtype=dtype), max_length=16)
        cache.capture = (0, 1, 2, 3, FINAL)
        logits = torch.cat([cache.feed(torch.tensor([ids[:4]])), cache.feed(torch.tensor([ids[4:]]))], 1)
        assert torch.equal(logits[0].float(), want), dtype
        feats = cache.features()  # the second feed's positions
        for layer in (0, 1, 2, 3):
            assert torch.equal(feats[layer][0], 4 * torch.eye(16)[[deep_channel(a, layer) for a in ids[4:]]]), layer
        assert torch.equal(feats[FINAL][0], feats[3][0])
    assert len({deep_channel(1, layer) for layer in range(4)}) == 4


def test_exact_eagle3_head_logits_are_the_tables_bit_for_bit():
    """The EAGLE-3 head's float32 forward (fuse over the three aux layers, fc, the draft lm_head and d2t) equals its
    float64 law, first step and chained; ids outside the draft vocabulary get -inf."""
    from specdec_ref.heads import Eagle3Proposer

    deep = deep_target(TARGET)
    spec = exact_eagle3_head(deep, TARGET, layer=False)
    law = law_of(spec, TARGET)
    embed = deep.get_input_embeddings().weight
    prop = Eagle3Proposer.__new__(Eagle3Proposer)
    prop.spec, prop.lm_head, prop.vocab = spec, spec.lm_head, 8
    prop.targets = prop.draft_to_target(spec.d2t)
    assert prop.targets.tolist() == list(EAGLE3_VOCAB)
    for x in range(8):
        for y in range(8):
            aux = torch.cat([4 * torch.eye(16)[deep_channel(y, layer)] for layer in (0, 1, 2)])
            h = torch.nn.functional.linear(torch.cat([embed[x], prop.first_features(aux)]), spec.fc)
            assert np.array_equal(prop.logits(h[None])[0].double().numpy(), law.raw([y, x], []))
            for d in range(8):
                h2 = torch.nn.functional.linear(torch.cat([embed[d], h]), spec.fc)
                assert np.array_equal(prop.logits(h2[None])[0].double().numpy(), law.raw([y, x], [d]))


def test_exact_mtp_head_follows_its_float64_law_within_the_tie_margin(target):
    """The MTP module's output norm rounds in float32: its logits stay within 1e-6 of the float64 law (a tenth of the
    law's tie margin), and the position-0 mask zeroes the token term of a two-token text."""
    spec = exact_mtp_head(target, TARGET)
    law = law_of(spec, TARGET)
    worst = 0.0
    from specdec_ref.heads import MtpProposer

    prop = MtpProposer.__new__(MtpProposer)
    prop.spec, prop.embed, prop.lm_head, prop.head_cache = spec, *_parts(target), None
    for x in range(8):
        for y in range(8):
            for length in (2, 3):
                f = 4 * torch.eye(16)[y][None, None]
                pos = torch.tensor([[length - 2]])
                h = prop.step(torch.tensor([[x]]), f, pos)[0, -1]
                text = [0] * (length - 2) + [y, x]
                worst = max(worst, float(np.abs(prop.logits(h[None])[0].double().numpy() - law.raw(text, [])).max()))
                for d in range(8):
                    h2 = prop.step(torch.tensor([[d]]), h[None, None])[0, -1]
                    worst = max(worst, float(np.abs(prop.logits(h2[None])[0].double().numpy() - law.raw(text, [d])).max()))
    assert worst < law.tie / 10, worst
    assert not np.array_equal(law.raw([5, 2], []), law.raw([1, 5, 2], []))  # the mask changes the first pair's law


def _parts(target):
    from specdec_ref.heads import _target_parts

    return _target_parts(target)


def _first_position_acceptance(law, bug):
    """Mean P(m >= i), i = 1..3, of argmax drafts (temperature 0.8, token scheme, k = 3) over the target's stationary
    chain of (y, x), x pending, for ``law`` and ``bug``."""
    p, pi = _chain_at_08()
    cfg, m = SamplingConfig(temperature=0.8), exact_model(TARGET)
    out = {"correct": np.zeros(3), "bug": np.zeros(3)}
    for z in range(8):
        for y in range(8):
            for x in range(8):
                for key, which in (("correct", law), ("bug", bug)):
                    dist = round_acceptance(m, which, [z, y, x], [], cfg, 3, TOKEN)
                    out[key] += pi[z] * p[z, y] * p[y, x] * np.cumsum(dist[::-1])[::-1][1:]
    return out


class _D2tOffByOne(Eagle3Law):
    def raw(self, text, drafts):
        right = super().raw(text, drafts)
        out = np.full(len(right), -np.inf)
        for t in self.vocab:
            out[(t + 1) % len(right)] = right[t]
        return out


def test_eagle3_bugs_cost_acceptance_beyond_the_detected_shift():
    """The effects the acceptance check is sized for, from the laws: fusing the stream leaving each aux layer (the
    feature of token ``y + 3``) takes the first draft's acceptance from 0.548 to 0.489 (a shift of 0.059 >=
    ACCEPT_SHIFT); a d2t off by one to 0.067."""
    from conformance.proposer_checks import ACCEPT_SHIFT

    law = Eagle3Law(TARGET, 0.5, False, vocab=EAGLE3_VOCAB)
    layer = _first_position_acceptance(law, Eagle3Law(TARGET, 0.5, False, vocab=EAGLE3_VOCAB, wrong=(3, 1.0)))
    assert layer["correct"][0] == pytest.approx(0.548, abs=0.002) and layer["bug"][0] == pytest.approx(0.489, abs=0.002)
    assert layer["correct"][0] - layer["bug"][0] >= ACCEPT_SHIFT
    d2t = _first_position_acceptance(law, _D2tOffByOne(TARGET, 0.5, False, vocab=EAGLE3_VOCAB))
    assert d2t["bug"][0] == pytest.approx(0.067, abs=0.002)


def test_eagle3_and_mtp_bugs_change_the_greedy_rounds(target):
    """On the greedy check's prompts the wrong layer, the d2t map and the MTP position-0 mask each change some round's
    drafts (counted from the laws alone)."""
    import dataclasses

    from conformance.proposer_checks import GREEDY_PROMPTS, PROPOSER_K

    m = exact_model(TARGET)
    e3, mtp = Eagle3Law(TARGET, 0.5, False, vocab=EAGLE3_VOCAB), MtpLaw(TARGET, 0.5)
    bugs = {"wrong layer": (e3, dataclasses.replace(e3, wrong=(3, 1.0))),
            "d2t": (e3, _D2tOffByOne(TARGET, 0.5, False, vocab=EAGLE3_VOCAB)),
            "mtp mask": (mtp, dataclasses.replace(mtp, mask_position0=False))}
    differs = dict.fromkeys(bugs, 0)
    for prompt in GREEDY_PROMPTS:
        text = list(prompt) + autoregressive_decode(target, torch.tensor([prompt]), max_new_tokens=24).tokens
        for end in range(2, len(text)):
            for name, (good, bad) in bugs.items():
                a, b = greedy_round(m, good, text[:end], PROPOSER_K), greedy_round(m, bad, text[:end], PROPOSER_K)
                differs[name] += a is not None and b is not None and a != b
    assert differs["wrong layer"] >= 10 and differs["d2t"] >= 10 and differs["mtp mask"] >= 1, differs


def test_bad_eagle3_and_mtp_specs_are_named_errors(target):
    import dataclasses

    dec = SpeculativeDecoder()
    deep = deep_target(TARGET)
    spec = exact_eagle3_head(deep, TARGET)
    cases = {"aux_layers must be": dataclasses.replace(spec, aux_layers=(0, 4)),
             "fuse must be": dataclasses.replace(spec, fuse=spec.fuse[:, :32]),
             "d2t must map": dataclasses.replace(spec, d2t=torch.tensor([0, 0, 0, 0, 0, 3])),
             "lm_head must be": dataclasses.replace(spec, lm_head=spec.lm_head[:4])}
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            dec.decode(deep, bad, torch.tensor([[1, 2]]), k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="deep target"):
        exact_eagle3_head(target, TARGET)
    mtp = exact_mtp_head(target, TARGET)
    with pytest.raises(ValueError, match="target's embedding and lm_head"):
        dec.decode(target, dataclasses.replace(mtp, lm_head=torch.zeros(8, 16)), torch.tensor([[1, 2]]), k=2,
                   max_new_tokens=4)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "mtp"])
def test_batched_sampled_head_caches_are_a_fresh_read_after_every_round(target, kind):
    """decode_batch, sampled drafts, rows of 1 to 4 prompt tokens: after every round each row's head cache equals a
    fresh read of its committed pairs (specdec_properties.stateful_cache.fresh_head_kv), within the round's bounds."""
    from specdec_properties.stateful_cache import compare_kv, fresh_head_kv

    model, spec = _target_and_spec(target, kind, True)
    reqs = [Request(prompt=[1, 2, 1, 2][: 1 + s % 4], max_new_tokens=10, sampling=SamplingConfig(temperature=1.0),
                    seed=s) for s in range(6)]
    seen = []
    results = SpeculativeDecoder().decode_batch(model, spec, reqs, k=3, on_round=lambda r, t, d: seen.append(
        (r.row, r.start, r.committed_len, [(a.clone(), b.clone()) for a, b in d.layer_kv()])))
    for row, start, committed, kv in seen:
        text = reqs[row].prompt + results[row].tokens
        held = kv[0][0].shape[2]
        assert max(start - 1, 0) <= held <= committed - 1
        compare_kv(kv, fresh_head_kv(spec, model, text[:committed], held), context=f" row {row}")
    assert len(seen) > 20
