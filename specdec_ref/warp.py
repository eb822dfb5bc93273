"""Sampling settings and the logits -> probabilities warp shared by target, draft and AR decoding.

Invariant: target and draft go through the *same* :func:`warp`, so ``q`` handed
to the verifier is exactly the distribution the draft sampled from, and the
target rows are exactly the distribution AR sampling would use.

Order (as in transformers' logits processors): temperature, then top-k, then
top-p (nucleus, keeping the smallest prefix of the sorted distribution whose
mass reaches ``top_p``, always at least one token), then softmax. Greedy skips
temperature and filtering: its probabilities are ``softmax(logits)`` and the
choice is their first-index argmax.

Each step is a function (:func:`scale_temperature`, :func:`top_k_filter`, :func:`top_p_filter`;
:func:`warp_logits` composes them, :func:`warp` is its softmax), so oracles that reason about the
warped support (``properties.sequences``) call these very steps instead of re-implementing them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. ``greedy=True`` ignores the other fields."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r} (use greedy=True for argmax)")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    def as_dict(self) -> dict:
        return {"greedy": self.greedy, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


GREEDY = SamplingConfig(greedy=True)


def scale_temperature(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """``x / temperature`` (``x`` itself at temperature 1)."""
    return x / temperature if temperature != 1.0 else x


def top_k_filter(x: torch.Tensor, k: int | None) -> torch.Tensor:
    """``x`` with every entry below the k-th largest of its row set to ``-inf`` (ties at the k-th are kept)."""
    if k is None or k >= x.shape[-1]:
        return x
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, float("-inf"))


def nucleus_masses(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, sorted_p, mass_before)`` of ``x`` sorted descending: the sort permutation, the
    softmax of the sorted row and the probability mass strictly before each sorted token."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_x, dim=-1)
    return order, sorted_p, sorted_p.cumsum(-1) - sorted_p


def top_p_filter(x: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """``x`` with ``-inf`` outside the smallest sorted prefix whose mass reaches ``top_p`` (at least one token)."""
    if top_p is None or top_p >= 1.0:
        return x
    order, _, mass_before = nucleus_masses(x)
    drop_sorted = mass_before >= top_p  # keep tokens until the kept mass reaches top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def warp_logits(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The logits ``[..., V]`` (in ``dtype``) that :func:`warp` takes the softmax of.

    Temperature-scaled, then top-k, then top-p filtered (dropped tokens are ``-inf``); greedy
    returns the raw logits cast to ``dtype``.
    """
    x = logits.to(dtype)
    if config.greedy:
        return x
    x = scale_temperature(x, config.temperature)
    x = top_k_filter(x, config.top_k)
    return top_p_filter(x, config.top_p)


def warp(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Probabilities ``[..., V]`` (in ``dtype``) that ``config`` samples from, given raw logits."""
    return torch.softmax(warp_logits(logits, config, dtype), dim=-1)
