"""Per-row KV-cache lengths for batched decoding: every request keeps its own committed prefix.

:class:`RowCaches` wraps one cache of ``B`` rows and tracks a tentative and a committed length *per row*.
A feed ``ids [B, n]`` writes row ``b`` at its own slots ``tentative[b] .. tentative[b] + n - 1`` (its own
position ids), each query attending to its own row's slots up to itself only; rows whose ``advance`` flag
is False are computed but do not grow (what they wrote lies past their length: never read, overwritten
later). Rollback and commit only move the per-row Python ints, as in :class:`~specdec_ref.cache.ModelCache`.

Invariant (checked by the decoder checks through :meth:`RowCaches.row`): row ``b``'s first
``tentative[b]`` slots hold the keys and values of a fresh prefill of its tokens.

* ``B == 1``: the wrapped cache is used through its own scalar API (``feed`` / ``commit``), so any
  :class:`~specdec_ref.cache.ModelCache` works, transformers' ``DynamicCache`` included; the batch-1
  decoder is this case.
* ``B > 1``: the cache must run ragged rows (:meth:`~specdec_ref.static_cache.StaticModelCache.ragged_forward`,
  the lean Llama / Qwen2 / GPT-2 forward); others raise :class:`~specdec_ref.contract.NotSupportedError`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .contract import NotSupportedError

__all__ = ["RowCaches", "RowView"]


class RowView:
    """Row ``b`` of a :class:`RowCaches` seen as a one-row cache (``layer_kv``, lengths); read-only."""

    def __init__(self, owner: "RowCaches", b: int):
        self._owner = owner
        self._b = b

    @property
    def tentative_length(self) -> int:
        return self._owner.tentative[self._b]

    @property
    def committed_length(self) -> int:
        return self._owner.committed[self._b]

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        end = self.tentative_length
        b = self._b
        return [(k[b : b + 1, :, :end], v[b : b + 1, :, :end]) for k, v in self._owner.layer_kv_full()]


class RowCaches:
    """``B`` rows of one cache with per-row lengths (see the module docstring)."""

    def __init__(self, cache):
        self.cache = cache
        b = cache.batch_size
        if b > 1 and not hasattr(cache, "ragged_forward"):
            raise NotSupportedError(
                f"batched decoding (B={b}) needs a cache with per-row lengths (StaticModelCache: llama / qwen2 / gpt2); "
                f"{type(cache).__name__} on model_type={getattr(getattr(cache.model, 'config', None), 'model_type', '?')} "
                "runs one request at a time"
            )
        self.scalar = b == 1
        self.tentative = [cache.tentative_length] * b
        self.committed = [cache.committed_length] * b

    @property
    def batch_size(self) -> int:
        return len(self.tentative)

    def layer_kv_full(self):
        """Per-layer buffers ``(B, heads, >= max tentative, D)`` (row ``b`` valid up to ``tentative[b]``)."""
        if self.scalar:
            return self.cache.layer_kv()
        return list(zip(self.cache._cache.keys, self.cache._cache.values))

    def row(self, b: int):
        """Row ``b`` as a one-row cache (the wrapped cache itself when ``B == 1``)."""
        return self.cache if self.scalar else RowView(self, b)

    def feed(self, ids: torch.Tensor, advance: Sequence[bool] | None = None, *, embeds: torch.Tensor | None = None,
             head: bool = True) -> torch.Tensor:
        """Row ``b`` of ``ids [B, n]`` at its own next slots; rows with ``advance[b]`` False do not grow.
        Float32 logits ``[B, n, V]``. ``embeds [B, n, H]`` replaces the token embeddings and ``head=False`` returns the
        last residual stream instead of logits (a drafter's decoder layers, ``StaticModelCache.feed_embeds``)."""
        n = ids.shape[1]
        if self.scalar:
            if advance is not None and not advance[0]:
                return None
            logits = self.cache.feed(ids) if embeds is None else self.cache.feed_embeds(ids, embeds, head=head)
            self.tentative = [self.cache.tentative_length]
            return logits
        starts = torch.tensor(self.tentative, dtype=torch.long, device=ids.device)
        logits = self.cache.ragged_forward(ids, starts, max(self.tentative) + n, embeds=embeds, head=head)
        self.tentative = [t + n if (advance is None or advance[b]) else t for b, t in enumerate(self.tentative)]
        return logits

    def prefill(self, prompts: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]] | None = None) -> bool:
        """Write every prompt but its last token (the first pending one); True when a forward ran. ``tokens``: the
        prompts as host lists, if the caller has them (rows with the same prompt then share one prefill)."""
        lengths = [int(p.shape[-1]) - 1 for p in prompts]
        longest = max(lengths)
        if longest == 0:
            return False
        if self.scalar:
            self.feed(prompts[0].reshape(1, -1)[:, :-1])
            self.commit([lengths[0]])
            return True
        # rows with the same prompt share one prefill (a prefix cache): the distinct prompts are written into a cache
        # of that many rows, whose rows are then copied to every row that has them
        if tokens is None:
            tokens = [p.reshape(-1).tolist() for p in prompts]
        heads = [tuple(t[:-1]) for t in tokens]
        first: dict[tuple, int] = {}
        inverse = [first.setdefault(h, len(first)) for h in heads]
        distinct = list(first)
        if len(distinct) < len(prompts):
            self.cache.select_rows(torch.zeros(len(distinct), dtype=torch.long, device=self.cache.device))  # all empty
        ids = torch.tensor([list(h) + [0] * (longest - len(h)) for h in distinct], dtype=torch.long, device=prompts[0].device)
        self.cache.ragged_forward(ids, torch.zeros(len(distinct), dtype=torch.long, device=ids.device), longest)
        if len(distinct) < len(prompts):
            rows = torch.tensor(inverse, dtype=torch.long, device=self.cache.device)
            self.cache.select_rows(rows)
            if self.cache.captured:  # the hidden states a proposer reads, per row like the K/V
                self.cache.captured = {layer: x.index_select(0, rows) for layer, x in self.cache.captured.items()}
        self.tentative = list(lengths)
        self.commit(lengths)
        return True

    def feed_tree(self, ids: torch.Tensor, parents: torch.Tensor, tree_starts: Sequence[int]) -> torch.Tensor:
        """One tree per row: the last ``n`` nodes ``ids [B, n]`` of row ``b``'s tree, whose nodes occupy the slots from
        ``tree_starts[b]`` (``parents [B, N]``: every node of each row's tree so far, ``-1`` under the prefix; the rows'
        trees may differ). Each node gets position ``tree_starts[b] + depth`` and sees the prefix, its ancestors and
        itself (:meth:`~specdec_ref.cache.ModelCache.feed_tree` per row). Float32 logits ``[B, n, V]``."""
        from .cache import batched_tree_layout

        n = ids.shape[1]
        if self.scalar:
            logits = self.cache.feed_tree(ids, parents[0], tree_start=int(tree_starts[0]))
            self.tentative = [self.cache.tentative_length]
            return logits
        depth, ancestors = batched_tree_layout(parents)
        device = ids.device
        first = torch.tensor(tree_starts, dtype=torch.long, device=device)
        starts = torch.tensor(self.tentative, dtype=torch.long, device=device)
        logits = self.cache.ragged_tree_forward(ids, starts, first, first[:, None] + depth[:, -n:], ancestors[:, -n:],
                                                max(self.tentative) + n)
        self.tentative = [t + n for t in self.tentative]
        return logits

    def compact(self, keeps: Sequence[Sequence[int]]) -> None:
        """Row ``b`` keeps its committed prefix and its tentative slots ``keeps[b]`` (strictly increasing), moved right
        after the prefix (:meth:`~specdec_ref.cache.ModelCache.compact` per row)."""
        keeps = [list(k) for k in keeps]
        if self.scalar:
            self.cache.compact(keeps[0])
            self.tentative = [self.cache.tentative_length]
            return
        for b, keep in enumerate(keeps):
            c = self.committed[b]
            if not keep or keep[0] < c or keep[-1] >= self.tentative[b] or any(x >= y for x, y in zip(keep, keep[1:])):
                raise ValueError(f"compact: row {b} keeps {keep}, not strictly increasing in [committed {c}, "
                                 f"tentative {self.tentative[b]})")
        if any(keep != list(range(c, c + len(keep))) for c, keep in zip(self.committed, keeps)):  # else a trim
            self.cache.compact_rows([self.committed[b] for b in range(len(keeps))], keeps)
        self.tentative = [c + len(k) for c, k in zip(self.committed, keeps)]

    def take(self, rows: Sequence[int]) -> "RowCaches":
        """A copy of ``rows`` (B > 1) as a batch of their own (:meth:`put` writes it back)."""
        import copy

        index = torch.tensor(list(rows), dtype=torch.long, device=self.cache.device)
        cache = copy.copy(self.cache)
        cache._cache = type(self.cache._cache)([k.index_select(0, index) for k in self.cache._cache.keys],
                                               [v.index_select(0, index) for v in self.cache._cache.values])
        cache.batch_size = len(rows)
        part = RowCaches.__new__(RowCaches)
        part.cache = cache
        part.tentative = [self.tentative[i] for i in rows]
        part.committed = [self.committed[i] for i in rows]
        part.scalar = len(rows) == 1
        if part.scalar:
            cache._tentative, cache._committed = part.tentative[0], part.committed[0]
        return part

    def put(self, rows: Sequence[int], part: "RowCaches") -> None:
        """Write a :meth:`take` copy of ``rows`` back: its buffers and lengths."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.cache.device)
        with torch.inference_mode():
            for mine, theirs in zip((*self.cache._cache.keys, *self.cache._cache.values),
                                    (*part.cache._cache.keys, *part.cache._cache.values)):
                mine.index_copy_(0, index, theirs)
        for r, i in enumerate(rows):
            self.tentative[i] = part.tentative[r]
            self.committed[i] = part.committed[r]

    def commit(self, lengths: Sequence[int]) -> None:
        """Row ``b`` keeps its first ``lengths[b]`` slots, all committed (``committed[b] <= lengths[b] <= tentative[b]``)."""
        lengths = [int(n) for n in lengths]
        for b, n in enumerate(lengths):
            if not self.committed[b] <= n <= self.tentative[b]:
                raise ValueError(
                    f"commit: row {b} to {n}, outside [committed {self.committed[b]}, tentative {self.tentative[b]}]"
                )
        if self.scalar:
            self.cache.commit(lengths[0])
            lengths = [self.cache.committed_length]
        self.tentative = list(lengths)
        self.committed = list(lengths)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (finished requests leave the batch), in that order."""
        rows = list(rows)
        if rows == list(range(self.batch_size)):
            return
        if self.scalar or len(rows) == 0:
            self.tentative = [self.tentative[i] for i in rows]
            self.committed = [self.committed[i] for i in rows]
            return
        self.cache.select_rows(torch.tensor(rows, dtype=torch.long, device=self.cache.device))
        self.tentative = [self.tentative[i] for i in rows]
        self.committed = [self.committed[i] for i in rows]
        if len(rows) == 1:  # what is left is one request: its own scalar cache from here on
            self.cache._tentative = self.tentative[0]
            self.cache._committed = self.committed[0]
            self.scalar = True
