"""Memory figures of a profile: the process's peak and current memory, and the KV caches' bytes.

* ``peak_rss_bytes``: ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux): the peak resident set of
  the process *since it started*, so it only ever grows; a profile prints it after each stage. tracemalloc is
  not used: torch allocates tensors outside Python's allocator, which tracemalloc never sees.
* ``rss_bytes``: the current resident set (``/proc/self/statm``; ``None`` where there is no /proc).
* on CUDA, ``torch.cuda.max_memory_allocated`` (reset by :func:`reset_device_peak`).
* KV caches: the formula ``2 L n H_kv d_h b`` (keys and values, ``L`` layers, ``n`` tokens, ``H_kv`` heads of
  size ``d_h``, ``b`` bytes per element; times the batch size) beside the bytes the cache tensors actually hold:
  the valid entries (``layer_kv()`` views) and the allocated storage (a static cache preallocates every
  position it may use).
"""
from __future__ import annotations

import os
import resource
import sys

import torch

from specdec_ref.models import model_dims

__all__ = ["peak_rss_bytes", "rss_bytes", "memory_snapshot", "reset_device_peak", "kv_formula_bytes", "cache_bytes"]


def peak_rss_bytes() -> int:
    """Peak resident set of this process since it started (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def rss_bytes() -> int | None:
    """Current resident set from ``/proc/self/statm`` (None where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def reset_device_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def memory_snapshot() -> dict:
    """``peak_rss_bytes``, ``rss_bytes`` and (CUDA only) ``cuda_peak_bytes`` since :func:`reset_device_peak`."""
    snap = {"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": rss_bytes(), "cuda_peak_bytes": None}
    if torch.cuda.is_available():
        snap["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return snap


def kv_formula_bytes(model, tokens: int, batch: int = 1) -> int:
    """``2 L n H_kv d_h b`` times the batch: keys and values of ``tokens`` positions in every layer (0 for no model)."""
    if model is None:
        return 0
    dims = model_dims(model)
    element = next(model.parameters()).element_size()
    return 2 * dims["num_layers"] * tokens * dims["num_kv_heads"] * dims["head_dim"] * element * batch


def cache_bytes(cache) -> dict:
    """``{"valid": bytes of the layer_kv() views, "allocated": bytes of their storage}`` of a cache (or None)."""
    try:
        layers = cache.layer_kv()
    except Exception:  # noqa: BLE001 -- a cache without layer_kv (or one that cannot show it now) reports nothing
        return {"valid": None, "allocated": None}
    valid = allocated = 0
    seen = set()
    for pair in layers:
        for t in pair:
            valid += t.numel() * t.element_size()
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                allocated += storage.nbytes()
    return {"valid": valid, "allocated": allocated}
