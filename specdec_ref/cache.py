"""The reference KV-cache adapter: one model plus its transformers ``DynamicCache``, with explicit lengths.

``ModelCache`` separates the *tentative* length (everything fed so far, e.g. a verify block that
is still being judged) from the *committed* length (positions the decoder has accepted). Lengths
are Python ints tracked by the adapter and never read back from tensors, so the adapter itself
adds no host/device synchronisation (the optional id range check is the one exception; see
``check_ids``).

Numerical guarantee (tested in ``tests/test_cache.py`` and by ``properties.stateful_cache``):
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
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from specdec_ref.forward import check_id_range
from specdec_ref.models import model_dims

__all__ = ["ModelCache", "ATOL", "RTOL"]

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
            out = self.model(input_ids=ids, position_ids=positions, cache=self._cache, use_cache=True)
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
