"""The lean static cache's batch rows, each with its own length (what :class:`~specdec_ref.row_cache.RowCaches` runs on).

:class:`RaggedRows` is a mixin of :class:`~specdec_ref.static_cache.StaticModelCache`: a feed writes row ``b`` at its
own slots with its own position ids and an attention mask per row (a chain, or one tree per row), and rows are
compacted, selected, copied out and back per row. Lengths are the caller's; nothing here reads the device back.
"""
from __future__ import annotations

import torch

__all__ = ["RaggedRows"]


class RaggedRows:
    """Per-row feeds and moves over the static cache's buffers (needs the host class's ``_cache``, ``max_length``,
    ``device``, the RoPE / position tables and ``_lean_layers`` / ``_gpt2_layers``)."""

    def ragged_forward(self, ids: torch.Tensor, starts: torch.Tensor, end: int, *, embeds: torch.Tensor | None = None,
                       head: bool = True) -> torch.Tensor:
        """Row ``b`` of ``ids [B, n]`` written at slots ``starts[b] .. starts[b] + n - 1`` with those position ids,
        each query seeing its own row's slots up to itself; ``end >= max(starts) + n`` (a Python int) bounds the
        slots read. Lengths are the caller's (:class:`specdec_ref.row_cache.RowCaches`); float32 logits ``[B, n, V]``
        (``embeds`` / ``head=False``: see :meth:`_lean_layers`)."""
        slots = starts.unsqueeze(1) + torch.arange(ids.shape[1], device=self.device)  # [B, n]
        mask = (torch.arange(end, device=self.device) <= slots.unsqueeze(-1)).unsqueeze(1)  # [B, 1, n, end]
        return self._ragged(ids, slots, slots, mask, end, embeds=embeds, head=head)

    def ragged_tree_forward(self, ids: torch.Tensor, starts: torch.Tensor, tree_starts: torch.Tensor,
                            positions: torch.Tensor, visible: torch.Tensor, end: int) -> torch.Tensor:
        """One tree per row: row ``b`` of ``ids [B, n]`` written at slots ``starts[b] ..`` with position ids
        ``positions [B, n]``; query ``j`` of row ``b`` sees the row's slots before ``tree_starts[b]`` (its prefix) and
        the tree slots ``tree_starts[b] + i`` with ``visible[b, j, i]`` (``visible [B, n, N]``: ancestors and itself
        among the tree's ``N`` nodes so far). ``end`` (a Python int) bounds the slots read; float32 logits ``[B, n, V]``."""
        n, tree = ids.shape[1], visible.shape[-1]
        slots = starts.unsqueeze(1) + torch.arange(n, device=self.device)  # [B, n]
        rel = torch.arange(end, device=self.device) - tree_starts.unsqueeze(1)  # [B, end]: slot - tree start
        seen = visible.gather(2, rel.clamp(0, tree - 1).unsqueeze(1).expand(-1, n, -1))  # [B, n, end]
        mask = (rel < 0).unsqueeze(1) | (((rel >= 0) & (rel < tree)).unsqueeze(1) & seen)
        return self._ragged(ids, slots, positions, mask.unsqueeze(1), end)

    def _ragged(self, ids, slots, positions, mask, end: int, *, embeds=None, head: bool = True) -> torch.Tensor:
        if end > self.max_length:
            raise ValueError(f"ragged feed reaches slot {end - 1}, beyond max_length {self.max_length}")
        with torch.inference_mode():
            if self.gpt2:
                self._llama_only(embeds, head)
                logits = self._gpt2_layers(ids, 0, self._pos_embed[positions], mask, causal=False, slots=slots, end=end)
            else:
                logits = self._lean_layers(ids, 0, self._cos[0][positions], self._sin[0][positions], mask,
                                           causal=False, slots=slots, end=end, embeds=embeds, head=head)
        return logits.float() if logits.dtype != torch.float32 else logits.clone()

    def compact_rows(self, committed: list[int], keeps: list[list[int]]) -> None:
        """Row ``b``'s entries at slots ``keeps[b]`` move to ``committed[b] ..`` (one gather and one scatter per buffer;
        a shorter row is padded by repeating its last move, the same value written to the same slot again)."""
        width = max(len(k) for k in keeps)
        source = torch.tensor([k + [k[-1]] * (width - len(k)) for k in keeps], dtype=torch.long, device=self.device)
        target = torch.tensor([[c + i for i in range(len(k))] + [c + len(k) - 1] * (width - len(k))
                               for c, k in zip(committed, keeps)], dtype=torch.long, device=self.device)
        b, heads, _, d = self._cache.keys[0].shape
        source = source[:, None, :, None].expand(b, heads, width, d)
        target = target[:, None, :, None].expand(b, heads, width, d)
        with torch.inference_mode():
            for buf in (*self._cache.keys, *self._cache.values):
                buf.scatter_(2, target, buf.gather(2, source))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (Long, in that order): the buffers are re-gathered and ``batch_size`` shrinks."""
        with torch.inference_mode():
            self._cache.keys = [k.index_select(0, rows) for k in self._cache.keys]
            self._cache.values = [v.index_select(0, rows) for v in self._cache.values]
        self.batch_size = int(rows.shape[0])
