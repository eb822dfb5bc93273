"""Where a verifier's randomness comes from: one generator for the batch, or one per row.

A verifier's ``generator`` argument is either a single ``torch.Generator`` (or ``None``: the global RNG)
shared by the whole batch, or a list with one entry per row: row ``b`` draws only from ``generator[b]``,
and a ``None`` entry is an *unseeded* row that draws from the global RNG (an engine's batch mixing seeded
and unseeded requests). With per-row generators a row's output depends only on its own inputs and its own
generator, never on the other rows or its position in the batch: a seeded request decodes bit for bit the
same alone or in any batch.

Chain verifiers draw in the same order either way (all of a row's uniforms, then its exponentials), so a
row verified alone with a single generator gives exactly what it gives in a batch with that generator in its
slot of the list. Tree verifiers given per-row generators draw each row's final-sample exponentials *first*,
then one uniform per node slot: the trailing slots of a padded row come last, so a row reproduces bit for
bit alone (a one-element list) or padded to any width in a ragged batch.
"""
from __future__ import annotations

from functools import cache
from typing import Sequence, Union

import torch

__all__ = ["Generators", "is_per_row", "check_generators", "uniform", "exponential_like", "exponential_"]

#: The ``generator`` argument of ``verify`` / ``verify_tree``.
Generators = Union[torch.Generator, Sequence[Union[torch.Generator, None]], None]


def is_per_row(generator: Generators) -> bool:
    """Whether ``generator`` is a per-row list (or tuple)."""
    return isinstance(generator, (list, tuple))


def check_generators(generator: Generators, batch: int) -> None:
    """``ValueError`` for a per-row list of the wrong length or with entries that are not generators or None;
    ``TypeError`` for anything else that is not a generator or None."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not is_per_row(generator):
        raise TypeError(f"generator must be a torch.Generator, a list of one per row, or None; got {type(generator).__name__}")
    if len(generator) != batch:
        raise ValueError(f"generator is a per-row list of {len(generator)} entries but the batch has B={batch} rows")
    for b, g in enumerate(generator):
        if g is not None and not isinstance(g, torch.Generator):
            raise ValueError(f"generator[{b}] must be a torch.Generator or None (unseeded row), got {type(g).__name__}")


def uniform(shape: tuple[int, ...], generator: Generators, device, dtype=torch.float32) -> torch.Tensor:
    """``torch.rand(shape)``; with a per-row list, row ``b`` (the first dimension) from ``generator[b]``."""
    if is_per_row(generator):
        out = torch.empty(shape, device=device, dtype=dtype)
        for row, g in zip(out, generator):  # in place, row by row: the same draws as torch.rand(shape[1:], generator=g)
            row.uniform_(generator=g)
        return out
    return torch.rand(shape, generator=generator, device=device, dtype=dtype)


def exponential_like(weights: torch.Tensor, generator: Generators) -> torch.Tensor:
    """Exp(1) draws shaped like ``weights``; with a per-row list, row ``b`` (the first dimension) from ``generator[b]``."""
    if is_per_row(generator):
        out = torch.empty_like(weights, memory_format=torch.contiguous_format)
        for row, g in zip(out, generator):  # in place, row by row: row b's draws come from generator[b] only
            row.exponential_(generator=g)  # a row is small: exponential_ itself is the cheaper way
        return out
    return exponential_(torch.empty_like(weights), generator)


#: Below this many elements ``Tensor.exponential_`` itself is the cheaper of the two identical ways (one dispatch).
FAST_EXPONENTIAL_MIN = 2048


def exponential_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``out.exponential_(generator=generator)``: the same values and the same generator state afterwards.

    On the CPU, float32 ``exponential_`` draws one float64 uniform ``u`` per element and returns ``-log1p(-u)``
    rounded to float32, one element at a time (about 20 ns each). For a large contiguous tensor the same draws are
    taken as ``uniform_`` in float64 and transformed in vectorised ops, about 3x cheaper. The identity is checked
    once per process on this torch build (:func:`float32_exponential_is_log1p`); where it does not hold, or on
    another device or dtype, ``exponential_`` itself runs. The stream is the one ``torch.multinomial`` uses, so
    nothing downstream (replays, equality with transformers' sampling) can tell the two apart.
    """
    if (
        out.dtype == torch.float32
        and out.device.type == "cpu"
        and out.numel() >= FAST_EXPONENTIAL_MIN
        and out.is_contiguous()
        and (generator is None or generator.device.type == "cpu")
        and float32_exponential_is_log1p()
    ):
        u = torch.empty(out.shape, dtype=torch.float64).uniform_(generator=generator)
        return out.copy_(u.neg_().log1p_().neg_())
    return out.exponential_(generator=generator)


@cache
def float32_exponential_is_log1p() -> bool:
    """Whether this torch build's CPU float32 ``exponential_`` equals ``-log1p(-u)`` of float64 ``uniform_`` draws,
    value for value and in the generator state it leaves (checked on 4 096 draws from two seeds)."""
    for seed in (0, 20261205):
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        reference = torch.empty(4096).exponential_(generator=g1)
        u = torch.empty(4096, dtype=torch.float64).uniform_(generator=g2)
        if not torch.equal(reference, u.neg_().log1p_().neg_().float()) or not torch.equal(g1.get_state(), g2.get_state()):
            return False
    return True
