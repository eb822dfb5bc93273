"""The registry of exactly-known models: every table of :mod:`specdec_ref.exact.tables` named, with its folder.

Invariant: an :class:`ExactModel`'s law is ``softmax(table[cell(context)])`` in float64, read from its table;
:meth:`ExactModel.next_logits` never runs a checkpoint (only :meth:`ExactModel.load` / ``tokenizer`` read the
folder under :data:`ASSET_ROOT`). :data:`EXACT_MODELS` and :data:`EXACT_PAIRS` are fixed at import, in a
fixed order, and their tables are read-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from . import long as exact_long, offset as exact_offset
from .tables import (
    ORDER1_EOS,
    ORDER1_VOCAB,
    ORDER2_BOS,
    ORDER2_EOS,
    ORDER2_REAL,
    ORDER2_VOCAB,
    TABLES,
    order2_cells,
    token_names,
)

__all__ = [
    "ASSET_ROOT",
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
    "SHIFTED",
]

#: Root of the shipped checkpoints (package data).
ASSET_ROOT: Path = Path(__file__).resolve().parent.parent / "assets" / "exact"
#: ``max_position_embeddings`` of every checkpoint; contexts may hold at most this many tokens.
MAX_POSITIONS: int = 128
#: The contexts a shifted order-1 law accepts (:meth:`ExactModel.shifted`): any length a test may generate.
SHIFTED_MAX_POSITIONS: int = 1 << 20
#: Stated bfloat16 bound, max |logit error| of the bf16 checkpoint against the table (tested; the
#: construction keeps every intermediate value exact in bf16, so the measured error is 0). The offset
#: variants state their own (``ExactModel.bf16_logit_bound``, ``specdec_ref.exact.offset``).
BF16_LOGIT_BOUND: float = 0.0
#: Stated bfloat16 bound on max |probability error| (softmax of the bf16 logits in float64).
BF16_PROB_BOUND: float = 0.0


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
        if not isinstance(ctx, (list, tuple)):
            ctx = list(ctx)  # read an iterator once
        if all(type(t) is int for t in ctx):  # plain ints (the usual case): nothing to convert
            out.append(list(ctx))
            continue
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
    with (order2, long) or None (order1); ``family`` is ``"order1"``, ``"order2"`` or ``"long"``
    (:mod:`specdec_ref.exact.long`); ``arch`` the transformers architecture.
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
    #: common offset of every logit (0; LOGIT_OFFSET for the offset variants of ``specdec_ref.exact.offset``)
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
        if self.family == "long":
            exact_long.validate_long_context(self.name, ctx)

    def shifted(self) -> "ExactModel":
        """The law past the checkpoint's positions, as an engine that shifts its context (discards part of it and
        moves the rest back) generates it: for an order-1 model the law reads the last token only, so it is the same
        table at any length (named ``NAME+shift``); an order-2 model's law reads the position's parity, which after a
        shift is the engine's own, so it has none (ValueError)."""
        if self.family != "order1":
            raise ValueError(f"{self.name}: its law reads the position's parity; past a context shift the positions "
                             "are the engine's own, so it states no law there (only order-1 models do)")
        return dataclasses.replace(self, name=self.name + SHIFTED, max_positions=SHIFTED_MAX_POSITIONS, _cache={})

    def cell(self, context: Sequence[int]) -> tuple[int, ...]:
        """The table cell a context selects: ``(last,)`` for order1, ``(a, b, c)`` for order2, ``(a, b, c, k)`` for
        long (``k`` the marker's index)."""
        (ctx,) = _as_context_list([context])
        self._validate(ctx)
        return self._cell_of(ctx)

    def _cell_of(self, ctx: list[int]) -> tuple[int, ...]:
        if self.family == "order1":
            return (ctx[-1],)
        if self.family == "long":
            return exact_long.long_cell(ctx)
        m = len(ctx) - 1
        return (ctx[m - 1] if m >= 1 else ctx[0], ctx[m], m % 2)

    def next_logits(self, contexts) -> torch.Tensor:
        """float64 table logits ``[len(contexts), V]`` after each context (prompt + generated ids)."""
        rows = []
        for ctx in _as_context_list(contexts):
            self._validate(ctx)
            rows.append(self.table[self._cell_of(ctx)])
        if not rows:
            return torch.empty((0, self.vocab), dtype=torch.float64)
        return torch.from_numpy(np.stack(rows).astype(np.float64))

    def prefix_logits(self, sequence: Sequence[int]) -> torch.Tensor:
        """float64 table logits ``[n, V]`` after every prefix of one sequence (row ``i``: the context
        ``sequence[:i + 1]``), in one pass; a row whose prefix is not a context of this model (a long-family marker
        among its last two tokens, a second marker) is NaN. The whole sequence must otherwise be valid (ids,
        ``<bos>`` first and only there, at most ``max_positions`` tokens): ValueError."""
        (seq,) = _as_context_list([sequence])
        if self.family == "long":  # checked here per prefix; the rest as for any context
            base = [t if t not in exact_long.LONG_MARKERS else exact_long.LONG_REAL[0] for t in seq]
            if min(seq, default=0) < 0 or max(seq, default=0) >= self.vocab:
                raise ValueError(f"{self.name}: token ids must be in [0, {self.vocab}), got {seq}")
            self._validate(base)
        else:
            self._validate(seq)
        out = np.full((len(seq), self.vocab), np.nan)
        marks = [i for i, t in enumerate(seq) if self.family == "long" and t in exact_long.LONG_MARKERS]
        for i in range(len(seq)):
            m = [j for j in marks if j <= i]
            if len(m) > 1 or (m and m[0] > i - 2):
                continue
            if self.family == "long":
                k = seq[m[0]] - exact_long.LONG_MARKERS[0] if m else exact_long.NO_MARKER
                out[i] = self.table[exact_long.long_cell_at(seq, i, k)]
            else:
                out[i] = self.table[self._cell_of(seq[: i + 1])]
        return torch.from_numpy(out)

    def next_probs(self, contexts) -> torch.Tensor:
        """float64 softmax of :meth:`next_logits` (the law)."""
        return torch.softmax(self.next_logits(contexts), dim=-1)

    def cells(self) -> tuple[tuple[int, ...], ...]:
        """Every reachable cell (the table rows the law can use)."""
        if self.family == "order1":
            return tuple((t,) for t in range(self.vocab))
        if self.family == "long":
            return exact_long.long_cells()
        return order2_cells()

    def row_contexts(self) -> list[list[int]]:
        """One shortest context per reachable cell, in :meth:`cells` order."""
        if self.family == "order1":
            return [[t] for t in range(self.vocab)]
        if self.family == "long":
            return _long_row_contexts(self.bos_id)
        bos, filler = self.bos_id, ORDER2_REAL[0]
        out = []
        for a, b, c in order2_cells():
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
        return exact_long.long_token_names() if self.family == "long" else token_names(self.family)


def _long_row_contexts(bos: int) -> list[list[int]]:
    """One shortest context per cell of the long family (a marker at position 1 when there is one)."""
    filler, out = exact_long.LONG_REAL[0], []
    for a, b, c, k in exact_long.long_cells():
        head = [bos] if k == exact_long.NO_MARKER else [bos, exact_long.LONG_MARKERS[k]]
        if b == bos:
            out.append([bos])
        elif a == bos:
            out.append([bos, b])
        else:
            body = [a, b] if (len(head) + 1) % 2 == c else [filler, a, b]
            out.append(head + body)
    return out


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


def _make_models() -> dict[str, ExactModel]:
    o1 = dict(
        vocab=ORDER1_VOCAB,
        eos_id=ORDER1_EOS,
        min_context=1,
        max_positions=MAX_POSITIONS,
        family="order1",
    )
    d1 = "order-1 Markov: logits = T[last token] (8 x 8 table); no dependence on position or earlier tokens"
    o2 = dict(o1, vocab=ORDER2_VOCAB, eos_id=ORDER2_EOS, family="order2", bos_id=ORDER2_BOS)
    specs = [
        ("order1-target", o1, d1 + " (the target)"),
        ("order1-draft-close", o1, d1 + " (target + small perturbation)"),
        ("order1-draft-far", o1, d1 + " (target + large perturbation)"),
        ("order1-draft-same", o1, d1 + " (an identical copy of the target)"),
        (
            "order2-target",
            o2,
            "order-2 with position: logits = T2[previous token, last token, parity of the last token's "
            "position], the context starting with <bos> at position 0",
        ),
        (
            "order2-draft",
            o2,
            "order-1 approximation of order2-target in the same architecture: logits depend on the last "
            "token only (the target's rows averaged over previous token and parity)",
        ),
        (
            "order2-draft-close",
            o2,
            "order-2 with position, close to order2-target (target + small perturbation)",
        ),
    ]
    long = dict(o1, vocab=exact_long.LONG_VOCAB, eos_id=exact_long.LONG_EOS, family="long",
                bos_id=exact_long.LONG_BOS, max_positions=exact_long.LONG_MAX_POSITIONS)
    dl = ("long context: logits = T[previous token, last token, parity, marker], the marker (m0..m3) the one "
          "marker token anywhere behind (or none), the context starting with <bos>; 4 096 positions")
    long_tables = exact_long.long_tables()
    specs += [("long-target", long, dl + " (the target: head size 128, 4 query heads on 2 KV heads)"),
              ("long-draft", long, dl + " (target + small perturbation; head size 64, 4 query heads on 2 KV heads)")]
    tables = dict(TABLES, **long_tables)
    models = {}
    for name, kw, desc in specs:
        models[name] = ExactModel(name=name, description=desc, path=ASSET_ROOT / name, table=tables[name], **kw)
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
        ("long-close", "long-target", "long-draft", "long-context draft close to the target, reading the marker too"),
    ] + list(exact_offset.OFFSET_PAIRS)
    return {name: ExactPair(name, m[t], m[d], purpose) for name, t, d, purpose in specs}


EXACT_PAIRS: dict[str, ExactPair] = _make_pairs()


#: Suffix of a model name whose law is taken past the checkpoint's positions (:meth:`ExactModel.shifted`).
SHIFTED = "+shift"


def exact_model(name: str) -> ExactModel:
    """The model called ``name`` (``UnknownExactModelError``, a ValueError, listing the known names); ``NAME+shift``
    is :meth:`ExactModel.shifted` of ``NAME``."""
    if isinstance(name, str) and name.endswith(SHIFTED) and name[: -len(SHIFTED)] in EXACT_MODELS:
        return EXACT_MODELS[name[: -len(SHIFTED)]].shifted()
    try:
        return EXACT_MODELS[name]
    except (KeyError, TypeError):
        raise UnknownExactModelError(f"unknown exact model {name!r}; known: {', '.join(EXACT_MODELS)} (and "
                                     f"NAME{SHIFTED} of an order-1 model)") from None


def exact_pair(name: str) -> ExactPair:
    """The pair called ``name`` (``UnknownExactModelError``, a ValueError, listing the known names)."""
    try:
        return EXACT_PAIRS[name]
    except (KeyError, TypeError):
        raise UnknownExactModelError(f"unknown exact pair {name!r}; known: {', '.join(EXACT_PAIRS)}") from None
