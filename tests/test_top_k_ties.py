"""The top-k tie rule is a declared setting (``SamplingConfig.top_k_ties``) that the warper and the exact laws both read."""
import itertools

import numpy as np
import pytest
import torch

from conformance.samples import split_ties
from specdec_properties.sequences import continuation_law, next_token_law
from specdec_ref.contract import NotSupportedError
from specdec_ref.exact import exact_model
from specdec_ref.adapters.hf_backends import hf_sampling_options
from specdec_ref.history import warp_rows
from specdec_ref.warp import TOP_K_TIES, SamplingConfig, top_k_filter, warp, warp_logits


def _kept(x: torch.Tensor) -> list:
    return torch.isfinite(x).tolist()


def _old_top_k(x: torch.Tensor, k: int) -> torch.Tensor:
    """The filter as it was before the tie rule became a setting (every token tied with the k-th kept)."""
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, float("-inf"))


def _lowest_ids_numpy(row: np.ndarray, k: int) -> set:
    """Independent statement of the rule: the k first tokens ordered by (larger logit first, then smaller id)."""
    return set(sorted(range(len(row)), key=lambda t: (-row[t], t))[:k])


def test_a_tied_row_keeps_exactly_k_lowest_ids_or_every_tied_token():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0, 2.0]])  # tokens 2, 3 and 5 tie for 2nd
    assert _kept(top_k_filter(x, 2)) == [[True, False, True, True, False, True]]  # "all": 4 tokens
    assert _kept(top_k_filter(x, 2, "all")) == [[True, False, True, True, False, True]]
    assert _kept(top_k_filter(x, 2, "lowest_ids")) == [[True, False, True, False, False, False]]  # exactly 2: ids 0, 2
    assert _kept(top_k_filter(x, 3, "lowest_ids")) == [[True, False, True, True, False, False]]
    assert _kept(top_k_filter(x, 4, "lowest_ids")) == [[True, False, True, True, False, True]]  # no tie cut: same as "all"
    assert top_k_filter(x, None, "lowest_ids") is x and top_k_filter(x, 6, "lowest_ids") is x
    flat = torch.ones(2, 5)  # a whole row tied
    assert _kept(top_k_filter(flat, 2, "lowest_ids")) == [[True, True, False, False, False]] * 2
    with pytest.raises(ValueError, match="top-k ties must be one of"):
        top_k_filter(x, 2, "highest_ids")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_lowest_ids_matches_an_independent_statement_and_all_is_unchanged(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, (4, 6, 16), generator=gen).to(dtype)  # integer logits: ties everywhere
    x[0, 0, :3] = float("-inf")  # masked tokens (history steps) stay out
    for k in (1, 2, 5, 9):
        assert torch.equal(top_k_filter(x, k), _old_top_k(x, k)), k  # "all" is the old filter, bit for bit
        lowest = top_k_filter(x, k, "lowest_ids")
        kept = torch.isfinite(lowest)
        assert (kept.sum(-1) == k).all(), k  # exactly k tokens (every row has >= k finite logits here)
        for b, r in itertools.product(range(4), range(6)):
            row = x[b, r].to(torch.float64).numpy()
            assert set(torch.nonzero(kept[b, r]).flatten().tolist()) == _lowest_ids_numpy(row, k), (k, b, r)
        assert torch.equal(lowest[kept], x[kept])  # kept logits untouched
    cfg = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    assert torch.equal(warp_logits(x, cfg, dtype), warp_logits(x, SamplingConfig(temperature=0.7, top_k=5, top_p=0.9,
                                                                                  top_k_ties="all"), dtype))


def test_the_field_is_validated_hashable_and_off_by_default():
    assert TOP_K_TIES == ("all", "lowest_ids") and SamplingConfig().top_k_ties == "all"
    assert SamplingConfig(top_k=2) == SamplingConfig(top_k=2, top_k_ties="all")
    a, b = SamplingConfig(top_k=2), SamplingConfig(top_k=2, top_k_ties="lowest_ids")
    assert a != b and len({a, b, SamplingConfig(top_k=2)}) == 2  # hashable, the rule part of the identity
    assert b.as_dict()["top_k_ties"] == "lowest_ids" and a.as_dict()["top_k_ties"] == "all"
    assert "top_k_ties" not in a.label() and b.label() == "top_k=2, top_k_ties=lowest_ids"
    for bad in ("lowest-ids", "", None, 1):
        with pytest.raises(ValueError, match=r"top_k_ties must be one of 'all', 'lowest_ids'"):
            SamplingConfig(top_k=2, top_k_ties=bad)


def test_warp_and_batched_rows_read_the_rule():
    x = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0, 2.0]])
    low = SamplingConfig(top_k=2, top_k_ties="lowest_ids")
    p = warp(x, low, dtype=torch.float64)
    assert (p > 0).tolist() == [[True, False, True, False, False, False]]
    assert float(p[0, 0]) == pytest.approx(np.exp(3) / (np.exp(3) + np.exp(2)))
    # rows of a batch with different rules (grouped by their settings) each get their own law
    rows = torch.cat([x, x]).unsqueeze(1)  # [B=2, m=1, V]
    both = warp_rows(rows, [SamplingConfig(top_k=2), low])
    assert int((both[0, 0] > 0).sum()) == 4 and int((both[1, 0] > 0).sum()) == 2


def _order1_law(prompt, n, temperature, k, ties, eos):
    """An independent float64 enumerator of the order-1 table's continuation law (numpy, no warp)."""
    table = np.asarray(exact_model("order1-target").next_logits([[t] for t in range(8)]), dtype=np.float64)

    def row(last):
        x = table[last] / temperature
        keep = x >= np.sort(x)[::-1][k - 1] if ties == "all" else np.isin(np.arange(8), list(_lowest_ids_numpy(x, k)))
        p = np.where(keep, np.exp(x - x.max()), 0.0)
        return p / p.sum()

    law = {}

    def walk(seq, prob):
        if len(seq) == n or (seq and seq[-1] == eos):
            law[tuple(seq)] = prob
            return
        p = row(seq[-1] if seq else prompt[-1])
        for t in np.flatnonzero(p > 0):
            walk(seq + [int(t)], prob * p[t])

    walk([], 1.0)
    return law


@pytest.mark.parametrize("ties", TOP_K_TIES)
def test_the_exact_laws_apply_the_declared_rule(ties):
    """specdec_properties.sequences (what the black-box tool tests against) equals an independent enumerator under either rule,
    and the two rules differ exactly at the table rows where top-k 2 cuts a tie (rows 0 and 5 of order1-target)."""
    model = exact_model("order1-target")
    cfg = SamplingConfig(temperature=1.5, top_k=2, top_k_ties=ties)
    law = continuation_law(model, [0, 4], 3, cfg, eos_id=7)
    expected = _order1_law([0, 4], 3, 1.5, 2, ties, 7)
    assert set(law) == set(expected)
    assert all(law[s] == pytest.approx(expected[s], abs=1e-12) for s in law)
    rows = [[t] for t in range(8)]
    other = "lowest_ids" if ties == "all" else "all"
    differs = [r for r in range(8) if not torch.equal(
        next_token_law(model, rows[r], [()], cfg), next_token_law(model, rows[r], [()], SamplingConfig(
            temperature=1.5, top_k=2, top_k_ties=other)))]
    assert differs == [0, 5, 7]  # row 7 (after EOS) too: tokens 0 and 1 tie for 2nd


def test_a_top_k_cut_through_a_tie_under_lowest_ids_is_no_ambiguous_top_p_split():
    """split_ties flags a top-p cut inside a tie group (the law is then undetermined); under lowest_ids a top-k cut
    through a tie is decided by the rule and must not be flagged, while a top-p split still is."""
    model = exact_model("order1-target")
    decided = SamplingConfig(temperature=1.5, top_k=2, top_p=0.99, top_k_ties="lowest_ids")
    assert (warp(model.next_logits([[5]]), decided, dtype=torch.float64) > 0).sum() == 2  # tokens 0, 3; 6 cut by top-k
    assert split_ties(model, [5], 1, decided, eos_id=7) == []
    undecided = SamplingConfig(temperature=1.0, top_p=0.8, top_k_ties="lowest_ids")  # top-p splits the tie after [.., 0]
    assert split_ties(model, [1], 2, undecided, eos_id=7)


def test_transformers_cannot_sample_another_tie_rule():
    assert hf_sampling_options(SamplingConfig(top_k=2))["top_k"] == 2
    assert hf_sampling_options(SamplingConfig(top_k_ties="lowest_ids"))["top_k"] == 0  # no top-k: the rule is moot
    with pytest.raises(NotSupportedError, match="transformers' top-k keeps every token tied"):
        hf_sampling_options(SamplingConfig(top_k=2, top_k_ties="lowest_ids"))
