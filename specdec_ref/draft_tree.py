"""One round's draft tree: its nodes in breadth-first order (what a tree drafter hands the tree verifier).

Shared by the tree decoder's drafters (:mod:`specdec_ref.tree_decode`: a draft model; :mod:`specdec_ref.tree_heads`:
Medusa, EAGLE, EAGLE-3 and MTP heads). Invariant: ``parents[i] < i`` (a parent comes before its children), ``-1`` is the root (the pending
token), and ``draft_probs[i]`` is the row node ``i`` was drawn from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "tree_nodes", "fed_parents", "same_path_rows"]


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


def same_path_rows(rows: torch.Tensor, parent_ids: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per distinct path among the ``w`` nodes a drafter just fed: ``rows [..., w, V]``, ``parent_ids [..., w]``
    (each node's parent's path id, -1 for the root) and ``tokens [..., w]``. Nodes with the same parent path and token
    (i.i.d. siblings drawn twice) have the same context, so the same row in exact arithmetic, but their forward reads
    the keys at other slots and rounds otherwise; each takes the row of its first occurrence, so that its children's
    scores tie exactly (and :meth:`~specdec_ref.tree_decode.TreeSpeculativeDecoder.expand` breaks the tie by index,
    whatever the batch). Returns the rows and each node's path id (the index of its first occurrence)."""
    same = (parent_ids.unsqueeze(-1) == parent_ids.unsqueeze(-2)) & (tokens.unsqueeze(-1) == tokens.unsqueeze(-2))
    first = same.to(torch.uint8).argmax(-1)  # the first j with node j's path: j <= i
    picked = rows.gather(-2, first.unsqueeze(-1).expand(*first.shape, rows.shape[-1]))
    return picked, first


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
