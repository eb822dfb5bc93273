"""Generation past a context shift: the order-1 law at any length (``NAME+shift``), refused for order-2 models, taken
by the black-box tool; and the rounds of an engine whose drafts must fit its context, rebuilt through a shift."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.engines import rounds as R
from conformance.samples import SamplesInputError, certify_samples
from specdec_ref.exact import exact_model
from specdec_ref.warp import SamplingConfig


def test_the_shifted_order1_law_is_the_table_at_any_length_and_order2_has_none():
    plain, shifted = exact_model("order1-target"), exact_model("order1-target+shift")
    assert shifted.name == "order1-target+shift"
    long = [3] * 300
    assert np.array_equal(shifted.next_logits([long]).numpy(), plain.next_logits([[3]]).numpy())
    with pytest.raises(ValueError, match="at most 128"):
        plain.next_logits([long])
    with pytest.raises(ValueError, match="parity"):
        exact_model("order2-target+shift")


def _records(n: int, prompt_len: int, new: int, seed: int):
    from specdec_fixtures.engines import _next

    rng = np.random.default_rng(seed)
    prompt = tuple(int(t) for t in rng.integers(0, 7, prompt_len))
    out = []
    for i in range(n):
        ids = []
        for _ in range(new):
            p = _next("order1-target+shift", prompt, tuple(ids), SamplingConfig(temperature=1.0), False)
            ids.append(int(rng.choice(len(p), p=p)))
        out.append({"prompt_ids": list(prompt), "completion_ids": ids, "seed": i})
    return out


def test_the_black_box_tool_judges_completions_past_the_positions_only_under_the_shifted_law():
    records = _records(400, 120, 16, 1)
    with pytest.raises(SamplesInputError, match="exceeds the model's 128 positions"):
        certify_samples(records, model="order1-target", sampling=SamplingConfig(temperature=1.0), max_new_tokens=16)
    v = certify_samples(records, model="order1-target+shift", sampling=SamplingConfig(temperature=1.0),
                        max_new_tokens=16)
    assert v.level in ("certified", "reduced"), v.report()
    assert "--model order1-target+shift" in v.replay
    with pytest.raises(SamplesInputError, match="parity"):
        certify_samples(records, model="order2-target+shift", sampling=SamplingConfig(temperature=1.0),
                        max_new_tokens=16)


class _Always:
    """A proposer that always drafts token 0 (its rounds depend on the room the engine leaves only)."""

    def proposal(self, text, k):
        return [0] * k


def test_drafts_fit_the_context_and_a_shift_discards_half_the_cells_before_the_round():
    """llama-server's rule: at most n_ctx - cells - 2 drafts, cells the tokens before the round's input; when
    cells + 1 >= n_ctx, half the cells are discarded first. A 10-token prompt in a 16-token context, 12 new tokens,
    every draft accepted unless the completion says otherwise."""
    prompt, completion = [1] * 10, [0] * 12
    free = R.reconstruct(_Always(), prompt, completion, 3)
    assert [len(r.drafts) for r in free] == [3, 3, 3]
    capped = R.reconstruct(_Always(), prompt, completion, 3, context=(16, False))
    # cells 10: room min(3, 4) = 3, 4 tokens; cells 14: room 0 (a plain step); cells 15: -1 ...: plain steps to the end
    assert [(r.start, len(r.drafts)) for r in capped] == [(11, 3)]
    shifted = R.reconstruct(_Always(), prompt, completion, 3, context=(16, True))
    # cells 14 + 1 < 16: no shift, room 0, a plain step; cells 15: 7 discarded, 8 left, room 3; then cells 12, room 2
    assert [(r.start, len(r.drafts)) for r in shifted] == [(11, 3), (16, 3), (20, 2)]
