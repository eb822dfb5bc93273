"""The arithmetic every exactly-known checkpoint is built from: few-bit dyadic weights and one-hot attention.

Invariant: a weight built here is a dyadic number of at most 8 significant bits (exact in float32 and bfloat16), and
an attention head whose attended key leads every other key by :data:`MIN_SCORE_GAP` in scaled score puts weight
exactly 1 on it in float32 and bfloat16 (``exp(-150)`` underflows to 0). Deterministic: the filler weights come from
splitmix64, never from a random generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .tables import splitmix64

__all__ = ["MIN_SCORE_GAP", "bf16_exact", "round_bits", "dyadic_noise", "four_squares"]

#: Smallest scaled-score gap between the attended key and any other key (asserted at build time,
#: float64 with exact angles; exp(-150) underflows to exactly 0 in float32 and bfloat16).
MIN_SCORE_GAP = 150.0


def bf16_exact(x: np.ndarray) -> bool:
    """Whether every entry of ``x`` is exactly representable in bfloat16."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return torch.equal(t.to(torch.bfloat16).to(torch.float32), t)


def round_bits(x: float, bits: int = 8) -> float:
    """``x`` rounded to ``bits`` significant bits (a dyadic number exact in bfloat16 for bits <= 8);
    0 for ``|x| < 2**-10`` (e.g. sin(pi) in float64)."""
    if abs(x) < 2.0**-10:
        return 0.0
    m, e = math.frexp(x)
    return math.ldexp(round(m * (1 << bits)) / (1 << bits), e)


def dyadic_noise(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic weights in {-1, -1/2, -1/4, 0, 1/4, 1/2, 1} (for parts that do not affect the law)."""
    stream = splitmix64(seed)
    levels = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0)
    n = int(np.prod(shape))
    return np.array([levels[next(stream) % 7] for _ in range(n)], dtype=np.float64).reshape(shape)


def four_squares(n: int) -> tuple[int, int, int, int]:
    """Integers (a, b, c, d), a >= b >= c >= d >= 0, with a^2 + b^2 + c^2 + d^2 == n (largest first)."""
    a = math.isqrt(n)
    while a >= 0:
        r1 = n - a * a
        b = min(a, math.isqrt(r1))
        while b >= 0:
            r2 = r1 - b * b
            c = min(b, math.isqrt(r2))
            while c >= 0:
                r3 = r2 - c * c
                d = math.isqrt(r3)
                if d * d == r3 and d <= c:
                    return a, b, c, d
                c -= 1
            b -= 1
        a -= 1
    raise AssertionError(f"no four-square decomposition of {n}")  # pragma: no cover - Lagrange
