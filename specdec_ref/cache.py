"""The reference KV-cache adapter: one model plus its transformers ``DynamicCache``, with explicit lengths.

``ModelCache`` separates the *tentative* length (everything fed so far, e.g. a verify block that
is still being judged) from the *committed* length (positions the decoder has accepted). Lengths
are Python ints tracked by the adapter and never read back from tensors, so the adapter itself
adds no host/device synchronisation (the optional id range check is the one exception; see
``check_ids``).

Numerical guarantee (tested in ``tests/test_cache.py`` and by ``specdec_properties.stateful_cache``):
after any sequence of ``feed`` / ``trim`` / ``commit`` / ``reset``, every layer's cached keys and
values, and the logits of the next ``feed``, equal those of a fresh prefill (one block forward
with an empty cache) of the same token sequence within ``atol=1e-5, rtol=1e-4`` in float32.
They are not bit-identical: the block forward (a [n, d] GEMM) and the one-token forward (a
[1, d] GEMV) use different kernels / reduction orders, so even layer-0 keys differ by about one
ulp (~1e-6) and logits by ~1e-6 relative (measured: <= 1.1e-5 absolute at |logit| ~ 25). The
relative term covers large logits (large ``init_scale``).

transformers 5.24 quirks this adapter handles (see ``tests/test_cache.py``):

* ``DynamicCache.crop(k)`` takes a *negative* count of tokens to remove. ``crop(0)`` is a silent
  no-op (it removes zero tokens; in the legacy API ``crop(0)`` meant "keep 0"), a positive ``k``
  raises ``ValueError``, and ``crop(-k)`` with ``k`` larger than the length silently empties the
  layer. ``trim(0)`` therefore resets (a fresh ``DynamicCache``) instead of cropping, and
  ``trim(n)`` validates ``n`` itself before calling ``crop(n - tentative_length)``.
* Without ``position_ids`` the models derive positions from ``cache.get_seq_length()`` (layer 0
  only). ``feed`` always passes ``position_ids = arange(tentative, tentative + n)`` explicitly;
  GPT-2 (learned absolute position table) honours them like the RoPE models do.
* Positions beyond the model's table raise ``IndexError`` in GPT-2 and are silently extrapolated by
  RoPE models; ``feed`` rejects both with ``ValueError`` against ``max_positions``.

Trees (tree speculative decoding, :mod:`specdec_ref.tree_decode`): :meth:`ModelCache.feed_tree` writes
the nodes of a draft tree at consecutive slots with a tree attention mask (each node sees the prefix,
its ancestors and itself) and position ids by depth; :meth:`ModelCache.compact` keeps one root-to-node
path, moved to the slots right after the committed prefix. On the transformers path the mask goes to
the model as a 4D additive ``attention_mask`` (transformers 5.x ``create_causal_mask`` returns a 4D
mask as is, for Llama, Qwen2 and GPT-2 alike) with explicit ``position_ids``; the eager and SDPA
attention implementations honour it, others (flash / flex) raise :class:`NotSupportedError`.
"""

from __future__ import annotations

import functools
import operator

import torch
from torch import nn

from specdec_ref.contract import NotSupportedError
from specdec_ref.forward import cache_arg, check_id_range
from specdec_ref.models import model_dims

__all__ = ["ModelCache", "ATOL", "RTOL", "tree_layout", "TREE_MASK_ATTENTION"]

#: transformers attention implementations that apply a custom 4D additive mask (tree feeds).
TREE_MASK_ATTENTION = ("eager", "sdpa")


def tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(depth Long[N], ancestors Bool[N, N])`` of a forest given by ``parents`` (Long[N], ``-1 <= parents[j] < j``).

    ``ancestors[i, j]`` is True when ``j`` is ``i`` or one of its ancestors; ``depth[i]`` counts ``i``'s
    strict ancestors (0 for a node under the root). Computed on ``parents``' device by pointer doubling
    (``ceil(log2 N)`` row gathers), without reading anything back to the host; on the CPU, where reading
    ``parents`` costs nothing, the layout of each distinct tree is computed once (fresh copies are returned).
    """
    if parents.device.type == "cpu":
        depth, ancestors = _cpu_tree_layout(tuple(parents.tolist()))
        return depth.clone(), ancestors.clone()
    return _tree_layout_on_device(parents)


@functools.lru_cache(maxsize=4096)
def _cpu_tree_layout(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return _tree_layout_on_device(torch.tensor(parents, dtype=torch.long))


def _tree_layout_on_device(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = parents.shape[0]
    device = parents.device
    sink = n  # an extra all-False row / column that roots point to
    jump = torch.where(parents < 0, sink, parents.long())
    rows = torch.arange(n, device=device)
    ancestors = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device)
    ancestors[rows, rows] = True
    ancestors[rows, jump] = True
    jump = torch.cat([jump, jump.new_full((1,), sink)])
    for _ in range(max(n - 1, 0).bit_length()):  # row i covers distances 0..2**s after s steps
        ancestors = ancestors | ancestors[jump]
        jump = jump[jump]
    ancestors = ancestors[:n, :n]
    return ancestors.sum(-1) - 1, ancestors

def batched_tree_layout(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_layout` of one tree per row: ``parents [B, N]`` gives ``depth [B, N]`` and ``ancestors [B, N, N]``
    (pointer doubling on the device, no host read)."""
    b, n = parents.shape
    device = parents.device
    sink = n
    jump = torch.where(parents < 0, sink, parents.long())
    rows = torch.arange(n, device=device)
    ancestors = torch.zeros(b, n + 1, n + 1, dtype=torch.bool, device=device)
    ancestors[:, rows, rows] = True
    ancestors.scatter_(2, jump[:, :, None], True)
    jump = torch.cat([jump, jump.new_full((b, 1), sink)], 1)
    for _ in range(max(n - 1, 0).bit_length()):
        ancestors = ancestors | ancestors.gather(1, jump[:, :, None].expand(b, n + 1, n + 1))
        jump = jump.gather(1, jump)
    ancestors = ancestors[:, :n, :n]
    return ancestors.sum(-1) - 1, ancestors


#: Tolerances of the fresh-prefill guarantee in float32 (block vs incremental kernels).
ATOL = 1e-5
RTOL = 1e-4


class ModelCache:
    """One causal LM plus its ``DynamicCache``, with explicit tentative and committed lengths.

    Invariant: the KV cache holds exactly ``tentative_length`` positions, all of which were fed
    through :meth:`feed`; positions ``[0, committed_length)`` are committed, and
    ``0 <= committed_length <= tentative_length``.

    Args:
        model: a transformers causal LM (``specdec_ref.models.tiny_lm`` or any Llama/Qwen2/GPT-2-like
            model taking ``input_ids``, ``position_ids``, ``cache``, ``use_cache``).
        batch_size: rows of every ``ids`` passed to :meth:`feed`; all rows share the same positions.
        check_ids: validate that ids are in ``[0, vocab_size)``. On an accelerator this reads the
            min/max back (one host sync per feed); pass ``False`` in timed loops once the caller
            guarantees valid ids. Out-of-range ids otherwise fail inside the embedding lookup.
    """

    def __init__(self, model: nn.Module, *, batch_size: int = 1, check_ids: bool = True, max_length: int | None = None):
        # ``max_length`` is a capacity hint for preallocating caches; a DynamicCache grows as needed.
        batch_size = operator.index(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = batch_size
        self.check_ids = bool(check_ids)
        dims = model_dims(model)
        self.vocab_size: int = dims["vocab_size"]
        self.num_layers: int = dims["num_layers"]
        self.num_kv_heads: int = dims["num_kv_heads"]
        self.head_dim: int = dims["head_dim"]
        self.max_positions: int = dims["max_positions"]
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self._tentative = 0
        self._committed = 0
        self._cache = self._new_cache()
        from transformers.cache_utils import DynamicLayer

        odd = sorted({type(layer).__name__ for layer in self._cache.layers if type(layer) is not DynamicLayer})
        if odd:
            raise ValueError(
                f"ModelCache supports full-attention DynamicLayer caches only; this model's config gives {odd} "
                "(sliding-window / linear-attention layers crop differently)"
            )

    # ------------------------------------------------------------------ state
    @property
    def committed_length(self) -> int:
        """Number of committed positions (a prefix of the tentative ones)."""
        return self._committed

    @property
    def tentative_length(self) -> int:
        """Number of positions the transformers cache holds (everything fed and not trimmed)."""
        return self._tentative

    @property
    def hf_cache(self):
        """The underlying ``transformers.DynamicCache`` (replaced by :meth:`reset` and ``trim(0)``)."""
        return self._cache

    def __len__(self) -> int:
        return self._tentative

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(committed={self._committed}, tentative={self._tentative}, "
            f"batch_size={self.batch_size}, layers={self.num_layers})"
        )

    # ------------------------------------------------------------------ operations
    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (LongTensor ``[B, n]``, ``n >= 1``) through the model on top of the cache.

        Writes positions ``tentative .. tentative + n - 1`` (explicit ``position_ids``), advances
        ``tentative_length`` by ``n`` and returns float32 logits ``[B, n, V]``: row ``i`` is the
        next-token distribution after ``ids[:, i]``. Committed length is unchanged.
        """
        ids = self._validate_ids(ids)
        n = ids.shape[1]
        start = self._feed_start()
        logits = self._forward(ids, start)
        self._after_feed(n)
        return logits

    def trim(self, n: int) -> None:
        """Roll back to the first ``n`` positions (``0 <= n <= tentative_length``).

        ``trim(tentative_length)`` is a no-op; ``trim(0)`` empties the cache (by a reset, since
        ``DynamicCache.crop(0)`` is a no-op). Trimming below ``committed_length`` is an explicit
        rollback of committed positions and lowers ``committed_length`` to ``n``.
        """
        n = self._validate_length(n, "trim", low=0)
        if n == self._tentative:
            return
        self._crop_to(n)
        self._tentative = n
        self._committed = min(self._committed, n)

    def commit(self, n: int) -> None:
        """Trim to ``n`` and mark ``[0, n)`` committed (``committed_length <= n <= tentative_length``).

        This is the end of a speculative round: the verify block wrote ``tentative_length``
        positions, ``n`` of them are kept. Committed positions are final: ``n`` below
        ``committed_length`` raises ``ValueError`` (use :meth:`trim` for an explicit rollback).
        """
        n = self._validate_length(n, "commit", low=self._committed)
        self.trim(n)
        self._committed = n

    def layer_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(keys, values)``, each ``(B, kv_heads, tentative_length, head_dim)``.

        These are the cache's own tensors (no copy): treat them as read-only. An empty cache
        gives zero-length tensors of the right shape.
        """
        out = []
        layers = self._cache.layers
        for i in range(self.num_layers):
            layer = layers[i] if i < len(layers) else None
            keys = getattr(layer, "keys", None) if layer is not None else None
            values = getattr(layer, "values", None) if layer is not None else None
            if keys is None or values is None or not getattr(layer, "is_initialized", True) or keys.dim() != 4:
                keys = values = self._empty_kv()
            out.append((keys, values))
        return out

    def reset(self) -> None:
        """Drop everything: both lengths become 0 and the transformers cache is replaced."""
        self._cache = self._new_cache()
        self._tentative = 0
        self._committed = 0

    def check(self) -> None:
        """Assert the invariant on shapes only (no device sync): every layer holds ``tentative_length``."""
        for i, (k, v) in enumerate(self.layer_kv()):
            want = (self.batch_size, self.num_kv_heads, self._tentative, self.head_dim)
            if tuple(k.shape) != want or tuple(v.shape) != want:
                raise AssertionError(
                    f"layer {i}: keys {tuple(k.shape)} / values {tuple(v.shape)}, expected {want} "
                    f"(tentative_length={self._tentative})"
                )
        if not 0 <= self._committed <= self._tentative:
            raise AssertionError(f"committed_length={self._committed} > tentative_length={self._tentative}")

    # ------------------------------------------------------------------ trees
    def feed_tree(self, ids: torch.Tensor, parents, *, tree_start: int | None = None, embeds: torch.Tensor | None = None,
                  head: bool = True) -> torch.Tensor:
        """Run the nodes ``ids`` (LongTensor ``[B, n]``, ``n >= 1``) of a tree on top of the cache.

        The tree's nodes occupy consecutive slots from ``tree_start`` (default ``tentative_length``: a
        new tree); this call writes the last ``n`` of them, at slots ``tentative .. tentative + n - 1``
        (``tree_start <= tentative_length``: earlier calls may have fed the first nodes, e.g. one
        draft level per call). ``parents`` (``N = tentative - tree_start + n`` ints or a Long tensor
        ``[N]``) describes *every* node of the tree in slot order: ``parents[j] = -1`` hangs node ``j``
        under the prefix (slots ``[0, tree_start)``), else under tree node ``parents[j] < j``; the
        entries for nodes fed earlier must be the ones they were fed with.

        Node ``j`` gets position id ``tree_start + depth(j)`` (``depth`` = its number of tree
        ancestors) and attends to the prefix, its ancestors and itself. Returns float32 logits
        ``[B, n, V]`` (row ``i``: the next-token distribution after ``ids[:, i]``'s path) and advances
        ``tentative_length`` by ``n``; committed length is unchanged. A chain (``parents = [-1, 0, 1,
        ...]``) gives what :meth:`feed` gives. A tensor ``parents`` is only checked
        (``-1 <= parents[j] < j``, one host read) when ``check_ids`` is set. ``embeds [B, n, H]`` / ``head=False``: the
        nodes' inputs in place of their token embeddings and the last residual stream instead of logits (a drafter's
        decoder layers fed a tree: the lean forward only, :meth:`StaticModelCache.feed_embeds`).
        """
        ids = self._validate_ids(ids)
        n = ids.shape[1]
        start = self._feed_start()
        tree_start = start if tree_start is None else tree_start
        if isinstance(tree_start, bool) or isinstance(tree_start, torch.Tensor):
            raise TypeError(f"feed_tree: tree_start must be a Python int, got {type(tree_start).__name__}")
        tree_start = operator.index(tree_start)
        if not 0 <= tree_start <= start:
            raise ValueError(f"feed_tree: tree_start must be in [0, tentative_length={start}], got {tree_start}")
        parents = self._validate_parents(parents, start - tree_start + n)
        depth, visible = self._tree_layout(parents)
        positions = tree_start + depth[-n:]
        end = start + n
        mask = torch.ones(n, end, dtype=torch.bool, device=self.device)
        mask[:, tree_start:] = visible[-n:]
        if embeds is None and head:
            logits = self._tree_forward(ids, start, positions, mask)
        elif hasattr(self, "_lean_tree_forward"):
            logits = self._tree_forward(ids, start, positions, mask, embeds=embeds, head=head)
        else:
            raise NotSupportedError(f"feed_tree with embeds / head=False needs the lean forward, not {type(self).__name__}")
        self._after_feed(n)
        return logits

    def compact(self, keep) -> None:
        """Keep the committed prefix and the tentative slots ``keep``, moved to the slots right after it.

        ``keep``: Python ints, strictly increasing, in ``[committed_length, tentative_length)``. The
        entry of ``keep[i]`` moves to slot ``committed_length + i``; every other tentative slot is
        dropped, and ``tentative_length`` becomes ``committed_length + len(keep)``. Entries keep the
        position ids they were fed with, so the result equals a fresh prefill of the kept tokens when
        each kept entry was fed at the position it now occupies (e.g. one root-to-node path of a tree
        fed by :meth:`feed_tree` right after the prefix). ``keep`` dense from ``committed_length`` is a
        :meth:`trim`.
        """
        if isinstance(keep, torch.Tensor):
            raise TypeError("compact(keep): keep must be a sequence of Python ints, not a tensor")
        keep = list(keep)
        c = self._committed
        for i, slot in enumerate(keep):
            if isinstance(slot, bool) or isinstance(slot, torch.Tensor):
                raise TypeError(f"compact(keep): slots must be Python ints, got {type(slot).__name__}")
            slot = keep[i] = operator.index(slot)
            if not c <= slot < self._tentative or (i and slot <= keep[i - 1]):
                raise ValueError(
                    f"compact({keep}): slots must be strictly increasing and in [committed_length={c}, "
                    f"tentative_length={self._tentative})"
                )
        if keep == list(range(c, c + len(keep))):
            self.trim(c + len(keep))
            return
        self._compact_slots(c, keep)
        self._tentative = c + len(keep)

    def _validate_parents(self, parents, count: int) -> torch.Tensor:
        host = not isinstance(parents, torch.Tensor)
        if host:
            try:
                parents = torch.tensor([operator.index(p) for p in parents], dtype=torch.long)
            except TypeError:
                raise ValueError(f"feed_tree: parents must be a sequence of ints or a Long tensor, got {parents!r}") from None
        if parents.dtype.is_floating_point or parents.dtype.is_complex or parents.dtype == torch.bool:
            raise ValueError(f"feed_tree: parents must be an integer tensor, got dtype {parents.dtype}")
        if parents.dim() != 1 or parents.shape[0] != count:
            raise ValueError(
                f"feed_tree: parents must list every node of the tree ({count} = slots fed since tree_start + n), "
                f"got shape {tuple(parents.shape)}"
            )
        if host or self.check_ids:
            index = torch.arange(count, device=parents.device)
            bad = (parents < -1) | (parents >= index)
            if bool(bad.any()):
                j = int(bad.nonzero()[0, 0])
                raise ValueError(f"feed_tree: parents must satisfy -1 <= parents[j] < j; parents[{j}] = {int(parents[j])}")
        return parents.to(device=self.device, dtype=torch.long)

    def _tree_layout(self, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(depth[N], visible[N, N])`` of the tree: position offsets and which tree nodes each node attends to."""
        return tree_layout(parents)

    def _tree_forward(self, ids: torch.Tensor, start: int, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Forward ``ids`` at slots ``start..``, position ids ``positions[n]``, attending where ``mask[n, start + n]``."""
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if impl not in TREE_MASK_ATTENTION:
            raise NotSupportedError(
                f"feed_tree needs a custom 4D attention mask, which attn_implementation={impl!r} does not take "
                f"(supported: {', '.join(TREE_MASK_ATTENTION)})"
            )
        b, n = ids.shape
        blocked = torch.finfo(self.dtype).min
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(~mask, blocked)
        additive = additive[None, None].expand(b, 1, n, mask.shape[1])
        with torch.no_grad():
            out = self.model(
                input_ids=ids, position_ids=positions[None].expand(b, n), attention_mask=additive,
                **cache_arg(self.model, self._cache), use_cache=True,
            )
        return out.logits.float()

    def _compact_slots(self, committed: int, keep: list[int]) -> None:
        """Move the entries of slots ``keep`` to ``committed ..`` in every layer and drop the rest."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self._cache.layers:
            if getattr(layer, "keys", None) is None or not getattr(layer, "is_initialized", True):
                continue
            layer.keys = torch.cat([layer.keys[:, :, :committed], layer.keys.index_select(2, index)], 2)
            layer.values = torch.cat([layer.values[:, :, :committed], layer.values.index_select(2, index)], 2)

    # ------------------------------------------------------------------ internals (mutant hooks)
    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def _empty_kv(self) -> torch.Tensor:
        return torch.empty(
            (self.batch_size, self.num_kv_heads, 0, self.head_dim), dtype=self.dtype, device=self.device
        )

    def _feed_start(self) -> int:
        """First position id of the next feed."""
        return self._tentative

    def _after_feed(self, n: int) -> None:
        self._tentative += n

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n = ids.shape[1]
        positions = torch.arange(start, start + n, device=self.device).unsqueeze(0).expand(ids.shape[0], n)
        with torch.no_grad():
            out = self.model(input_ids=ids, position_ids=positions, **cache_arg(self.model, self._cache), use_cache=True)
        return out.logits.float()

    def _crop_to(self, n: int) -> None:
        """Make the transformers cache hold the first ``n`` positions (``0 <= n < tentative``)."""
        if n == 0:
            self._cache = self._new_cache()
        else:
            self._cache.crop(n - self._tentative)

    def _validate_length(self, n, what: str, *, low: int) -> int:
        if isinstance(n, bool) or isinstance(n, torch.Tensor):
            raise TypeError(f"{what}(n): n must be a Python int, got {type(n).__name__}")
        n = operator.index(n)
        if not low <= n <= self._tentative:
            raise ValueError(
                f"{what}({n}): n must be in [{low}, tentative_length={self._tentative}] "
                f"(committed_length={self._committed})"
            )
        return n

    def _validate_ids(self, ids) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"feed: ids must be a LongTensor [B, n], got {type(ids).__name__}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"feed: ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"feed: ids must have 2 dims [B, n], got shape {tuple(ids.shape)}")
        b, n = ids.shape
        if b != self.batch_size:
            raise ValueError(f"feed: ids batch {b} != batch_size {self.batch_size}")
        if n < 1:
            raise ValueError("feed: ids is empty (n == 0); feed at least one token")
        start = self._feed_start()
        if self.max_positions and start + n > self.max_positions:
            raise ValueError(
                f"feed: positions {start}..{start + n - 1} exceed the model's max positions "
                f"{self.max_positions} (tentative_length={self._tentative}, n={n})"
            )
        if ids.dtype != torch.long:
            ids = ids.long()
        if ids.device != self.device:
            ids = ids.to(self.device)
        if self.check_ids:
            check_id_range(ids, self.vocab_size, "feed:")
        return ids
