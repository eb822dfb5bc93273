"""Offset variants of the order-1 exact models: float32-exact logits that bfloat16 cannot represent.

Every table of :mod:`specdec_ref.exact.tables` holds multiples of 1/8 in [-8, 8], exact in bfloat16 by
construction, so a decoder that samples from bf16-rounded logits while reporting float32 probabilities
(DeepSpec issue #31's bug class) has exactly the right law on them. The variants here add a common
offset :data:`LOGIT_OFFSET` (+80) to every logit of an order-1 table:

* the law is unchanged (softmax is shift-invariant; in float64 and float32 ``(x + 80) - (max + 80)`` is
  exact, so the probabilities are bit for bit those of the base model, at temperatures that are powers of 2
  too);
* the logits lie in [72, 88], multiples of 1/8 that need up to 10 significant bits: exact in float32, but
  bfloat16 (8 bits; spacing 1/2 in [64, 128)) rounds every entry that is not a multiple of 1/2, by up to
  1/4 (:data:`BF16_LOGIT_BOUND`). Temperature T divides that error by T.

Construction (hidden 16, as order1): token ``t`` embeds as ``2 e_t + 2 e_8 + 2 e_9 + 2 e_10`` (a one-hot
of weight 2 and three constant channels of value 2: sum of squares 4 + 12 = 16, mean square exactly 1, so
every RMSNorm (weight 1, eps 0) is the identity); attention and MLP outputs are exactly 0 as in order1
(``o_proj = down_proj = 0``, the same filler q/k/v, gate/up); ``lm_head[v, t] = T[t, v] / 2`` and
``lm_head[v, 8] = LOGIT_OFFSET / 2 = 40``, so each logit is the sum of two exact products, ``T[t, v]`` and
``80``: one rounding of the exact sum in any order, none in float32. Every weight is still a dyadic number
with at most 8 significant bits (exact in bfloat16); only the logits are not. A bfloat16 forward returns
exactly :func:`bf16_table` (the table rounded to bf16, round-half-even) whatever the kernel's accumulation
order, hence the stated bounds are attained, not just bounds.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "LOGIT_OFFSET",
    "BF16_LOGIT_BOUND",
    "BF16_PROB_BOUND",
    "OFFSET_MODELS",
    "OFFSET_PAIRS",
    "bf16_table",
    "offset_order1_weights",
]

#: Common offset added to every logit of the offset variants: logits in [72, 88], bf16 spacing 1/2 there.
LOGIT_OFFSET: float = 80.0
#: Stated bfloat16 bound of the offset variants: max |bf16 logit - table logit| (half the bf16 spacing in
#: [64, 128); attained).
BF16_LOGIT_BOUND: float = 0.25
#: Stated bound on max |softmax(bf16 logits) - table law| (float64 softmax; measured 0.0648 for
#: order1-target-offset, 0.0577 for order1-draft-close-offset).
BF16_PROB_BOUND: float = 0.07

#: (name, base model, description suffix): the base model's table plus :data:`LOGIT_OFFSET`.
OFFSET_MODELS = (
    ("order1-target-offset", "order1-target", "order1-target's law, every logit + 80 (exact in float32, not in bfloat16)"),
    ("order1-draft-close-offset", "order1-draft-close", "order1-draft-close's law, every logit + 80 (exact in float32, not in bfloat16)"),
)
#: (pair, target, draft, purpose)
OFFSET_PAIRS = (
    (
        "order1-close-offset",
        "order1-target-offset",
        "order1-draft-close-offset",
        "order1-close with every logit + 80: the same law, logits that bfloat16 rounds (sampling-precision bugs)",
    ),
)

_TOKEN_WEIGHT = 2.0
_CONST_CHANNELS = (8, 9, 10)  # value 2 each; channel 8 carries the offset through lm_head
_CONST_VALUE = 2.0


def bf16_table(table: np.ndarray) -> np.ndarray:
    """``table`` (float64 logits) rounded to bfloat16 (via float32, exact there), as float64: the logits a bf16
    forward of an offset checkpoint returns, and those a decoder that rounds to bf16 samples from."""
    t = torch.from_numpy(np.array(table, dtype=np.float64))  # a copy (tables are read-only)
    return t.to(torch.float32).to(torch.bfloat16).to(torch.float64).numpy()


def offset_order1_weights(base: dict[str, np.ndarray], table: np.ndarray, offset: float) -> dict[str, np.ndarray]:
    """The offset variant of an order1 checkpoint: ``base`` is ``_order1_weights`` of the table without the offset
    (``table``, [last token, next token]); the embedding and ``lm_head`` are replaced, everything else is kept."""
    embed = np.array(base["model.embed_tokens.weight"], dtype=np.float64)
    v, hidden = embed.shape
    assert hidden == 16 and v == table.shape[0] == table.shape[1] and max(_CONST_CHANNELS) < hidden and v <= _CONST_CHANNELS[0]
    embed[:] = 0.0
    embed[np.arange(v), np.arange(v)] = _TOKEN_WEIGHT
    embed[:, list(_CONST_CHANNELS)] = _CONST_VALUE
    assert np.all((embed**2).sum(-1) == hidden)  # mean square exactly 1: RMSNorm is the identity
    head = np.zeros((v, hidden))
    head[:, :v] = table.T / _TOKEN_WEIGHT
    head[:, _CONST_CHANNELS[0]] = offset / _CONST_VALUE
    out = dict(base)
    out["model.embed_tokens.weight"] = embed
    out["lm_head.weight"] = head
    return out
