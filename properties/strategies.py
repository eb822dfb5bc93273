"""Hypothesis strategies: p/q distributions, verifier blocks and acceptance patterns.

Every row strategy produces float64 numpy rows that are exactly representable
in float32 and sum to 1 (see :func:`specdec_properties.scenarios.to_float32_rows`).
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


# ----------------------------------------------------------------------------- trees

TREE_KINDS = ("chain", "star", "kary", "random")
#: The largest trees the structure checks draw (the contract's typical production sizes).
MAX_TREE_NODES = 64
MAX_TREE_DEPTH = 8


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every node (a child of the root has depth 1)."""
    depth = np.zeros(len(parents), dtype=np.int64)
    for i, parent in enumerate(parents):
        depth[i] = 1 if parent < 0 else depth[parent] + 1
    return depth


@st.composite
def tree_parents(draw, max_nodes: int = MAX_TREE_NODES, max_depth: int = MAX_TREE_DEPTH) -> tuple[np.ndarray, str]:
    """A topologically ordered ``parents`` array (``-1``: child of the root) and its kind:
    chains, stars, complete k-ary trees in BFS order, and random trees (depth <= ``max_depth``)."""
    kind = draw(st.sampled_from(TREE_KINDS), label="tree kind")
    if kind == "chain":
        n = draw(st.integers(1, min(max_depth, max_nodes)), label="chain length")
        return np.arange(n) - 1, f"chain({n})"
    if kind == "star":
        n = draw(st.integers(1, min(16, max_nodes)), label="star size")
        return np.full(n, -1), f"star({n})"
    if kind == "kary":
        width = draw(st.integers(2, 4), label="width")
        levels = [width]
        while sum(levels) + levels[-1] * width <= max_nodes and len(levels) < max_depth:
            levels.append(levels[-1] * width)
        depth = draw(st.integers(1, len(levels)), label="depth")
        parents, previous, start = [], [-1], 0
        for level in range(depth):
            nodes = [p for p in previous for _ in range(width)]
            parents.extend(nodes)
            previous = list(range(start, start + len(nodes)))
            start += len(nodes)
        return np.array(parents), f"kary({width},{depth})"
    n = draw(st.integers(1, max_nodes), label="nodes")
    rng = np.random.default_rng(draw(seeds, label="tree seed"))
    parents, depth = [], []
    for i in range(n):
        allowed = [-1] + [j for j in range(i) if depth[j] < max_depth]
        parent = int(rng.choice(allowed))
        parents.append(parent)
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return np.array(parents), f"random({n})"


@dataclass
class TreeBlock:
    """One batched ``verify_tree`` input drawn by Hypothesis: rows of different trees, padded at the end."""

    draft_tokens: torch.Tensor  # Long[B, n], -1 for padding
    parents: torch.Tensor  # Long[B, n]
    draft_probs: torch.Tensor | None  # Float[B, n, V] or None (greedy)
    target_probs: torch.Tensor  # Float[B, n+1, V]
    kinds: list[str]

    @property
    def vocab(self) -> int:
        return self.target_probs.shape[-1]

    def describe(self) -> str:
        b, n = self.draft_tokens.shape
        return f"B={b} n={n} V={self.vocab} trees={','.join(self.kinds)}"


def _sibling_tokens(rng: np.random.Generator, q: np.ndarray, count: int, distinct: bool) -> list[int]:
    """``count`` tokens from ``q``: i.i.d., or without replacement (then zero-mass tokens once the support runs out)."""
    if not distinct:
        return [int(rng.choice(len(q), p=q)) for _ in range(count)]
    left, out = q.astype(np.float64).copy(), []
    for _ in range(count):
        if left.sum() > 0:
            x = int(rng.choice(len(q), p=left / left.sum()))
        else:  # the support ran out: an unused zero-mass token (the caller makes V >= the sibling count)
            x = int(rng.choice(np.setdiff1d(np.arange(len(q)), out)))
        out.append(x)
        left[x] = 0.0
    return out


@st.composite
def tree_blocks(draw, *, greedy: bool, distinct_siblings: bool = True, max_vocab: int = 32, max_nodes: int = MAX_TREE_NODES) -> TreeBlock:
    """``verify_tree`` inputs: 1-4 rows, each its own drawn tree (padded to the largest), rows of every kind.

    Sampling: each parent has one draft row; its children are drawn from it (distinct when
    ``distinct_siblings``: the without-replacement and deterministic schemes require it).
    Greedy: each node's token is, with probability 3/4, a maximiser of its parent's target row
    (exact ties pick a random maximiser), so deep greedy paths and tie-breaking both occur.
    """
    batch = draw(batch_sizes, label="B")
    trees = [draw(tree_parents(max_nodes=max_nodes), label=f"tree {b}") for b in range(batch)]
    siblings = max(int(np.bincount(p + 1).max()) for p, _ in trees)  # distinct siblings need V >= that
    vocab = draw(st.integers(max(2, siblings), max(max_vocab, siblings)), label="V")
    rng = np.random.default_rng(draw(seeds, label="token seed"))
    width = max(len(p) for p, _ in trees)
    tokens = np.full((batch, width), -1, dtype=np.int64)
    parents = np.full((batch, width), -1, dtype=np.int64)
    uniform = np.full(vocab, 1.0 / vocab)
    targets = np.tile(uniform, (batch, width + 1, 1))
    qs = np.tile(uniform, (batch, width, 1))
    for b, (tree, _) in enumerate(trees):
        n = len(tree)
        parents[b, :n] = tree
        targets[b, : n + 1] = draw(probability_rows(vocab, n + 1), label=f"target rows {b}")
        slot_q = draw(probability_rows(vocab, n + 1, kinds=("dirichlet_flat", "peaked", "sparse", "tied_top")), label=f"draft rows {b}")
        for slot in range(-1, n):
            children = np.flatnonzero(tree == slot)
            if len(children) == 0:
                continue
            if greedy:
                best = greedy_maximisers(targets[b, slot + 1])
                for c in children:
                    tokens[b, c] = int(rng.choice(best)) if rng.random() < 0.75 else int(rng.integers(vocab))
            else:
                qs[b, children] = slot_q[slot + 1]
                tokens[b, children] = _sibling_tokens(rng, slot_q[slot + 1], len(children), distinct_siblings)
    return TreeBlock(
        draft_tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        draft_probs=None if greedy else torch.tensor(qs, dtype=torch.float32),
        target_probs=torch.tensor(targets, dtype=torch.float32),
        kinds=[kind for _, kind in trees],
    )
