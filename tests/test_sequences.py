"""Exact law of decoded continuations: enumeration, EOS, cells, boundary margins, Monte-Carlo agreement."""
import math

import numpy as np
import pytest
import torch

from specdec_properties.sequences import (
    IMPOSSIBLE_LABEL,
    OTHER_LABEL,
    boundary_margin,
    continuation_law,
    law_to_cells,
    sequence_label,
)
from specdec_properties.stats import goodness_of_fit
from specdec_ref.models import next_token_logits, tiny_lm
from specdec_ref.warp import SamplingConfig, warp


PROMPT = [3, 1, 4, 1, 5, 9]
UNFILTERED = SamplingConfig()


@pytest.fixture(scope="module")
def model():
    return tiny_lm("llama", seed=0, init_scale=4.0)


def _direct_prob(model, prompt, seq, config):
    """Product of per-step warped probabilities, one high-precision forward per step."""
    p = 1.0
    for i, tok in enumerate(seq):
        z = next_token_logits(model, [list(prompt) + list(seq[:i])], high_precision=True)[0, -1]
        p *= float(warp(z, config, dtype=torch.float64)[tok])
    return p


@pytest.mark.parametrize("n, leaves", [(2, 256), (3, 4096)])
def test_unfiltered_law_enumerates_everything_and_sums_to_one(model, n, leaves):
    law = continuation_law(model, PROMPT, n, UNFILTERED)
    assert len(law) == leaves
    assert all(len(s) == n for s in law)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert law.pruned_mass == 0
    for seq in list(law)[:: max(1, leaves // 3)]:
        assert law[seq] == pytest.approx(_direct_prob(model, PROMPT, seq, UNFILTERED), rel=1e-10)


def test_prompt_may_be_a_tensor(model):
    a = continuation_law(model, torch.tensor([PROMPT]), 2, UNFILTERED)
    b = continuation_law(model, PROMPT, 2, UNFILTERED)
    assert a == b and a.prompt == PROMPT


@pytest.mark.parametrize("n", [2, 3, 4])
def test_top_k_2_gives_2_to_the_n_leaves(model, n):
    config = SamplingConfig(top_k=2)
    law = continuation_law(model, PROMPT, n, config)
    assert len(law) == 2**n
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    seq = max(law, key=law.get)
    assert law[seq] == pytest.approx(_direct_prob(model, PROMPT, seq, config), rel=1e-10)


def test_greedy_gives_the_argmax_path(model):
    law = continuation_law(model, PROMPT, 4, SamplingConfig(greedy=True))
    assert len(law) == 1
    (seq, p), = law.items()
    assert p == 1.0
    ids = list(PROMPT)
    for tok in seq:
        assert tok == int(next_token_logits(model, [ids], high_precision=True)[0, -1].argmax())
        ids.append(tok)


def test_eos_truncates_and_the_law_still_sums_to_one(model):
    root = next_token_logits(model, [PROMPT], high_precision=True)[0, -1].softmax(-1)
    eos = int(root.argsort()[-2])  # a likely first token: plenty of short continuations
    law = continuation_law(model, PROMPT, 3, UNFILTERED, eos_id=eos)
    lengths = {len(s) for s in law}
    assert lengths == {1, 2, 3}
    for seq in law:
        assert eos not in seq[:-1]  # nothing after EOS
        assert len(seq) == 3 or seq[-1] == eos
    assert law[(eos,)] == pytest.approx(float(root[eos]), rel=1e-12)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    cells = law_to_cells(law)
    assert sequence_label((eos,), eos) in cells.labels
    assert cells.index_of((eos, 0)) == len(cells.labels) - 1  # a token after EOS is impossible
    assert "EOS" in sequence_label((2, eos), eos) and sequence_label((2, eos), eos).startswith("2 ")


def test_min_prob_pruning_keeps_the_books_balanced(model):
    law = continuation_law(model, PROMPT, 3, UNFILTERED, min_prob=1e-3)
    assert law.pruned_mass > 0 and law.pruned_prefixes
    assert math.fsum(law.values()) + law.pruned_mass == pytest.approx(1.0, abs=1e-12)
    assert all(p >= 1e-3 for p in law.values())
    cells = law_to_cells(law)
    assert cells.labels[-2:] == [OTHER_LABEL, IMPOSSIBLE_LABEL]
    assert cells.probs[-2] == pytest.approx(law.pruned_mass)
    pruned = min(law.pruned_prefixes, key=len)
    extension = pruned + (0,) * (3 - len(pruned))
    assert cells.index_of(extension) == len(cells.labels) - 2  # OTHER, not IMPOSSIBLE


def test_cells_are_deterministic_and_map_sequences(model):
    law = continuation_law(model, PROMPT, 2, SamplingConfig(top_k=3))
    cells = law_to_cells(law, min_expected_prob=0.01)
    again = law_to_cells(continuation_law(model, PROMPT, 2, SamplingConfig(top_k=3)), min_expected_prob=0.01)
    assert cells.labels == again.labels and np.array_equal(cells.probs, again.probs)
    assert cells.probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert cells.labels[-1] == IMPOSSIBLE_LABEL and cells.probs[-1] == 0
    kept = [s for s in cells.sequences if s is not None]
    assert kept == sorted(kept)
    for i, seq in enumerate(cells.sequences):
        if seq is not None:
            assert cells.index_of(seq) == i
            assert cells.index_of(torch.tensor(seq)) == i
            assert cells.labels[i] == " ".join(map(str, seq))
    small = [s for s in law if law[s] < 0.01]
    if small:
        assert cells.labels[cells.index_of(small[0])] == OTHER_LABEL
    outside = next((a, b) for a in range(16) for b in range(16) if (a, b) not in law)
    assert cells.index_of(outside) == len(cells.labels) - 1
    assert cells.index_of((1, 2, 3)) == len(cells.labels) - 1  # wrong length
    counts = cells.counts([kept[0], kept[0], outside])
    assert counts.sum() == 3 and counts[0] == 2 and counts[-1] == 1
    assert cells.impossible_examples([kept[0], outside]) == [sequence_label(outside)]
    fit = goodness_of_fit(counts, cells.probs, what="impossible sample", labels=cells.labels)
    assert not fit.passed and fit.impossible


def test_boundary_margin(model):
    assert boundary_margin(model, PROMPT, 3, UNFILTERED).logit_gap == math.inf
    assert boundary_margin(model, PROMPT, 3, UNFILTERED).mass_gap == math.inf
    z = next_token_logits(model, [PROMPT], high_precision=True)[0, -1]
    sz = z.sort(descending=True).values
    m = boundary_margin(model, PROMPT, 3, SamplingConfig(top_k=2))
    assert m.prefixes == 1 + 2 + 4
    assert 0 < m.logit_gap <= float(sz[1] - sz[2])
    g = boundary_margin(model, PROMPT, 3, SamplingConfig(greedy=True))
    assert g.prefixes == 3 and 0 < g.logit_gap <= float(sz[0] - sz[1])
    # a top_p sitting exactly on a cumulative mass of the root distribution: zero mass margin
    p = z.softmax(-1).sort(descending=True).values
    on_edge = SamplingConfig(top_p=float(p[:3].sum()))
    edge = boundary_margin(model, PROMPT, 2, on_edge)
    assert edge.mass_gap < 1e-12 and edge.where_mass == ()
    with pytest.raises(AssertionError, match="too close to a support boundary"):
        edge.assert_safe(torch.float32)
    # a top_p comfortably between two cumulative masses passes for float32
    mid = SamplingConfig(top_p=float(p[:2].sum() + p[2] / 2))
    ok = boundary_margin(model, PROMPT, 2, mid)
    assert ok.mass_gap > 1e-3


def _sample_ar(model, prompt, n, config, num, seed, eos_id=None):
    """Plain AR sampling in float32: batched full forwards, torch.multinomial on warp(float32)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt] * num)
    done = torch.zeros(num, dtype=torch.bool)
    out = torch.full((num, n), -1)
    for i in range(n):
        probs = warp(next_token_logits(model, ids)[:, -1], config, dtype=torch.float32)
        tok = torch.multinomial(probs, 1, generator=g)[:, 0]
        out[:, i] = torch.where(done, -1, tok)
        if eos_id is not None:
            done |= tok == eos_id
        ids = torch.cat([ids, tok[:, None]], dim=1)
    return [tuple(t for t in row if t >= 0) for row in out.tolist()]


@pytest.mark.parametrize(
    "n, config, eos",
    [
        (2, SamplingConfig(temperature=0.7), None),
        (3, SamplingConfig(top_k=3, temperature=1.2), None),
        (3, SamplingConfig(top_p=0.9), 13),
    ],
    ids=["temp0.7-n2", "topk3-n3", "topp0.9-eos-n3"],
)
def test_law_agrees_with_monte_carlo_ar_sampling(model, n, config, eos):
    boundary_margin(model, PROMPT, n, config, eos_id=eos).assert_safe(torch.float32)
    law = continuation_law(model, PROMPT, n, config, eos_id=eos)
    cells = law_to_cells(law)
    samples = _sample_ar(model, PROMPT, n, config, num=4000, seed=n * 1000 + len(cells.labels), eos_id=eos)
    counts = cells.counts(samples)
    assert counts[-1] == 0, cells.impossible_examples(samples)
    fit = goodness_of_fit(counts, cells.probs, what=f"AR continuations {config}", labels=cells.labels, alpha=1e-6)
    assert fit.passed, fit.report()
    # the test has teeth: the same samples against the law of another prompt are rejected
    wrong = law_to_cells(continuation_law(model, PROMPT[:-1] + [2], n, config, eos_id=eos))
    bad = goodness_of_fit(wrong.counts(samples), wrong.probs, what="wrong law", labels=wrong.labels, alpha=1e-6)
    assert not bad.passed


# --------------------------------------------------------------------------- exactly-known models


def _exact(name):
    from specdec_ref.exact import exact_model

    return exact_model(name)


@pytest.mark.parametrize(
    "name, prompt, n, config, eos",
    [
        ("order1-target", [3], 3, UNFILTERED, None),
        ("order1-target", [0, 5], 3, SamplingConfig(top_k=2, temperature=0.7), 7),
        ("order2-target", [6], 3, UNFILTERED, 7),
        ("order2-target", [6, 1, 4], 3, SamplingConfig(top_p=0.8, temperature=1.3), None),
        ("order2-draft", [6, 2], 2, SamplingConfig(greedy=True), 7),
    ],
    ids=["o1-plain", "o1-topk-eos", "o2-bos-eos", "o2-topp", "o2draft-greedy"],
)
def test_exact_model_law_uses_the_tables_and_equals_the_checkpoints_law(name, prompt, n, config, eos):
    exact = _exact(name)
    law = continuation_law(exact, prompt, n, config, eos_id=eos)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert law.prompt == prompt and law.pruned_mass == 0
    if exact.bos_id is not None:  # <bos> has probability exactly 0: never generated
        assert all(exact.bos_id not in seq for seq in law)
    # the same law from the shipped checkpoint, run in float64 (reference_logits path)
    from_checkpoint = continuation_law(exact.load(), prompt, n, config, eos_id=eos)
    assert set(law) == set(from_checkpoint)
    assert max(abs(law[s] - from_checkpoint[s]) for s in law) <= 1e-12
    # boundary margins are computed from the tables too
    assert boundary_margin(exact, prompt, n, config, eos_id=eos).prefixes >= 1


def test_exact_model_law_hand_computed():
    exact = _exact("order1-target")
    row = {t: [v / 8 for v in r] for t, r in enumerate(
        [(24, 8, 8, 8, -8, -16, -4, 4), (4, -2, 12, 0, 6, -8, 2, 10), (-12, 18, 4, -6, 4, 4, -16, 8),
         (10, 0, -8, 20, 0, 14, -4, -24), (-4, 6, 6, 0, 8, 16, 6, 12), (32, -8, 2, 12, -20, 0, 12, 7),
         (0, 4, -10, 2, 22, 4, 8, 1), (8, 8, 4, -4, 0, 2, -8, 11)])}

    def softmax(z, keep=None):
        keep = range(len(z)) if keep is None else keep
        tot = math.fsum(math.exp(z[i]) for i in keep)
        return {i: math.exp(z[i]) / tot for i in keep}

    # unfiltered, EOS (id 7) stops: P(7) after [1]; P(x, y) = p(x | 1) p(y | x)
    law = continuation_law(exact, [1], 2, UNFILTERED, eos_id=7)
    p1 = softmax(row[1])
    assert law[(7,)] == pytest.approx(p1[7], rel=1e-13)
    assert law[(2, 4)] == pytest.approx(p1[2] * softmax(row[2])[4], rel=1e-13)
    assert len(law) == 7 * 8 + 1
    # top_k = 2 on row 5 keeps three tokens (exact tie of tokens 3 and 6 at 1.5 behind 4.0)
    law = continuation_law(exact, [5], 1, SamplingConfig(top_k=2))
    expected = softmax(row[5], keep=[0, 3, 6])
    assert set(law) == {(0,), (3,), (6,)}
    for t, p in expected.items():
        assert law[(t,)] == pytest.approx(p, rel=1e-13)
    assert law[(3,)] == law[(6,)]
    # greedy: the argmax path 5 -> 0 -> 0 -> 0
    assert continuation_law(exact, [5], 3, SamplingConfig(greedy=True)) == {(0, 0, 0): 1.0}


def test_exact_order2_law_depends_on_position_and_previous_token():
    exact = _exact("order2-target")
    # same last two tokens (1, 4) at an even and at an odd position: different laws
    even = continuation_law(exact, [6, 1, 4], 1, UNFILTERED)
    odd = continuation_law(exact, [6, 0, 1, 4], 1, UNFILTERED)
    other_prev = continuation_law(exact, [6, 2, 4], 1, UNFILTERED)
    tv = lambda a, b: 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))  # noqa: E731
    assert tv(even, odd) > 0.05 and tv(even, other_prev) > 0.05
    # the token before the previous one does not matter
    assert continuation_law(exact, [6, 3, 5, 1, 4], 2, UNFILTERED) == continuation_law(exact, [6, 0, 2, 1, 4], 2, UNFILTERED)
