"""The long-context exactly-known family (specdec_ref.exact.long): exact over 4 096 positions, and a law that a lost,
stale or moved KV entry at the marker, at the previous position or at <bos> changes by a stated total variation.

Bug classes guarded (for the engine checks that use these models): KV blocks lost, stale or taken from another request
(prefix caching, preemption, block tables), positions shifted (chunked prefill, context shift), the previous
position's entry not rolled back.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from specdec_ref.exact.long import (
    LONG_BOS,
    LONG_MARKERS,
    LONG_MAX_POSITIONS,
    LONG_REAL,
    LONG_SHAPES,
    NO_MARKER,
    long_prev_scores,
)
from specdec_ref.exact import MIN_SCORE_GAP, exact_model, exact_pair
from specdec_ref.forward import cache_arg

NAMES = list(LONG_SHAPES)
#: block size of the KV entries moved in the block tests (vLLM's default on CPU: 128)
BLOCK = 128


def _row(length: int, marker_at: int | None, seed: int, marker: int = LONG_MARKERS[1]) -> list[int]:
    rng = random.Random(seed)
    row = [LONG_BOS] + [rng.choice(LONG_REAL) for _ in range(length - 1)]
    if marker_at is not None:
        row[marker_at] = marker
    return row


def _sdpa(name: str):
    model = AutoModelForCausalLM.from_pretrained(str(exact_model(name).path))  # the default attention (sdpa)
    model.eval()
    return model


def _logits(model, row: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([row])).logits[0].double()


def _equal_where_defined(got: torch.Tensor, expected: torch.Tensor) -> None:
    defined = ~torch.isnan(expected)
    bad = (got != expected) & defined
    assert defined.any() and not bad.any(), f"first differing position: {int(bad.any(-1).nonzero()[0])}"


def _prefill(model, ids: list[int]) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), **cache_arg(model, cache), use_cache=True)
    return cache


def _step(model, cache, token: int) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), **cache_arg(model, cache), use_cache=True).logits[0, -1].double()


def _tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((torch.softmax(p, -1) - torch.softmax(q, -1)).abs().sum())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("marker_at", [1, 2047, 4000, None], ids=lambda p: f"marker-{p}")
def test_float32_is_bit_exact_at_every_position_of_4096(name, marker_at):
    m = exact_model(name)
    row = _row(LONG_MAX_POSITIONS, marker_at, seed=NAMES.index(name) * 10 + (marker_at or 0) % 97)
    expected = m.prefix_logits(row)
    _equal_where_defined(_logits(_sdpa(name), row), expected)
    if marker_at in (2047, None):  # the eager kernel (what ExactModel.load gives), full and in verification blocks
        eager = m.load()
        _equal_where_defined(_logits(eager, row[:2300]), expected[:2300])
        cache, out, start, sizes = DynamicCache(config=eager.config), [], 0, (5, 1, 3, 4, 2)
        with torch.no_grad():
            while start < 2300:
                chunk = torch.tensor([row[start : start + sizes[len(out) % 5]]])
                out.append(eager(input_ids=chunk, **cache_arg(eager, cache), use_cache=True).logits[0])
                start += chunk.shape[1]
        _equal_where_defined(torch.cat(out).double(), expected[:2300])


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_is_exact_too(name):
    """The stated bf16 bound is 0, as for order2 (measured on every position of a 4 096-token context)."""
    m = exact_model(name)
    assert m.bf16_logit_bound == 0 and m.bf16_prob_bound == 0
    row = _row(LONG_MAX_POSITIONS, 3001, seed=5)
    model = AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.bfloat16)
    _equal_where_defined(_logits(model, row), m.prefix_logits(row))


@pytest.mark.parametrize("head_dim", sorted({d for d, _ in LONG_SHAPES.values()}))
def test_previous_token_kernel_margin_over_every_offset(head_dim):
    scores = long_prev_scores(head_dim)
    assert scores.shape == (LONG_MAX_POSITIONS,) and int(np.argmax(scores)) == 1
    assert scores[1] - np.delete(scores, 1).max() >= 4 * MIN_SCORE_GAP  # 675: RoPE's float32 rounding is far below


def test_the_law_reads_the_marker_anywhere_the_previous_token_and_the_parity():
    m = exact_model("long-target")
    base = _row(300, 150, seed=1)
    at = m.next_logits([base])[0]
    assert torch.equal(at, torch.from_numpy(m.table[m.cell(base)].copy()))
    assert m.cell(base) == (base[-2], base[-1], 299 % 2, LONG_MARKERS.index(base[150]))
    moved = list(base)
    moved[150], moved[20] = base[151], base[150]  # the same marker elsewhere: the same law
    assert torch.equal(m.next_logits([moved])[0], at)
    other = list(base)
    other[150] = LONG_MARKERS[3]
    assert _tv(m.next_logits([other])[0], at) > 0.01
    gone = list(base)
    gone[150] = LONG_REAL[0]
    assert m.cell(gone)[3] == NO_MARKER
    # mean total variation between rows that differ in one input only (stated in docs/exact-models.md)
    cells = [c for c in m.cells() if c[0] != LONG_BOS]
    row = {c: torch.tensor(m.table[c]) for c in m.cells()}
    lost = np.mean([_tv(row[(a, b, c, k)], row[(a, b, c, NO_MARKER)]) for a, b, c, k in cells if k != NO_MARKER])
    swapped = np.mean([_tv(row[(a, b, c, k)], row[(a, b, c, (k + 1) % 4)]) for a, b, c, k in cells if k != NO_MARKER])
    parity = np.mean([_tv(row[(a, b, 0, k)], row[(a, b, 1, k)]) for a, b, c, k in cells if c == 0])
    prev = np.mean([_tv(row[(a, b, c, k)], row[(LONG_REAL[(LONG_REAL.index(a) + 1) % 7], b, c, k)]) for a, b, c, k in cells])
    assert lost > 0.45 and swapped > 0.4 and parity > 0.25 and prev > 0.2, (lost, swapped, parity, prev)


def test_contexts_the_law_does_not_define_are_refused_and_nan_per_prefix():
    m = exact_model("long-target")
    with pytest.raises(ValueError, match="at most one marker"):
        m.next_logits([[LONG_BOS, 8, 1, 9, 2, 3]])
    with pytest.raises(ValueError, match="at least two positions before the last"):
        m.next_logits([[LONG_BOS, 1, 8, 2]])
    with pytest.raises(ValueError, match="at most 4096"):
        m.next_logits([[LONG_BOS] + [1] * LONG_MAX_POSITIONS])
    rows = m.prefix_logits([LONG_BOS, 1, 8, 2, 3, 9, 4, 5])
    defined = (~torch.isnan(rows[:, 0])).tolist()
    assert defined == [True, True, False, False, True, False, False, False]
    assert torch.all(m.next_probs(m.row_contexts())[:, list(LONG_MARKERS) + [LONG_BOS]] == 0)  # never generated


def test_a_lost_or_foreign_marker_entry_changes_the_law_exactly():
    """A KV block of another request (prefix caching, a stale block table) or without the marker (a lost block):
    the checkpoint follows the law of the context whose entries it reads, exactly."""
    m = exact_model("long-target")
    model = m.load()
    context = _row(600, 2 * BLOCK + 5, seed=3)  # the marker inside the third block
    other = list(context)
    other[2 * BLOCK + 5] = LONG_MARKERS[2]
    plain = list(context)
    plain[2 * BLOCK + 5] = LONG_REAL[2]
    for donor_ids, law in ((other, other), (plain, plain)):
        cache, donor = _prefill(model, context[:-1]), _prefill(model, donor_ids[:-1])
        block = slice(2 * BLOCK, 3 * BLOCK)
        cache.layers[0].keys[:, :, block] = donor.layers[0].keys[:, :, block]
        cache.layers[0].values[:, :, block] = donor.layers[0].values[:, :, block]
        got = _step(model, cache, context[-1])
        assert torch.equal(got, m.next_logits([law])[0])
        assert _tv(got, m.next_logits([context])[0]) > 0.01


def test_a_shifted_position_changes_the_law_and_a_uniform_shift_does_not():
    m = exact_model("long-target")
    model = m.load()
    row = _row(1000, 700, seed=4)
    truth = m.next_logits([row])[0]
    cache = _prefill(model, row[:-1])
    with torch.no_grad():
        late = model(input_ids=torch.tensor([[row[-1]]]), **cache_arg(model, cache), use_cache=True,
                     position_ids=torch.tensor([[len(row)]])).logits[0, -1].double()
    assert _tv(late, truth) > 0.01  # one position too far: no key one step back, parity flipped
    with torch.no_grad():
        shifted = model(torch.tensor([row]), position_ids=torch.arange(len(row))[None] + 2 * BLOCK).logits[0, -1].double()
    assert torch.equal(shifted, truth)  # RoPE reads relative offsets only


def test_the_draft_reads_the_marker_too_and_its_acceptance_is_stated():
    pair = exact_pair("long-close")
    assert pair.mean_acceptance() == pytest.approx(0.9104, abs=5e-5)
    d = pair.draft
    with_marker, without = _row(50, 10, seed=6), _row(50, None, seed=6)
    assert not torch.equal(d.next_logits([with_marker]), d.next_logits([without]))


def test_the_black_box_tool_certifies_long_prompts_and_prints_them_abbreviated():
    """The black-box tool takes the long family as it is (``--model long-target``); its report prints a 2 000-token
    prompt as one line (first and last ids, the count between) and still rejects a completion file that lost the
    marker (the law of the prompt without it: TV 0.49 on average)."""
    from conformance.report import show_ids
    from conformance.samples import certify_samples
    from specdec_ref.warp import SamplingConfig

    m = exact_model("long-target")
    prompt = _row(2000, 1200, seed=8)
    lost = list(prompt)
    lost[1200] = LONG_REAL[0]
    rng = np.random.default_rng(0)

    def sample(ctx, n):  # one-token completions from the exact law of ctx
        p = m.next_probs([ctx])[0].numpy()
        return [{"prompt_ids": prompt, "completion_ids": [int(t)], "seed": i} for i, t in enumerate(rng.choice(len(p), n, p=p))]

    good = certify_samples(sample(prompt, 3000), model="long-target", sampling=SamplingConfig(), max_new_tokens=1,
                           eos_id=m.eos_id)
    bad = certify_samples(sample(lost, 3000), model="long-target", sampling=SamplingConfig(), max_new_tokens=1,
                          eos_id=m.eos_id)
    shown = show_ids(prompt)
    assert shown == f"[{', '.join(map(str, prompt[:8]))}, .. 1984 more .., {', '.join(map(str, prompt[-8:]))}] (2000 ids)"
    assert good.level == "inconclusive" and bad.level == "not_certified", bad.report()  # one token: no drafted position
    assert f"prompt {shown}" in bad.report() and str(prompt) not in bad.report()
    assert show_ids([6, 1, 2]) == "[6, 1, 2]"
