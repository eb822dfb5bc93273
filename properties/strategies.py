"""Hypothesis strategies: p/q distributions, verifier blocks and acceptance patterns.

Every row strategy produces float64 numpy rows that are exactly representable
in float32 and sum to 1 (see :func:`properties.scenarios.to_float32_rows`).
Row kinds cover the shapes that break verifiers: flat and spiky Dirichlet,
LM-like peaked softmax, one-hot, exact ties at the top, tiny masses, zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from .scenarios import dirichlet_rows, peaked_rows, to_float32_rows

ROW_KINDS = ("dirichlet_flat", "dirichlet_spiky", "peaked", "one_hot", "tied_top", "tiny_masses", "sparse")

vocab_sizes = st.integers(2, 64)
block_sizes = st.integers(1, 8)
batch_sizes = st.integers(1, 4)
seeds = st.integers(0, 2**32 - 1)


def make_row(kind: str, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """One probability row of the given kind (float64, not yet float32-rounded)."""
    if kind == "dirichlet_flat":
        return dirichlet_rows(rng, 1, vocab, 5.0)[0]
    if kind == "dirichlet_spiky":
        return dirichlet_rows(rng, 1, vocab, 0.1)[0]
    if kind == "peaked":
        return peaked_rows(rng, 1, vocab, sharpness=3.0)[0]
    if kind == "one_hot":
        row = np.zeros(vocab)
        row[rng.integers(vocab)] = 1.0
        return row
    if kind == "tied_top":
        row = rng.uniform(0.0, 0.5, vocab)
        top = rng.choice(vocab, size=min(vocab, 2), replace=False)
        row[top] = 1.0
        return row / row.sum()
    if kind == "tiny_masses":
        row = np.full(vocab, 1e-8)
        row[rng.integers(vocab)] = 1.0
        return row / row.sum()
    if kind == "sparse":
        row = dirichlet_rows(rng, 1, vocab, 1.0)[0]
        row[rng.random(vocab) < 0.5] = 0.0
        if row.sum() == 0:
            row[rng.integers(vocab)] = 1.0
        return row / row.sum()
    raise ValueError(f"unknown row kind {kind!r}")


@st.composite
def probability_rows(draw, vocab: int, n: int, kinds=ROW_KINDS) -> np.ndarray:
    """``n`` rows over ``vocab`` tokens, each of a drawn kind, rounded to float32."""
    row_kinds = draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n), label="row kinds")
    rng = np.random.default_rng(draw(seeds, label="row seed"))
    return to_float32_rows(np.stack([make_row(kind, vocab, rng) for kind in row_kinds]))


#: How the draft rows relate to the target rows.
DRAFT_RELATIONS = ("independent", "equal", "mixture", "disjoint_zeros")


def draft_rows_for(relation: str, target: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draft rows (k, V) related to target rows (k, V) as ``relation`` says."""
    k, vocab = target.shape
    if relation == "equal":
        return target.copy()
    if relation == "mixture":
        lam = rng.uniform(0.05, 0.5)
        return to_float32_rows((1 - lam) * target + lam * peaked_rows(rng, k, vocab))
    if relation == "disjoint_zeros":
        # q > 0 where p = 0 and q = 0 on part of p's support
        q = np.where(target > 0, 0.0, 1.0) + rng.uniform(0, 1, target.shape) * (rng.random(target.shape) < 0.5)
        q[q.sum(-1) == 0, 0] = 1.0
        return to_float32_rows(q)
    return to_float32_rows(peaked_rows(rng, k, vocab, sharpness=2.0))


@dataclass
class Block:
    """One batched verify() input drawn by Hypothesis, with how it was made."""

    draft_tokens: torch.Tensor  # Long[B, k]
    draft_probs: torch.Tensor | None  # Float[B, k, V] or None (greedy)
    target_probs: torch.Tensor  # Float[B, k+1, V]
    pattern: str

    @property
    def k(self) -> int:
        return self.draft_tokens.shape[1]

    @property
    def vocab(self) -> int:
        return self.target_probs.shape[-1]

    def describe(self) -> str:
        b, k = self.draft_tokens.shape
        return f"B={b} k={k} V={self.vocab} pattern={self.pattern}"


def greedy_maximisers(row: np.ndarray) -> np.ndarray:
    """Indices of the maximal entries of a float32 row (exact ties included)."""
    row32 = row.astype(np.float32)
    return np.flatnonzero(row32 == row32.max())


@st.composite
def greedy_blocks(draw, max_k: int = 8, max_vocab: int = 64) -> Block:
    """Greedy verify() inputs with a forced acceptance pattern per row.

    Per row: ``reject@j`` (drafts 1..j are maximisers of their rows, draft j+1
    is not) or ``all`` (every draft is a maximiser). Rows with exact ties pick a
    random maximiser, so the accepted length does not depend on tie-breaking.
    """
    vocab = draw(st.integers(2, max_vocab), label="V")
    k = draw(st.integers(1, max_k), label="k")
    batch = draw(batch_sizes, label="B")
    rng = np.random.default_rng(draw(seeds, label="draft seed"))
    targets, drafts, patterns = [], [], []
    for _ in range(batch):
        target = draw(probability_rows(vocab, k + 1), label="target rows")
        stop = draw(st.integers(0, k), label="forced stop")
        row_drafts = []
        for i in range(k):
            best = greedy_maximisers(target[i])
            others = np.setdiff1d(np.arange(vocab), best)
            if i < stop or len(others) == 0:
                row_drafts.append(int(rng.choice(best)))
            elif i == stop:
                row_drafts.append(int(rng.choice(others)))
            else:
                row_drafts.append(int(rng.integers(vocab)))
        targets.append(target)
        drafts.append(row_drafts)
        patterns.append("all" if stop == k else f"reject@{stop}")
    return Block(
        draft_tokens=torch.tensor(drafts, dtype=torch.long),
        draft_probs=None,
        target_probs=torch.tensor(np.stack(targets), dtype=torch.float32),
        pattern=",".join(patterns),
    )


@st.composite
def sampling_blocks(draw, max_k: int = 8, max_vocab: int = 64) -> Block:
    """Sampling verify() inputs: drafts drawn from the draft rows, rows of every kind."""
    vocab = draw(st.integers(2, max_vocab), label="V")
    k = draw(st.integers(1, max_k), label="k")
    batch = draw(batch_sizes, label="B")
    rng = np.random.default_rng(draw(seeds, label="draft seed"))
    targets, qs, drafts, relations = [], [], [], []
    for _ in range(batch):
        target = draw(probability_rows(vocab, k + 1), label="target rows")
        relation = draw(st.sampled_from(DRAFT_RELATIONS), label="draft relation")
        q = draft_rows_for(relation, target[:k], rng)
        drafts.append([int(rng.choice(vocab, p=row)) for row in q])
        targets.append(target)
        qs.append(q)
        relations.append(relation)
    return Block(
        draft_tokens=torch.tensor(drafts, dtype=torch.long),
        draft_probs=torch.tensor(np.stack(qs), dtype=torch.float32),
        target_probs=torch.tensor(np.stack(targets), dtype=torch.float32),
        pattern=",".join(relations),
    )


@st.composite
def distribution_pairs(draw, max_k: int = 4, max_vocab: int = 24):
    """(target (k+1, V), draft (k, V)) row sets of every kind, for statistical checks."""
    vocab = draw(st.integers(2, max_vocab), label="V")
    k = draw(st.integers(1, max_k), label="k")
    target = draw(probability_rows(vocab, k + 1), label="target rows")
    relation = draw(st.sampled_from(DRAFT_RELATIONS), label="draft relation")
    rng = np.random.default_rng(draw(seeds, label="draft seed"))
    return target, draft_rows_for(relation, target[:k], rng), relation
