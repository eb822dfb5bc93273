"""Exactly-known target/draft models, shipped as real transformers checkpoints.

Each model's next-token law is an explicit small table (vocabulary V = 8) written in this module
(the single source of truth); :func:`build` turns every table into a ``LlamaForCausalLM`` checkpoint
(``config.json``, ``model.safetensors``, a WordLevel ``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``) under ``specdec_ref/assets/exact/<name>/``, loadable from the local folder
with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``. The law of a model
is ``softmax(next_logits(context))`` computed in float64 from the table; :meth:`ExactModel.next_logits`
never runs the checkpoint.

Two families (see ``docs/exact-models.md`` for the weight constructions and the proofs of exactness):

* **order1** (``order1-target``, ``order1-draft-close`` / ``-far`` / ``-same``): ``logits = T[last token]``,
  an 8 x 8 table. One-hot embeddings, attention and MLP outputs exactly zero (``o_proj`` and
  ``down_proj`` are zero), ``lm_head`` holds the table.
* **order2** (``order2-target``, ``order2-draft``, ``order2-draft-close``): the logits depend on the
  last two tokens *and* on the parity of the last token's position, through attention over the KV
  cache and rotary position embeddings: one head attends exactly to the previous position (a
  stale or misplaced K/V entry, or a wrong position id, changes what it copies), one head reads the
  parity of the position relative to the ``<bos>`` token at position 0, and a gated MLP with one unit
  per (previous token, last token, parity) cell writes that cell's logits. Contexts must start with
  ``<bos>`` (id 6) and contain it nowhere else; ``<bos>`` itself has logit :data:`BOS_LOGIT` (-2**16)
  everywhere, so its probability is exactly 0 in float64 and float32 and it is never generated.
* **offset variants** (``order1-target-offset``, ``order1-draft-close-offset``; pair ``order1-close-offset``;
  :mod:`specdec_ref.exact_offset`): an order1 table plus 80 on every logit, carried by constant channels
  through ``lm_head``. The same law, float32-exact logits that bfloat16 cannot represent (it rounds them by up
  to 1/4), so a decoder sampling in lower precision than it reports changes the law (the other models'
  logits are exact in bf16 and hide it).

Exactness: every weight is a dyadic number with at most 8 significant bits (exact in bfloat16), RMS
norms see a mean square of exactly 1 (``rms_norm_eps = 0``), attention scores separate the attended
key from every other one by more than 150 after scaling (so the float32 softmax is exactly one-hot,
whatever rounding RoPE introduces), and the MLP gates are exactly 32 ("on", SiLU(32) == 32 in float32)
or <= -112 ("off", SiLU == -0). So the float32 forward returns the table logits bit for bit, with or
without a KV cache; in bfloat16 the same holds (stated and tested bound: 0), except for the offset variants,
whose bf16 logits are the table rounded to bf16 (``ExactModel.bf16_logit_bound`` = 1/4, attained).

Both families are Llama: GPT-2's LayerNorm subtracts a mean that torch computes with a Welford
recurrence (rounded ``1/k`` factors), which is inexact even for inputs of constant mean and variance,
whereas RMSNorm only needs a sum of squares, exact in any order for these values. Absolute position
comes from RoPE relative to ``<bos>`` at position 0. Shapes: 1 layer, 2 heads of size 32 (the
smallest head size vLLM's CPU attention supports, so engines such as vLLM load the checkpoints; the
nonzero rotary pairs are those whose frequencies are 1, pi, pi^2, pi^3), hidden 16 (order1) / 32
(order2), which Llama allows to differ from heads * head_dim (64).

Command line::

    python -m specdec_ref.exact_models build   # (re)write every checkpoint folder, byte-deterministic
    python -m specdec_ref.exact_models check   # verify the shipped files, print a summary table
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from . import exact_offset

__all__ = [
    "ASSET_ROOT",
    "BOS_LOGIT",
    "MAX_POSITIONS",
    "BF16_LOGIT_BOUND",
    "BF16_PROB_BOUND",
    "ExactModel",
    "ExactPair",
    "EXACT_MODELS",
    "EXACT_PAIRS",
    "UnknownExactModelError",
    "exact_model",
    "exact_pair",
    "build",
    "check",
    "build_files",
    "main",
    "MIN_SCORE_GAP",
    "prev_head_scores",
]

#: Root of the shipped checkpoints (package data).
ASSET_ROOT: Path = Path(__file__).resolve().parent / "assets" / "exact"
#: ``max_position_embeddings`` of every checkpoint; contexts may hold at most this many tokens.
MAX_POSITIONS: int = 128
#: Table logit of ``<bos>`` in the order2 family: exp(BOS_LOGIT - max) underflows to exactly 0 in
#: float64 and float32 for any temperature <= ~80, so ``<bos>`` is never generated.
BOS_LOGIT: float = -(2.0**16)
#: Stated bfloat16 bound, max |logit error| of the bf16 checkpoint against the table (tested; the
#: construction keeps every intermediate value exact in bf16, so the measured error is 0). The offset
#: variants state their own (``ExactModel.bf16_logit_bound``, ``specdec_ref.exact_offset``).
BF16_LOGIT_BOUND: float = 0.0
#: Stated bfloat16 bound on max |probability error| (softmax of the bf16 logits in float64).
BF16_PROB_BOUND: float = 0.0

_TOKENIZER_UNK = "<unk>"  # not in any vocabulary: unknown words are an encoding error

# =========================================================================== tables
#
# All table entries are in eighths (integers): logit = entry / 8, within [-8, 8].

# --------------------------------------------------------------------------- order1
# Vocabulary: "t0".."t6" (ids 0..6), "<eos>" (id 7). Row = last token, column = next token.
#
# Design (asserted by tests/test_exact_models.py):
# * the maximum of every row is unique (greedy is unambiguous);
# * exact ties just below the top: row 0: 2nd = 3rd = 4th (tokens 1, 2, 3 at 1.0: top_k = 2 and 3 keep
#   four tokens), row 2: 3rd = 4th = 5th (tokens 2, 4, 5 at 0.5), row 4: 4th = 5th = 6th (tokens 1, 2, 6
#   at 0.75), row 5: 2nd = 3rd (tokens 3, 6 at 1.5), row 6: 3rd = 4th (tokens 1, 5 at 0.5), row 7: 2nd =
#   3rd (tokens 0, 1 at 1.0);
# * EOS has probability 0.1 .. 0.3 in rows 1, 2, 4 and 7.
_ORDER1_TARGET = (
    (24, 8, 8, 8, -8, -16, -4, 4),
    (4, -2, 12, 0, 6, -8, 2, 10),
    (-12, 18, 4, -6, 4, 4, -16, 8),
    (10, 0, -8, 20, 0, 14, -4, -24),
    (-4, 6, 6, 0, 8, 16, 6, 12),
    (32, -8, 2, 12, -20, 0, 12, 7),
    (0, 4, -10, 2, 22, 4, 8, 1),
    (8, 8, 4, -4, 0, 2, -8, 11),
)
# target + small perturbation: mean token-wise acceptance ~0.90
_ORDER1_CLOSE = (
    (25, 6, 7, 1, -3, -13, -5, 6),
    (5, -4, 15, -1, 5, -10, 3, 10),
    (-10, 16, 4, -9, 7, 5, -15, 9),
    (7, 2, -2, 15, -5, 9, -1, -24),
    (-1, 8, 7, 1, 7, 19, 3, 11),
    (33, -3, 0, 9, -22, 3, 11, 11),
    (-6, 7, -7, -2, 22, 8, 8, 4),
    (15, 9, 3, -6, 2, 1, -9, 11),
)
# target + large perturbation: mean token-wise acceptance ~0.60 (argmax differs in rows 0, 1, 3, 6, 7)
_ORDER1_FAR = (
    (18, 6, 23, 14, -22, -16, -9, 5),
    (-10, 0, 14, 14, 9, -4, -11, 30),
    (-29, 28, 1, -14, -2, -2, -13, 7),
    (23, -16, -8, 12, 7, -5, -7, -22),
    (-17, 15, 8, 9, 16, 7, -1, 10),
    (39, -1, -4, 7, -27, -5, 10, 6),
    (18, 0, -13, 6, 14, 1, 8, 8),
    (-4, 20, 1, -3, 7, 8, 1, 13),
)

ORDER1_VOCAB = 8
ORDER1_EOS = 7

# --------------------------------------------------------------------------- order2
# Vocabulary: "t0".."t5" (ids 0..5), "<bos>" (id 6), "<eos>" (id 7). A context is
# [<bos>, x_1, .., x_m]; the next-token logits after it are T2[a, b, c] with b = x_m (the last token,
# at position m), a = x_{m-1} (the token before it; <bos> when m == 1, and a = b = <bos> when m == 0)
# and c = m % 2. Reachable cells: (<bos>, <bos>, 0), (<bos>, b, 1) and (a, b, c) for a, b real tokens.

ORDER2_VOCAB = 8
ORDER2_BOS = 6
ORDER2_EOS = 7
_ORDER2_REAL = (0, 1, 2, 3, 4, 5, 7)
_ORDER2_EOS_BASE = (-6, 2, -2, 4, -8, 2, -2, -10)  # eighths added to the EOS logit, by last token b


def _order2_cells() -> tuple[tuple[int, int, int], ...]:
    """Every reachable (a, b, c) cell, in a fixed order (the order of the MLP units)."""
    bos = ORDER2_BOS
    cells = [(bos, bos, 0)] + [(bos, b, 1) for b in _ORDER2_REAL]
    cells += [(a, b, c) for a in _ORDER2_REAL for b in _ORDER2_REAL for c in (0, 1)]
    return tuple(cells)


_MASK64 = (1 << 64) - 1


def _splitmix64(seed: int):
    """splitmix64: a platform-independent integer stream (pure Python ints)."""
    state = seed & _MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        yield z ^ (z >> 31)


def _bell_ints(seed: int, shape: tuple[int, ...], spread: int) -> np.ndarray:
    """Bell-shaped integers: each the sum of 4 uniforms on [-spread, spread] (sd ~ 1.15 * spread)."""
    stream = _splitmix64(seed)
    n = int(np.prod(shape))
    values = [sum(int(next(stream) % (2 * spread + 1)) - spread for _ in range(4)) for _ in range(n)]
    return np.array(values, dtype=np.int64).reshape(shape)


def _unique_max_(row: np.ndarray) -> None:
    """Raise the first-index maximum of ``row`` (eighths, real tokens only) by 1 if it is tied."""
    order = sorted(_ORDER2_REAL, key=lambda v: (-row[v], v))
    if row[order[0]] == row[order[1]]:
        row[order[0]] += 1


def _shape_order2_rows(table: np.ndarray) -> np.ndarray:
    """Add exact ties below the top (cells k % 6 == 3: 2nd = 3rd = 4th; k % 6 == 5: 3rd = 4th) and make
    every row's maximum unique (greedy unambiguous). ``table``: int eighths [a, b, c, v]."""
    table = table.copy()
    for k, (a, b, c) in enumerate(_order2_cells()):
        row = table[a, b, c]
        order = sorted(_ORDER2_REAL, key=lambda v: (-row[v], v))
        if k % 6 == 3:
            row[order[2]] = row[order[1]]
            row[order[3]] = row[order[1]]
        elif k % 6 == 5:
            row[order[3]] = row[order[2]]
        _unique_max_(row)
    return table


def _order2_target_eighths() -> np.ndarray:
    """T2 in eighths, int64 [a, b, c, v] (v = <bos> column unused: it is BOS_LOGIT)."""
    v = ORDER2_VOCAB
    base = _bell_ints(1, (v, v), 9)  # order-1 part: by last token b
    inter = _bell_ints(2, (v, v, v), 5)  # by (a, b)
    parity = _bell_ints(3, (v, v), 5)  # by (b), sign flips with the parity c
    table = base[None, :, None, :] + inter[:, :, None, :]
    table = table + np.stack([-parity, parity], axis=1)[None, :, :, :]
    table[..., ORDER2_EOS] += np.asarray(_ORDER2_EOS_BASE)[None, :, None]
    return _shape_order2_rows(np.clip(table, -64, 64))


def _order2_order1_draft_eighths(target: np.ndarray) -> np.ndarray:
    """An order-1 draft for T2: per last token b, the target logits averaged over its reachable cells
    (rounded to eighths); it ignores the previous token and the position."""
    out = np.zeros_like(target)
    cells = _order2_cells()
    for b in range(ORDER2_VOCAB):
        rows = [target[a, bb, c] for a, bb, c in cells if bb == b]
        if rows:
            mean = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
            row = np.floor(mean + 0.5).astype(np.int64)
            _unique_max_(row)
            out[:, b, :, :] = row[None, None, :]
    return out


def _order2_close_draft_eighths(target: np.ndarray) -> np.ndarray:
    """An order-2 draft close to T2: target plus bell-shaped noise (spread 2 eighths)."""
    table = np.clip(target + _bell_ints(7, target.shape, 2), -64, 64)
    for a, b, c in _order2_cells():
        _unique_max_(table[a, b, c])
    return table


# =========================================================================== models


def _as_context_list(contexts) -> list[list[int]]:
    if isinstance(contexts, torch.Tensor):
        if contexts.dim() == 1:
            contexts = contexts.unsqueeze(0)
        if contexts.dim() != 2 or contexts.dtype.is_floating_point or contexts.dtype == torch.bool:
            raise ValueError(f"contexts must be a LongTensor [B, n] or a list of id sequences, got {contexts.dtype} {tuple(contexts.shape)}")
        return [list(map(int, row)) for row in contexts.tolist()]
    out = []
    for ctx in contexts:
        if isinstance(ctx, torch.Tensor):
            ctx = ctx.reshape(-1).tolist()
        if isinstance(ctx, (str, bytes)):
            raise ValueError("a context must be a sequence of token ids, not a string")
        seq = []
        for t in ctx:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(f"token ids must be ints, got {t!r}")
            seq.append(int(t))
        out.append(seq)
    return out


@dataclass(frozen=True)
class ExactModel:
    """One exactly-known model: its table (the law) and its checkpoint folder.

    ``next_logits(contexts)`` reads the table (float64, exact dyadic values); ``load(dtype)`` returns the
    transformers model from ``path`` (eager attention, eval mode, no gradients, cached per dtype);
    ``tokenizer()`` the fast tokenizer from ``path``. ``bos_id`` is the start token a context must begin
    with (order2) or None (order1); ``family`` is ``"order1"`` or ``"order2"``; ``arch`` the transformers
    architecture.
    """

    name: str
    vocab: int
    eos_id: int
    description: str
    path: Path
    min_context: int
    max_positions: int
    family: str
    bos_id: int | None = None
    arch: str = "LlamaForCausalLM"
    table: np.ndarray = field(default=None, repr=False, compare=False)  # float64 logits, by cell
    #: common offset of every logit (0; LOGIT_OFFSET for the offset variants of ``specdec_ref.exact_offset``)
    logit_offset: float = 0.0
    #: stated bf16 bounds of this checkpoint (0 unless its logits are not exact in bf16: the offset variants)
    bf16_logit_bound: float = BF16_LOGIT_BOUND
    bf16_prob_bound: float = BF16_PROB_BOUND
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ law

    def _validate(self, ctx: list[int]) -> None:
        if len(ctx) < self.min_context:
            raise ValueError(f"{self.name}: a context needs at least {self.min_context} token(s), got {len(ctx)}")
        if len(ctx) > self.max_positions:
            raise ValueError(f"{self.name}: a context holds at most {self.max_positions} tokens, got {len(ctx)}")
        if min(ctx) < 0 or max(ctx) >= self.vocab:
            raise ValueError(f"{self.name}: token ids must be in [0, {self.vocab}), got {ctx}")
        if self.bos_id is not None:
            if ctx[0] != self.bos_id:
                raise ValueError(f"{self.name}: a context must start with <bos> (id {self.bos_id}), got {ctx[:4]}...")
            if self.bos_id in ctx[1:]:
                raise ValueError(f"{self.name}: <bos> (id {self.bos_id}) may only appear at position 0, got {ctx}")

    def cell(self, context: Sequence[int]) -> tuple[int, ...]:
        """The table cell a context selects: ``(last,)`` for order1, ``(a, b, c)`` for order2."""
        (ctx,) = _as_context_list([context])
        self._validate(ctx)
        if self.family == "order1":
            return (ctx[-1],)
        m = len(ctx) - 1
        return (ctx[m - 1] if m >= 1 else ctx[0], ctx[m], m % 2)

    def next_logits(self, contexts) -> torch.Tensor:
        """float64 table logits ``[len(contexts), V]`` after each context (prompt + generated ids)."""
        rows = [self.table[self.cell(ctx)] for ctx in _as_context_list(contexts)]
        if not rows:
            return torch.empty((0, self.vocab), dtype=torch.float64)
        return torch.from_numpy(np.stack(rows).astype(np.float64))

    def next_probs(self, contexts) -> torch.Tensor:
        """float64 softmax of :meth:`next_logits` (the law)."""
        return torch.softmax(self.next_logits(contexts), dim=-1)

    def cells(self) -> tuple[tuple[int, ...], ...]:
        """Every reachable cell (the table rows the law can use)."""
        if self.family == "order1":
            return tuple((t,) for t in range(self.vocab))
        return _order2_cells()

    def row_contexts(self) -> list[list[int]]:
        """One shortest context per reachable cell, in :meth:`cells` order."""
        if self.family == "order1":
            return [[t] for t in range(self.vocab)]
        bos, filler = self.bos_id, _ORDER2_REAL[0]
        out = []
        for a, b, c in _order2_cells():
            if b == bos:
                out.append([bos])
            elif a == bos:
                out.append([bos, b])
            else:
                out.append([bos, a, b] if c == 0 else [bos, filler, a, b])
        return out

    # ------------------------------------------------------------------ checkpoint

    def load(self, dtype: torch.dtype = torch.float32):
        """``AutoModelForCausalLM.from_pretrained(path)`` in ``dtype`` (eager attention, eval, no grad);
        the same object for the same dtype."""
        hit = self._cache.get(dtype)
        if hit is None:
            from transformers import AutoModelForCausalLM

            hit = AutoModelForCausalLM.from_pretrained(str(self.path), dtype=dtype, attn_implementation="eager")
            hit.eval()
            hit.requires_grad_(False)
            self._cache[dtype] = hit
        return hit

    def tokenizer(self):
        """``AutoTokenizer.from_pretrained(path)`` (cached)."""
        hit = self._cache.get("tokenizer")
        if hit is None:
            from transformers import AutoTokenizer

            hit = AutoTokenizer.from_pretrained(str(self.path))
            self._cache["tokenizer"] = hit
        return hit

    def token_names(self) -> list[str]:
        return _token_names(self.family)


@dataclass(frozen=True)
class ExactPair:
    """A target and a draft sharing vocabulary and tokenizer."""

    name: str
    target: ExactModel
    draft: ExactModel
    purpose: str

    def acceptance(self, contexts) -> np.ndarray:
        """Per-context token-wise acceptance ``sum_x min(p(x), q(x))`` (float64, untempered)."""
        p = self.target.next_probs(contexts)
        q = self.draft.next_probs(contexts)
        return torch.minimum(p, q).sum(-1).numpy()

    def mean_acceptance(self) -> float:
        """:meth:`acceptance` averaged uniformly over the target's reachable cells (its table rows)."""
        return float(np.mean(self.acceptance(self.target.row_contexts())))


class UnknownExactModelError(ValueError, KeyError):
    """An unknown model or pair name (a ValueError that is also a KeyError)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _order1_table(eighths) -> np.ndarray:
    return np.asarray(eighths, dtype=np.float64) / 8.0


def _order2_table(eighths: np.ndarray) -> np.ndarray:
    table = eighths.astype(np.float64) / 8.0
    table[..., ORDER2_BOS] = BOS_LOGIT
    return table


def _make_models() -> dict[str, ExactModel]:
    o1 = dict(
        vocab=ORDER1_VOCAB,
        eos_id=ORDER1_EOS,
        min_context=1,
        max_positions=MAX_POSITIONS,
        family="order1",
    )
    d1 = "order-1 Markov: logits = T[last token] (8 x 8 table); no dependence on position or earlier tokens"
    t2 = _order2_target_eighths()
    o2 = dict(
        vocab=ORDER2_VOCAB,
        eos_id=ORDER2_EOS,
        min_context=1,
        max_positions=MAX_POSITIONS,
        family="order2",
        bos_id=ORDER2_BOS,
    )
    specs = [
        ("order1-target", _order1_table(_ORDER1_TARGET), o1, d1 + " (the target)"),
        ("order1-draft-close", _order1_table(_ORDER1_CLOSE), o1, d1 + " (target + small perturbation)"),
        ("order1-draft-far", _order1_table(_ORDER1_FAR), o1, d1 + " (target + large perturbation)"),
        ("order1-draft-same", _order1_table(_ORDER1_TARGET), o1, d1 + " (an identical copy of the target)"),
        (
            "order2-target",
            _order2_table(t2),
            o2,
            "order-2 with position: logits = T2[previous token, last token, parity of the last token's "
            "position], the context starting with <bos> at position 0",
        ),
        (
            "order2-draft",
            _order2_table(_order2_order1_draft_eighths(t2)),
            o2,
            "order-1 approximation of order2-target in the same architecture: logits depend on the last "
            "token only (the target's rows averaged over previous token and parity)",
        ),
        (
            "order2-draft-close",
            _order2_table(_order2_close_draft_eighths(t2)),
            o2,
            "order-2 with position, close to order2-target (target + small perturbation)",
        ),
    ]
    models = {}
    for name, table, kw, desc in specs:
        table.setflags(write=False)  # the law: read-only
        models[name] = ExactModel(name=name, description=desc, path=ASSET_ROOT / name, table=table, **kw)
    for name, base, desc in exact_offset.OFFSET_MODELS:  # the same laws, logits + 80 (not exact in bf16)
        table = models[base].table + exact_offset.LOGIT_OFFSET
        table.setflags(write=False)
        models[name] = ExactModel(
            name=name, description=d1 + f" ({desc})", path=ASSET_ROOT / name, table=table, **o1,
            logit_offset=exact_offset.LOGIT_OFFSET, bf16_logit_bound=exact_offset.BF16_LOGIT_BOUND,
            bf16_prob_bound=exact_offset.BF16_PROB_BOUND,
        )
    return models


EXACT_MODELS: dict[str, ExactModel] = _make_models()


def _make_pairs() -> dict[str, ExactPair]:
    m = EXACT_MODELS
    specs = [
        ("order1-close", "order1-target", "order1-draft-close", "high acceptance (~0.90 token-wise)"),
        ("order1-far", "order1-target", "order1-draft-far", "low acceptance (~0.60 token-wise); drafts often disagree on the argmax"),
        ("order1-same", "order1-target", "order1-draft-same", "identical draft: every draft token is accepted (acceptance 1)"),
        ("order2-order1", "order2-target", "order2-draft", "order-1 draft for an order-2, position-dependent target (~0.70)"),
        ("order2-close", "order2-target", "order2-draft-close", "order-2 draft close to the target (~0.90)"),
    ] + list(exact_offset.OFFSET_PAIRS)
    return {name: ExactPair(name, m[t], m[d], purpose) for name, t, d, purpose in specs}


EXACT_PAIRS: dict[str, ExactPair] = _make_pairs()


def exact_model(name: str) -> ExactModel:
    """The model called ``name`` (``UnknownExactModelError``, a ValueError, listing the known names)."""
    try:
        return EXACT_MODELS[name]
    except (KeyError, TypeError):
        raise UnknownExactModelError(f"unknown exact model {name!r}; known: {', '.join(EXACT_MODELS)}") from None


def exact_pair(name: str) -> ExactPair:
    """The pair called ``name`` (``UnknownExactModelError``, a ValueError, listing the known names)."""
    try:
        return EXACT_PAIRS[name]
    except (KeyError, TypeError):
        raise UnknownExactModelError(f"unknown exact pair {name!r}; known: {', '.join(EXACT_PAIRS)}") from None


# =========================================================================== weights
#
# Every weight below is a dyadic number with <= 8 significant bits (asserted: exact in bfloat16).

# Head size 32: the smallest head size that vLLM's CPU attention accepts (32, 64, 80, ... 512), so
# real engines can load the checkpoints; 2 heads (previous token and parity in order2).
_HEAD_DIM = 32
_NUM_HEADS = 2
# order2 rotary base: HF Llama's rotate_half pairs dims (i, i + 16), inv_freq_i = base ** (-2i / 32)
# = pi ** (i / 4), so pairs 0, 4, 8, 12 turn by 1, pi, pi^2, pi^3 per position (bitwise the same
# frequencies as head size 8 with the same base): pair 4 is the parity head's, the four together make
# a peaked kernel for the previous-token head; every other pair is zero in q (and k).
_PREV_HEAD_PAIRS = (0, 4, 8, 12)
_PARITY_PAIR = 4
_ORDER2_ROPE_THETA = math.pi**-4
_ORDER1_ROPE_THETA = 10000.0


def _bf16_exact(x: np.ndarray) -> bool:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return torch.equal(t.to(torch.bfloat16).to(torch.float32), t)


def _round_bits(x: float, bits: int = 8) -> float:
    """``x`` rounded to ``bits`` significant bits (a dyadic number exact in bfloat16 for bits <= 8);
    0 for ``|x| < 2**-10`` (e.g. sin(pi) in float64)."""
    if abs(x) < 2.0**-10:
        return 0.0
    m, e = math.frexp(x)
    return math.ldexp(round(m * (1 << bits)) / (1 << bits), e)


def _dyadic_noise(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic weights in {-1, -1/2, -1/4, 0, 1/4, 1/2, 1} (for parts that do not affect the law)."""
    stream = _splitmix64(seed)
    levels = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)
    n = int(np.prod(shape))
    return np.array([levels[next(stream) % 7] for _ in range(n)], dtype=np.float64).reshape(shape)


def _order1_weights(table: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """order1: hidden 16. Token t embeds as 4 * e_t (mean square exactly 1); attention and MLP
    outputs are exactly 0 (o_proj, down_proj = 0); lm_head[v, t] = T[t, v] / 4."""
    v, hidden, inter = ORDER1_VOCAB, 16, 32
    qkv = _NUM_HEADS * _HEAD_DIM
    embed = np.zeros((v, hidden))
    embed[np.arange(v), np.arange(v)] = 4.0
    head = np.zeros((v, hidden))
    head[:, :v] = table.T / 4.0
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(hidden),
        "model.layers.0.self_attn.q_proj.weight": _dyadic_noise(seed + 1, (qkv, hidden)),
        "model.layers.0.self_attn.k_proj.weight": _dyadic_noise(seed + 2, (qkv, hidden)),
        "model.layers.0.self_attn.v_proj.weight": _dyadic_noise(seed + 3, (qkv, hidden)),
        "model.layers.0.self_attn.o_proj.weight": np.zeros((hidden, qkv)),
        "model.layers.0.post_attention_layernorm.weight": np.ones(hidden),
        "model.layers.0.mlp.gate_proj.weight": _dyadic_noise(seed + 4, (inter, hidden)),
        "model.layers.0.mlp.up_proj.weight": _dyadic_noise(seed + 5, (inter, hidden)),
        "model.layers.0.mlp.down_proj.weight": np.zeros((hidden, inter)),
        "model.norm.weight": np.ones(hidden),
        "lm_head.weight": head,
    }


# order2 residual stream (hidden 32), values before the layer (h0), after attention (h1), after the
# MLP (h2); the sum of squares is 32 at each stage, so every RMS norm divides by exactly 1.
_T0 = 0  # 0..7   one-hot of the last token b (1)
_A0 = 8  # 8..15  one-hot of the previous token a (0 in h0, 1 from the previous-token head)
_P = 16  # parity: -1 in h0, the parity head adds 2 at even positions -> +1 even / -1 odd
_C = 17  # constant 2 (source of the queries, the MLP biases and up-projection, the <bos> logit)
_S1 = 18  # slack 1 -> 0 after attention (pays for the one-hot of a)
_S2 = 19  # slack 5 -> 4 after the MLP (pays for logits + padding, whose squares sum to 9)
_L0 = 20  # 20..27 logits / 8 of the cell (column of <bos> unused)
_Q0 = 28  # 28..31 padding: 9 - sum(logits / 8)^2 as four squares (Lagrange)
_ORDER2_HIDDEN = 32
_GATE_ON = 32.0  # gate pre-activation of the unit of the current cell; every other unit is <= -112
_GATE_UNIT = 144.0
_PREV_HEAD_ALPHA = 16.0  # query of the previous-token head: (16, 0) on every rotary pair
# relative weight of the four rotary pairs in the previous-token kernel (a small linear program,
# max over weights of the smallest gap between delta = 1 and every other delta in [0, 127])
_PREV_HEAD_WEIGHTS = (0.16736578, 0.09514902, 0.20988754, 0.52759766)
_PREV_HEAD_PEAK = 1000.0  # scaled score at the previous position
_PARITY_Q = 32.0
_PARITY_K = 128.0  # scaled score 32 * 128 / sqrt(32) = 724 (64 at head size 8: the same score)
#: Smallest scaled-score gap between the attended key and any other key (asserted at build time,
#: float64 with exact angles; exp(-150) underflows to exactly 0 in float32 and bfloat16).
MIN_SCORE_GAP = 150.0


def _four_squares(n: int) -> tuple[int, int, int, int]:
    """Integers (a, b, c, d), a >= b >= c >= d >= 0, with a^2 + b^2 + c^2 + d^2 == n (largest first)."""
    a = math.isqrt(n)
    while a >= 0:
        r1 = n - a * a
        b = min(a, math.isqrt(r1))
        while b >= 0:
            r2 = r1 - b * b
            c = min(b, math.isqrt(r2))
            while c >= 0:
                r3 = r2 - c * c
                d = math.isqrt(r3)
                if d * d == r3 and d <= c:
                    return a, b, c, d
                c -= 1
            b -= 1
        a -= 1
    raise AssertionError(f"no four-square decomposition of {n}")  # pragma: no cover - Lagrange


def _rope_angles(theta: float) -> np.ndarray:
    """Per-position angle of the previous-token head's pairs :data:`_PREV_HEAD_PAIRS`."""
    return np.array([theta ** (-2.0 * i / _HEAD_DIM) for i in _PREV_HEAD_PAIRS])


def _prev_head_qk() -> tuple[np.ndarray, np.ndarray]:
    """Pre-rotary query / key of the previous-token head, on rotary pairs (i, i + 16) for i in
    :data:`_PREV_HEAD_PAIRS`, zero elsewhere (the key scales with sqrt(head_dim): the same scores)."""
    angles = _rope_angles(_ORDER2_ROPE_THETA)
    scale, half = math.sqrt(_HEAD_DIM), _HEAD_DIM // 2
    q = np.zeros(_HEAD_DIM)
    k = np.zeros(_HEAD_DIM)
    for i, w, ang in zip(_PREV_HEAD_PAIRS, _PREV_HEAD_WEIGHTS, angles):
        beta = w * _PREV_HEAD_PEAK * scale / _PREV_HEAD_ALPHA
        q[i] = _PREV_HEAD_ALPHA
        # key rotated by +angle: score(m, j) ~ cos(angle * (1 + j - m)), peaked at j = m - 1
        k[i] = _round_bits(beta * math.cos(ang) / 2.0) * 2.0
        k[i + half] = _round_bits(beta * math.sin(ang) / 2.0) * 2.0
    return q, k


def prev_head_scores(max_positions: int = MAX_POSITIONS) -> np.ndarray:
    """float64 scaled scores of the previous-token head by ``delta = m - j`` in ``[0, max_positions)``,
    with exact rotation angles (what the checkpoint computes up to RoPE rounding)."""
    q, k = _prev_head_qk()
    angles = _rope_angles(_ORDER2_ROPE_THETA)
    out = np.zeros(max_positions)
    for delta in range(max_positions):
        s = 0.0
        for i, ang in zip(_PREV_HEAD_PAIRS, angles):
            phi = -delta * ang  # rotation of the key relative to the query: (j - m) * angle
            # q pair (q_i, 0) . R(phi) (k_i, k_{i+16})
            s += q[i] * (k[i] * math.cos(phi) - k[i + _HEAD_DIM // 2] * math.sin(phi))
        out[delta] = s / math.sqrt(_HEAD_DIM)
    return out


def _order2_weights(table: np.ndarray) -> dict[str, np.ndarray]:
    """order2: hidden 32, two heads (previous token, parity), one MLP unit per reachable cell."""
    v, hidden, d = ORDER2_VOCAB, _ORDER2_HIDDEN, _HEAD_DIM
    cells = _order2_cells()
    qkv = _NUM_HEADS * d

    embed = np.zeros((v, hidden))
    embed[np.arange(v), _T0 + np.arange(v)] = 1.0
    embed[:, _P] = -1.0
    embed[:, _C] = 2.0
    embed[:, _S1] = 1.0
    embed[:, _S2] = 5.0

    q_proj = np.zeros((qkv, hidden))
    k_proj = np.zeros((qkv, hidden))
    v_proj = np.zeros((qkv, hidden))
    o_proj = np.zeros((hidden, qkv))
    # head 0: previous token. q, k constant (read from the constant channel, value 2); v = one-hot of
    # the token; o_proj writes the one-hot into the a channels and takes 1 from slack S1.
    q0, k0 = _prev_head_qk()
    q_proj[0:d, _C] = q0 / 2.0
    k_proj[0:d, _C] = k0 / 2.0
    for t in range(v):
        v_proj[t, _T0 + t] = 1.0
        o_proj[_A0 + t, t] = 1.0
        o_proj[_S1, t] = -1.0
    # head 1: parity. q = (PARITY_Q, 0) on rotary pair 4 (angle pi per position); only <bos> has a
    # key, (PARITY_K, 0): the score to <bos> at position 0 is +-PARITY_Q * PARITY_K / sqrt(32) by the
    # parity of the query position, every other key scores 0. v = 1 on <bos> only, so the head
    # outputs 1 at even positions and exactly 0 at odd ones; o_proj adds twice that to P.
    q_proj[d + _PARITY_PAIR, _C] = _PARITY_Q / 2.0
    k_proj[d + _PARITY_PAIR, _T0 + ORDER2_BOS] = _PARITY_K
    v_proj[d + 0, _T0 + ORDER2_BOS] = 1.0
    o_proj[_P, d + 0] = 2.0
    # token-dependent filler in the dims of head 1 that nothing reads (its query is exactly 0 outside
    # rotary pair 4 and o_proj ignores its value dims 1..31), so the cached K and V of every position
    # depend on the token there, as in a real model, without any effect on the output
    free_k = [i for i in range(d) if i not in (_PARITY_PAIR, _PARITY_PAIR + d // 2)]
    k_proj[[d + i for i in free_k], _T0 : _T0 + v] = _dyadic_noise(11, (len(free_k), v))
    v_proj[d + 1 : 2 * d, _T0 : _T0 + v] = _dyadic_noise(12, (d - 1, v))

    # MLP: unit n for cell (a, b, c): gate = 144 * (x_a + x_b + s_c * P) - 400 is 32 when the three
    # match and <= -112 otherwise; up = x_C / 2 = 1; down column = (cell's residual update) / 32.
    inter = len(cells)
    gate = np.zeros((inter, hidden))
    up = np.zeros((inter, hidden))
    down = np.zeros((hidden, inter))
    for n, (a, b, c) in enumerate(cells):
        gate[n, _A0 + a] = _GATE_UNIT
        gate[n, _T0 + b] = _GATE_UNIT
        gate[n, _P] = _GATE_UNIT if c == 0 else -_GATE_UNIT
        gate[n, _C] = (_GATE_ON - 3 * _GATE_UNIT) / 2.0
        up[n, _C] = 0.5
        logits = table[a, b, c]
        upd = np.zeros(hidden)
        sq = 0  # sum of squares of logits / 8, in units of 1/64^2
        for tok in range(v):
            if tok == ORDER2_BOS:
                continue
            e = int(round(logits[tok] * 8))  # eighths
            assert e == logits[tok] * 8 and -64 <= e <= 64
            upd[_L0 + tok] = e / 64.0
            sq += e * e
        pad = _four_squares(9 * 64 * 64 - sq)
        for i, p in enumerate(pad):
            upd[_Q0 + i] = p / 64.0
        upd[_S2] = -1.0
        down[:, n] = upd / _GATE_ON

    head = np.zeros((v, hidden))
    for tok in range(v):
        if tok == ORDER2_BOS:
            head[tok, _C] = BOS_LOGIT / 2.0
        else:
            head[tok, _L0 + tok] = 8.0
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.input_layernorm.weight": np.ones(hidden),
        "model.layers.0.self_attn.q_proj.weight": q_proj,
        "model.layers.0.self_attn.k_proj.weight": k_proj,
        "model.layers.0.self_attn.v_proj.weight": v_proj,
        "model.layers.0.self_attn.o_proj.weight": o_proj,
        "model.layers.0.post_attention_layernorm.weight": np.ones(hidden),
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.mlp.up_proj.weight": up,
        "model.layers.0.mlp.down_proj.weight": down,
        "model.norm.weight": np.ones(hidden),
        "lm_head.weight": head,
    }


def _check_prev_head_margin() -> float:
    scores = prev_head_scores()
    others = np.delete(scores, 1)
    gap = float(scores[1] - others.max())
    assert gap >= MIN_SCORE_GAP, f"previous-token head margin {gap} < {MIN_SCORE_GAP}"
    parity = _PARITY_Q * _PARITY_K / math.sqrt(_HEAD_DIM)
    assert parity >= MIN_SCORE_GAP
    return gap


# =========================================================================== files


def _token_names(family: str) -> list[str]:
    if family == "order1":
        return [f"t{i}" for i in range(ORDER1_VOCAB - 1)] + ["<eos>"]
    return [f"t{i}" for i in range(6)] + ["<bos>", "<eos>"]


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _config(model: ExactModel) -> dict:
    o2 = model.family == "order2"
    hidden = _ORDER2_HIDDEN if o2 else 16
    inter = len(_order2_cells()) if o2 else 32
    theta = _ORDER2_ROPE_THETA if o2 else _ORDER1_ROPE_THETA
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": model.vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": _NUM_HEADS,
        "num_key_value_heads": _NUM_HEADS,
        "head_dim": _HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": model.max_positions,
        "rms_norm_eps": 0.0,
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": model.bos_id,
        "eos_token_id": model.eos_id,
        "pad_token_id": model.eos_id,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def _tokenizer_json(model: ExactModel) -> dict:
    names = _token_names(model.family)
    specials = [i for i, n in enumerate(names) if n.startswith("<")]
    post = None
    if model.bos_id is not None:
        bos = names[model.bos_id]
        post = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [model.bos_id], "tokens": [bos]}},
        }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": names[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": post,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {n: i for i, n in enumerate(names)}, "unk_token": _TOKENIZER_UNK},
    }


def _tokenizer_config(model: ExactModel) -> dict:
    names = _token_names(model.family)
    out = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": names[model.eos_id],
        "pad_token": names[model.eos_id],
        "model_max_length": model.max_positions,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if model.bos_id is not None:
        out["bos_token"] = names[model.bos_id]
    return out


def _generation_config(model: ExactModel) -> dict:
    out = {"eos_token_id": model.eos_id, "pad_token_id": model.eos_id}
    if model.bos_id is not None:
        out["bos_token_id"] = model.bos_id
    return out


def _safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file (float32, little endian), written by hand so the bytes depend on nothing
    but the tensors: header keys sorted, data in key order, header padded with spaces to 8 bytes."""
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name], dtype="<f4")
        data = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("ascii")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)


def _weights(model: ExactModel) -> dict[str, np.ndarray]:
    if model.family == "order1" and model.logit_offset:
        table = model.table - model.logit_offset  # exact: the base table
        weights = exact_offset.offset_order1_weights(_order1_weights(table, seed=1000), table, model.logit_offset)
    elif model.family == "order1":
        weights = _order1_weights(model.table, seed=1000)
    else:
        _check_prev_head_margin()
        weights = _order2_weights(model.table)
    for name, w in weights.items():
        assert np.all(np.isfinite(w)), name
        assert np.array_equal(w.astype(np.float32).astype(np.float64), w), f"{model.name}: {name} not exact in float32"
        assert _bf16_exact(w), f"{model.name}: {name} not exact in bfloat16"
    return weights


def build_files(model: ExactModel) -> dict[str, bytes]:
    """Every file of ``model``'s checkpoint folder, as bytes (deterministic)."""
    meta = {"format": "pt", "specdec_ref": "exact_models", "model": model.name}
    return {
        "config.json": _json_bytes(_config(model)),
        "generation_config.json": _json_bytes(_generation_config(model)),
        "model.safetensors": _safetensors_bytes(_weights(model), meta),
        "tokenizer.json": _json_bytes(_tokenizer_json(model)),
        "tokenizer_config.json": _json_bytes(_tokenizer_config(model)),
    }


def build(root: str | Path | None = None, names: Iterable[str] | None = None) -> dict[str, Path]:
    """(Re)write the checkpoint folder of every model (or of ``names``) under ``root``."""
    root = Path(root) if root is not None else ASSET_ROOT
    out = {}
    for name in names if names is not None else EXACT_MODELS:
        model = exact_model(name)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for fname, data in build_files(model).items():
            (folder / fname).write_bytes(data)
        out[name] = folder
    return out


def _folder_kb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1024.0


def check(root: str | Path | None = None, *, verbose: bool = True) -> list[dict]:
    """Verify that every shipped folder holds exactly what :func:`build` writes; return one row per
    model (name, arch, V, size in KB, acceptance of its pair against the target, problems) and print
    them as a table when ``verbose``. Raises ``AssertionError`` listing every mismatch."""
    root = Path(root) if root is not None else ASSET_ROOT
    draft_acc = {p.draft.name: (p.name, p.mean_acceptance()) for p in EXACT_PAIRS.values()}
    rows, problems = [], []
    for name, model in EXACT_MODELS.items():
        folder = root / name
        expected = build_files(model)
        bad = []
        for fname, data in expected.items():
            path = folder / fname
            if not path.is_file():
                bad.append(f"{fname} missing")
            elif path.read_bytes() != data:
                bad.append(f"{fname} differs")
        if folder.is_dir():
            extra = sorted(p.name for p in folder.iterdir() if p.name not in expected)
            bad += [f"unexpected {e}" for e in extra]
        pair, acc = draft_acc.get(name, ("-", None))
        rows.append(
            {
                "name": name,
                "arch": model.arch,
                "V": model.vocab,
                "size_kb": _folder_kb(folder) if folder.is_dir() else 0.0,
                "pair": pair,
                "acceptance": acc,
                "problems": bad,
            }
        )
        problems += [f"{name}: {b}" for b in bad]
    if verbose:
        print(f"{'name':<25} {'arch':<17} {'V':>2} {'size KB':>8}  {'pair':<19} {'acceptance':>10}  status")
        for r in rows:
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.4f}"
            status = "ok" if not r["problems"] else "; ".join(r["problems"])
            print(f"{r['name']:<25} {r['arch']:<17} {r['V']:>2} {r['size_kb']:>8.1f}  {r['pair']:<19} {acc:>10}  {status}")
        print(f"total {sum(r['size_kb'] for r in rows):.1f} KB in {root}")
    if problems:
        raise AssertionError("exact-model checkpoints differ from the builder (run `python -m specdec_ref.exact_models build`): " + "; ".join(problems))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec_ref.exact_models", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("build", "check"))
    parser.add_argument("--root", default=None, help=f"checkpoint root (default {ASSET_ROOT})")
    args = parser.parse_args(argv)
    if args.command == "build":
        for name, folder in build(args.root).items():
            print(f"wrote {folder} ({_folder_kb(folder):.1f} KB)")
        return 0
    try:
        check(args.root)
    except AssertionError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
