"""The greedy divergence classifier: numerical flips vs algorithmic divergences, and its tolerances."""
import json
import math

import pytest
import torch

from specdec_properties.flips import (
    ALGORITHMIC_DIVERGENCE,
    NUMERICAL_FLIP,
    TOLERANCE,
    classify_divergence,
    classify_sequences,
    first_divergence,
    high_precision_logits,
    high_precision_model,
    measure_logit_error,
    tolerance_for,
)
from specdec_ref.forward import reference_logits
from specdec_ref.models import next_token_logits, tiny_lm



@pytest.fixture(scope="module")
def peaked():
    return tiny_lm("llama", seed=3, init_scale=4.0)


def _prompt(seed, length=8, vocab=16):
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def _ar_greedy(model, prompt, n):
    ids = prompt.clone()
    out = []
    for _ in range(n):
        tok = int(next_token_logits(model, ids)[0, -1].argmax())
        out.append(tok)
        ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([], []) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([4], [5]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 2, 3, 4], [1, 2]) == 2
    assert first_divergence(torch.tensor([[1, 2, 3]]), (1, 2, 9)) == 2


def test_high_precision_logits_match_next_token_logits_and_are_cached():
    model = tiny_lm("qwen2", seed=5)
    ids = _prompt(1, 12)
    ours = high_precision_logits(model, ids)
    ref = next_token_logits(model, ids, high_precision=True)
    assert ours.dtype == torch.float64
    assert torch.equal(ours, ref)
    first = high_precision_model(model)
    assert high_precision_model(model) is first  # no re-copy
    with torch.no_grad():
        model.lm_head.weight[0].add_(1.0)  # in-place edit invalidates the cached float64 copy
    second = high_precision_model(model)
    assert second is not first
    assert torch.equal(high_precision_logits(model, ids), next_token_logits(model, ids, high_precision=True))


def test_tolerance_for_scales_with_logits_and_honours_overrides():
    assert tolerance_for(torch.bfloat16, logits_scale=10.0) == pytest.approx(10 * TOLERANCE[torch.bfloat16])
    assert tolerance_for(torch.float32, logits_scale=0.01) == TOLERANCE[torch.float32]  # floor at scale 1
    assert tolerance_for(torch.float32) < tolerance_for(torch.float16) < tolerance_for(torch.bfloat16)
    assert tolerance_for("torch.bfloat16", logits_scale=2.0) == tolerance_for(torch.bfloat16, logits_scale=2.0)

    class M(torch.nn.Module):
        specdec_flip_tolerance = {torch.bfloat16: 0.5}

    assert tolerance_for(torch.bfloat16, M(), logits_scale=2.0) == pytest.approx(1.0)
    assert tolerance_for(torch.float32, M(), logits_scale=2.0) == pytest.approx(2 * TOLERANCE[torch.float32])
    with pytest.raises(ValueError):
        tolerance_for(torch.int64)


def _make_near_tie(model, prefix, ulps):
    """Copy the argmax token's lm_head row to another token, nudged by ``ulps`` float32 ulps in one entry."""
    z = high_precision_logits(model, prefix)[0, -1]
    a = int(z.argmax())
    b = (a + 7) % z.numel()
    with torch.no_grad():
        row = model.lm_head.weight[a].clone()
        for _ in range(ulps):
            row[0] = torch.nextafter(row[0], torch.tensor(math.inf))
        model.lm_head.weight[b].copy_(row)
    return a, b


@pytest.mark.parametrize("ulps", [0, 3])
def test_near_tie_is_a_numerical_flip(ulps):
    model = tiny_lm("llama", seed=11, init_scale=1.0)
    prefix = _prompt(2, 10)
    a, b = _make_near_tie(model, prefix, ulps)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        v = classify_divergence(model, prefix, a, b, dtype_under_test=dtype)
        assert v.kind == NUMERICAL_FLIP, v.describe()
        assert v.is_numerical_flip and not v.is_bug
        assert {v.rank_a, v.rank_b} == {0, 1}
        assert {v.top1_token, v.top2_token} == {a, b}
        assert v.gap_between == pytest.approx(v.gap_top1_top2)
        assert v.gap_between <= 1e-6
        assert (v.gap_between == 0) == (ulps == 0)
    # with no tolerance at all only an exact tie is still a flip
    strict = classify_divergence(model, prefix, a, b, tolerance=0.0)
    assert strict.kind == (NUMERICAL_FLIP if ulps == 0 else ALGORITHMIC_DIVERGENCE)


def test_a_clearly_worse_token_is_an_algorithmic_divergence(peaked):
    prefix = _prompt(4, 9)
    z = high_precision_logits(peaked, prefix)[0, -1]
    best, worst = int(z.argmax()), int(z.argmin())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        v = classify_divergence(peaked, prefix, worst, best, dtype_under_test=dtype)
        assert v.kind == ALGORITHMIC_DIVERGENCE and v.is_bug, v.describe()
        assert v.rank_a == z.numel() - 1 and v.rank_b == 0
        assert v.gap_between == pytest.approx(float(z.max() - z.min()))
        assert v.gap_between > v.tolerance
    # the same pair under an absurd explicit tolerance is a flip: the tolerance is what decides
    assert classify_divergence(peaked, prefix, worst, best, tolerance=1e3).kind == NUMERICAL_FLIP


def test_real_bf16_flips_are_classified_as_numerical():
    """Positions where the bf16 model's argmax differs from float64 are flips under bf16, not float32."""
    model = tiny_lm("llama", seed=0, init_scale=1.0)
    low = tiny_lm("llama", seed=0, init_scale=1.0, dtype=torch.bfloat16)
    ids = torch.randint(0, 16, (4, 64), generator=torch.Generator().manual_seed(99))
    z64 = high_precision_logits(model, ids)
    zlow = reference_logits(low, ids)  # the bf16 model itself, float32 logits
    found = 0
    for b, t in zip(*torch.nonzero(zlow.argmax(-1) != z64.argmax(-1), as_tuple=True)):
        prefix = ids[b, : t + 1].tolist()
        bf_tok, ref_tok = int(zlow[b, t].argmax()), int(z64[b, t].argmax())
        v = classify_divergence(model, prefix, bf_tok, ref_tok, dtype_under_test=torch.bfloat16)
        assert v.kind == NUMERICAL_FLIP, v.describe()
        # the same divergence in a float32 run would be a bug: these gaps dwarf float32 rounding
        assert classify_divergence(model, prefix, bf_tok, ref_tok).kind == ALGORITHMIC_DIVERGENCE
        found += 1
    assert found >= 1  # the seeded search does hit real bf16 flips


def test_describe_and_record(peaked):
    prefix = _prompt(6, 12).tolist()[0]
    z = high_precision_logits(peaked, [prefix])[0, -1]
    a, b = int(z.argmin()), int(z.argmax())
    v = classify_divergence(peaked, prefix, a, b, dtype_under_test=torch.bfloat16, position=5)
    text = v.describe()
    for needle in (
        f"token {a}",
        f"token {b}",
        f"{v.gap_between:.3g}",
        f"{v.gap_top1_top2:.3g}",
        f"{v.tolerance:.3g}",
        "torch.bfloat16",
        "ALGORITHMIC DIVERGENCE",
        "position 5",
        " ".join(map(str, prefix[-8:])),
    ):
        assert needle in text, (needle, text)
    record = json.loads(json.dumps(v.as_record()))
    assert record["kind"] == ALGORITHMIC_DIVERGENCE
    assert record["token_a"] == a and record["token_b"] == b and record["prefix"] == prefix
    assert record["description"] == text
    with pytest.raises(Exception):
        v.kind = NUMERICAL_FLIP  # frozen


def test_classify_sequences(peaked):
    prompt = _prompt(8, 6)
    ar = _ar_greedy(peaked, prompt, 8)
    assert classify_sequences(peaked, prompt, ar, list(ar)) is None

    spec = list(ar)
    prefix = prompt[0].tolist() + ar[:3]
    z = high_precision_logits(peaked, [prefix])[0, -1]
    spec[3] = int(z.argmin())
    v = classify_sequences(peaked, prompt, spec, ar, dtype_under_test=torch.bfloat16)
    assert v.position == 3 and v.prefix == prefix
    assert (v.token_a, v.token_b) == (spec[3], ar[3])
    assert v.kind == ALGORITHMIC_DIVERGENCE
    assert "speculative emitted" in v.describe() and "AR emitted" in v.describe()

    short = classify_sequences(peaked, prompt, ar[:5], ar)
    assert short.position == 5 and short.token_a is None and short.token_b == ar[5]
    assert short.kind == ALGORITHMIC_DIVERGENCE and short.logit_a is None
    assert "ended early" in short.describe()
    json.dumps(short.as_record())


def _fresh_models():
    g = torch.Generator().manual_seed(2024)
    prompts = [torch.randint(0, 16, (1, 60), generator=g) for _ in range(2)]
    for arch in ("llama", "qwen2", "gpt2"):
        yield arch, tiny_lm(arch, seed=17, init_scale=4.0), prompts
    try:
        from specdec_ref.pretrained import load_trained_pair, sample_prompts

        target, _ = load_trained_pair()
    except Exception:  # the trained pair is optional for this check
        return
    yield "pair target", target, sample_prompts(2, length=60, seed=123)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tolerance_exceeds_measured_error_on_fresh_prompts(dtype):
    """Fresh seeds and prompts (not the ones of the docstring table): every row's gap error is in tolerance."""
    for name, model, prompts in _fresh_models():
        err = measure_logit_error(model, dtype, prompts)
        assert err.positions == 2 * sum(p.shape[1] for p in prompts)
        allowed = torch.tensor([tolerance_for(dtype, logits_scale=float(s)) for s in err.scale])
        assert (err.gap_err <= allowed).all(), (name, dtype, err.max_gap, err.max_gap_rel)
        # and with room to spare: the stated 4x margin leaves at least 2x on fresh data
        assert err.max_gap_rel * 2 <= TOLERANCE[dtype], (name, dtype, err.max_gap_rel)
