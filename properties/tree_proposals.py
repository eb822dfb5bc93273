"""Exact draft trees of the exactly-known drafters: the greedy tree of a round, and the rule every sampled tree follows.

Independent of the reference's tree drafters (:mod:`specdec_ref.tree_decode`, :mod:`specdec_ref.tree_heads`): float64
numpy on the order-1 tables and the proposal laws of :mod:`specdec_properties.proposals` (plus :class:`DraftModelLaw`, a draft
model that is an order-1 table). A tree round from the text ``h`` (pending token last), ``depth`` levels of ``width``:

* the root gets ``width`` children from the law's row after ``h``;
* each further level expands the ``width`` nodes of the previous one with the highest *path probability* (the product
  of each node's probability in its parent's row, the root's children's in the root's row; ties to the lower node),
  in node order, each with ``width`` children from the law's row after that node's path (Medusa: the level's row,
  whatever the path; EAGLE, EAGLE-3, MTP: the head's row after drafting the path; a draft model: its row after the
  node's token);
* nodes are in breadth-first order: level by level, within a level grouped by parent in parent order; the number of
  levels is ``law.count(h, depth)`` (Medusa: capped at its heads; none before a head has a feature).

Greedy rows are the softmax of the raw logits (not tempered) and a node's children are the top ``width`` ids (ties to
the lower id): :func:`greedy_tree` is the whole tree, its node probabilities and the accepted path. Sampled rows are
the raw logits warped by the settings, and the children are draws: :func:`sampled_tree_verdict` judges a reported
tree by what does not depend on the draws (how many nodes, which nodes were expanded, every node's token possible
and, where reported, its probability equal to the law's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .proposals import TIE, _argmax, _target_rows

__all__ = ["DraftModelLaw", "GreedyTree", "greedy_tree", "greedy_tree_round", "tree_size", "sampled_tree_verdict",
           "SCORE_TIE", "PROB_RTOL", "PROB_ATOL"]

#: Path probabilities of two tree nodes closer than this (relative) are a near tie, equal ones included unless both are
#: the product of the same probabilities in the same order (as a drafter multiplies them, bit for bit the same
#: product): float32 may rank them either way.
SCORE_TIE = 1e-6
#: A reported node probability equals the law's within ``PROB_ATOL + PROB_RTOL * p`` (float32 softmax of logits that
#: are the table's bit for bit, or within the MTP law's tie margin of 1e-5).
PROB_RTOL = 1e-4
PROB_ATOL = 1e-6


@dataclass(frozen=True)
class DraftModelLaw:
    """A draft model that is an order-1 exactly-known table (``specdec_ref.exact``, e.g. ``order1-draft-close``):
    its row after a path is the table's row of the path's last token (the pending token for the root)."""

    draft: str
    sample: bool = True
    one_hot = property(lambda self: not self.sample)
    context = 1

    def raw(self, text: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        return _target_rows(self.draft)[drafts[-1] if drafts else text[-1]]

    def count(self, text, k):
        return k


def tree_size(levels: int, width: int) -> int:
    """Nodes of a round's tree of ``levels`` levels: ``width`` at level 1, ``width ** 2`` at each further level."""
    return 0 if levels < 1 else width + (levels - 1) * width * width


def _top(row: np.ndarray, width: int, tie: float = TIE) -> list[int] | None:
    """The ``width`` largest entries' ids, ties to the lower id (a stable descending sort); None when the ``width``-th
    and the next are a near tie (within ``tie`` but not equal: float32 may order them either way)."""
    order = np.argsort(-row, kind="stable")
    if len(order) > width:
        a, b = row[order[width - 1]], row[order[width]]
        if a != b and a - b < tie:
            return None
    return [int(i) for i in order[:width]]


def _expanded(factors: Sequence[tuple], level_nodes: Sequence[int], width: int) -> list[int] | None:
    """The ``width`` nodes of ``level_nodes`` with the highest path probability (the product of ``factors[node]``, the
    node probabilities along its path; ties to the lower node), in node order; None when the ``width``-th and the next
    are a near tie (:data:`SCORE_TIE`)."""
    score = {n: math.prod(factors[n]) for n in level_nodes}
    ranked = sorted(level_nodes, key=lambda n: -score[n])
    edge = score[ranked[min(width, len(ranked)) - 1]]
    near = [n for n in ranked if abs(score[n] - edge) < SCORE_TIE * edge]  # the ties around the last expanded node
    if any(factors[c] != factors[u] for c in near if c in ranked[:width] for u in near if u not in ranked[:width]):
        return None
    return sorted(ranked[:width])


@dataclass(frozen=True)
class GreedyTree:
    """A greedy round's tree (breadth-first node order), each node's probability in its parent's row, and how many
    levels the target's argmax chain accepts through it."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]
    accepted: int


def greedy_tree(target, law, text: Sequence[int], depth: int, width: int) -> GreedyTree | None:
    """The greedy tree of a round from ``text`` (module docstring; an order-1 exactly-known ``target`` judges it: the
    accepted path follows the target's argmax chain). None when the round drafts nothing, or when a ranking on the way
    is a near tie (top ids within the law's ``tie``, path probabilities within :data:`SCORE_TIE` relative, not equal)."""
    text = list(text)
    levels = law.count(text, depth)
    if levels == 0:
        return None
    tie = getattr(law, "tie", TIE)

    def row(path):
        x = law.raw(text, path)
        p = np.exp(x - x.max())
        return _top(x, width, tie), p / p.sum()

    top, probs = row([])
    if top is None:
        return None
    tokens, parents, paths = list(top), [-1] * width, [[t] for t in top]
    node_probs = [float(probs[t]) for t in top]
    factors = [(p,) for p in node_probs]
    level_nodes = list(range(width))
    for _ in range(1, levels):
        chosen = _expanded(factors, level_nodes, width)
        if chosen is None:
            return None
        new_nodes = []
        for node in chosen:
            top, probs = row(paths[node])
            if top is None:
                return None
            for t in top:
                parents.append(node)
                tokens.append(t)
                paths.append(paths[node] + [t])
                node_probs.append(float(probs[t]))
                factors.append(factors[node] + (float(probs[t]),))
                new_nodes.append(len(tokens) - 1)
        level_nodes = new_nodes
    node, last, accepted = -1, text[-1], 0
    for _ in range(levels):
        g = _argmax(np.asarray(target.next_logits([[last]]), dtype=np.float64)[0])
        if g is None:
            return None
        child = next((i for i, (p, t) in enumerate(zip(parents, tokens)) if p == node and t == g), None)
        if child is None:
            break
        node, last, accepted = child, g, accepted + 1
    return GreedyTree(tokens, parents, node_probs, accepted)


def greedy_tree_round(target, law, text: Sequence[int], depth: int, width: int) -> tuple[int, int] | None:
    """``(nodes, accepted)`` of :func:`greedy_tree` (None where it is None)."""
    tree = greedy_tree(target, law, text, depth, width)
    return None if tree is None else (len(tree.tokens), tree.accepted)


def sampled_tree_verdict(law, text: Sequence[int], depth: int, width: int, config, tokens: Sequence[int],
                         parents: Sequence[int], probs: Sequence[float] | None) -> tuple[str, str]:
    """Judge a sampled tree round's reported tree (``tokens``, ``parents``, node ``probs`` or None) from ``text`` by
    the rule (module docstring): ``("ok", "")``; ``("tie", why)`` when an expansion is a near tie (not judged); or
    ``("violation", what)`` naming the first node that differs and how: the number of nodes, a node hung under
    another parent than the rule expands (the ``width`` nodes of its level with the highest path probability), a
    token the law's row gives probability 0, a reported probability other than the law's."""
    import torch

    from specdec_ref.warp import warp

    text, tokens, parents = list(text), list(tokens), list(parents)
    levels = law.count(text, depth)
    want = tree_size(levels, width)
    if len(tokens) != want or len(parents) != want:
        return "violation", (f"{len(tokens)} nodes drafted; the rule drafts {want} ({levels} level(s) of width {width})")
    rows: dict = {}

    def row(path: tuple) -> np.ndarray:
        if path not in rows:
            rows[path] = warp(torch.from_numpy(np.asarray(law.raw(text, list(path)), dtype=np.float64)[None]), config,
                              dtype=torch.float64)[0].numpy()
        return rows[path]

    paths: list[tuple] = []
    factors: list[tuple] = []
    expected_parents = [-1] * width
    level_nodes = list(range(width))
    start = 0
    for level in range(levels):
        if level > 0:
            chosen = _expanded(factors, level_nodes, width)
            if chosen is None:
                return "tie", f"the expansion of level {level} is a near tie"
            expected_parents = [node for node in chosen for _ in range(width)]
        count = len(expected_parents)
        for i in range(start, start + count):
            parent = expected_parents[i - start]
            if parents[i] != parent:
                return "violation", (
                    f"node {i} (level {level + 1}) hangs under node {parents[i]}; the rule hangs it under node {parent}"
                    + ("" if level == 0 else f": level {level}'s nodes with the {width} highest path probabilities are "
                       f"{sorted(set(expected_parents))} (path probabilities "
                       f"{ {n: round(math.prod(factors[n]), 6) for n in level_nodes} })"))
            path = () if parent < 0 else paths[parent]
            p = float(row(path)[tokens[i]])
            if p <= 0:
                return "violation", (f"node {i} (level {level + 1}, path {list(path) + [tokens[i]]}) has token "
                                     f"{tokens[i]}, which the law's row after its parent's path gives probability 0")
            if probs is not None and abs(probs[i] - p) > PROB_ATOL + PROB_RTOL * p:
                return "violation", (f"node {i} (level {level + 1}, path {list(path) + [tokens[i]]}) is reported with "
                                     f"probability {probs[i]:.6g}; the law's row after its parent's path gives "
                                     f"{p:.6g} (a node fed the wrong feature, or a row from another path)")
            paths.append(path + (tokens[i],))
            factors.append((() if parent < 0 else factors[parent]) + (p,))
        level_nodes = list(range(start, start + count))
        start += count
    return "ok", ""
