"""The draws of a decoding round: a token per row (argmax or a sample), each row from its own generator.

Shared by the decoders and the proposers (:mod:`specdec_ref.decode`, :mod:`specdec_ref.heads`): a greedy row takes
the first-index argmax, a sampling row a sample of its weights from its own generator (the exponential race of
:func:`specdec_ref.verify.sample_from_weights`), so a seeded row draws the same alone or in any batch.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .history import constant
from .verify import sample_from_weights
from .warp import SamplingConfig

__all__ = ["choose", "choose_rows", "row_generators"]


def row_generators(gens: list, rows: Sequence[int] | None = None):
    """The ``generator`` argument for the live rows (``rows``: a subset, in order): the generator itself for one row,
    else a per-row list."""
    live = gens if rows is None else [gens[i] for i in rows]
    return live[0] if len(live) == 1 else list(live)


def choose(probs: torch.Tensor, sampling: SamplingConfig, generator) -> torch.Tensor:
    """Token per row of ``probs[..., V]`` under one setting: argmax for greedy, a sample otherwise."""
    return probs.argmax(-1) if sampling.greedy else sample_from_weights(probs, generator)


def choose_rows(probs: torch.Tensor, configs: Sequence[SamplingConfig], generator) -> torch.Tensor:
    """Token per row of ``probs [B, V]``: argmax for greedy rows, a sample (from the row's generator) otherwise."""
    greedy = [c.greedy for c in configs]
    if all(greedy):
        return probs.argmax(-1)
    sampled = sample_from_weights(probs, generator)
    if not any(greedy):
        return sampled
    mask = constant(tuple(greedy), torch.bool, probs.device)
    return torch.where(mask, probs.argmax(-1), sampled)
