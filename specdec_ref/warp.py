"""Sampling settings and the logits -> probabilities warp shared by target, draft and AR decoding.

Invariant: target and draft go through the *same* :func:`warp`, so ``q`` handed
to the verifier is exactly the distribution the draft sampled from, and the
target rows are exactly the distribution AR sampling would use.

Order (as in transformers' logits processors): temperature, then top-k, then
top-p (nucleus, keeping the smallest prefix of the sorted distribution whose
mass reaches ``top_p``, always at least one token), then softmax. Greedy skips
temperature and filtering: its probabilities are ``softmax(logits)`` and the
choice is their first-index argmax.
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


def warp(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Probabilities ``[..., V]`` (in ``dtype``) that ``config`` samples from, given raw logits."""
    x = logits.to(dtype)
    if config.greedy:
        return torch.softmax(x, dim=-1)
    if config.temperature != 1.0:
        x = x / config.temperature
    vocab = x.shape[-1]
    if config.top_k is not None and config.top_k < vocab:
        kth = torch.topk(x, config.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= config.top_p  # keep tokens until the kept mass reaches top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)
