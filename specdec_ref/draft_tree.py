"""One round's draft tree: its nodes in breadth-first order (what a tree drafter hands the tree verifier).

Shared by the tree decoder's drafters (:mod:`specdec_ref.tree_decode`: a draft model; :mod:`specdec_ref.tree_heads`:
Medusa, EAGLE, EAGLE-3 and MTP heads). Invariant: ``parents[i] < i`` (a parent comes before its children), ``-1`` is the root (the pending
token), and ``draft_probs[i]`` is the row node ``i`` was drawn from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "tree_nodes", "fed_parents"]


def tree_nodes(depth: int, width: int) -> int:
    """Nodes of a full round's tree: ``width`` at level 1, ``width ** 2`` at each further level."""
    return 0 if depth < 1 else width + (depth - 1) * width * width


def fed_parents(level: int, chosen: torch.Tensor, width: int) -> torch.Tensor:
    """The parents, among the nodes a drafter has fed so far (``width`` per level, level by level), of the ``width``
    nodes ``chosen`` (indices within their level) of level ``level`` (>= 1) that it feeds next: ``-1`` (the prefix) at
    level 1, else the ``(j // width)``-th node fed at level ``level - 1``."""
    if level == 1:
        return torch.full((width,), -1, dtype=torch.long, device=chosen.device)
    return (level - 2) * width + torch.div(chosen, width, rounding_mode="floor")


@dataclass
class DraftTree:
    """One round's draft tree (device tensors, BFS node order)."""

    tokens: torch.Tensor  # Long[n]
    parents: torch.Tensor  # Long[n], -1 = child of the root (the pending token)
    draft_probs: torch.Tensor  # Float[n, V]: the parent's row (the one each node was drawn from)
    draft_slots: torch.Tensor  # Long[n]: the draft-cache slot a node was fed at, -1 when never fed
    draft_calls: int

    @property
    def size(self) -> int:
        return self.tokens.shape[0]
