"""Fixed target/draft row sets ("scenarios") for the statistical verifier checks.

A scenario is data: ``target`` rows ``p[0..k]`` and ``draft`` rows ``q[0..k-1]``,
float64 arrays whose values are exactly representable in float32 (what the
backend receives), plus the purpose it serves. Every row differs from every
other so that a verifier that reads the wrong row is visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import exact


def to_float32_rows(rows: np.ndarray) -> np.ndarray:
    """Round rows to float32 and renormalise in float64, so both sides see the same numbers."""
    rows = np.asarray(rows, dtype=np.float32).astype(np.float64)
    return rows / rows.sum(-1, keepdims=True)


def peaked_rows(rng: np.random.Generator, n: int, vocab: int, sharpness: float = 1.5) -> np.ndarray:
    """``softmax(sharpness * N(0, 1))`` rows: the shape of a real LM's next-token distribution."""
    logits = sharpness * rng.standard_normal((n, vocab))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def dirichlet_rows(rng: np.random.Generator, n: int, vocab: int, concentration: float) -> np.ndarray:
    rows = rng.dirichlet(np.full(vocab, concentration), size=n)
    rows = np.maximum(rows, 0.0)
    rows[rows.sum(-1) == 0, 0] = 1.0  # tiny concentrations can underflow a whole row
    return rows / rows.sum(-1, keepdims=True)


def mix_for_acceptance(p: np.ndarray, other: np.ndarray, acceptance: float) -> np.ndarray:
    """A draft row ``(1-l) p + l other`` whose acceptance ``sum min(p, q)`` equals ``acceptance``.

    Acceptance falls monotonically from 1 (l = 0) to ``sum min(p, other)`` (l = 1);
    ``l`` is found by bisection, so the target must lie in that range.
    """
    floor = np.minimum(p, other).sum()
    if not floor <= acceptance <= 1.0:
        raise ValueError(f"acceptance {acceptance} outside the reachable range [{floor:.4f}, 1]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        a = np.minimum(p, (1 - mid) * p + mid * other).sum()
        lo, hi = (mid, hi) if a > acceptance else (lo, mid)
    return (1 - lo) * p + lo * other


@dataclass(frozen=True, eq=False)
class Scenario:
    """Fixed rows for one block; ``target`` is (k+1, V), ``draft`` is (k, V)."""

    name: str
    target: np.ndarray
    draft: np.ndarray
    purpose: str

    @property
    def k(self) -> int:
        return self.draft.shape[0]

    @property
    def vocab(self) -> int:
        return self.target.shape[1]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "purpose": self.purpose,
            "target": self.target.tolist(),
            "draft": self.draft.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Scenario":
        target = np.asarray(d["target"], dtype=np.float64)
        draft = np.asarray(d["draft"], dtype=np.float64)
        if target.ndim != 2 or draft.ndim != 2 or target.shape[0] != draft.shape[0] + 1 or target.shape[1] != draft.shape[1]:
            raise ValueError(f"scenario {d.get('name')!r}: target must be (k+1, V) and draft (k, V)")
        return cls(name=str(d["name"]), target=target, draft=draft, purpose=str(d.get("purpose", "")))

    def describe(self) -> str:
        a = exact.acceptance_probs(self.target, self.draft)
        return f"{self.name} (k={self.k}, V={self.vocab}, acceptance per position {np.round(a, 3).tolist()})"


def balanced_scenario(seed: int = 2026, k: int = 4, vocab: int = 16) -> Scenario:
    """Distinct peaked rows, draft acceptance chosen so each stopping point has mass ``1/(k+1)``.

    ``P(m = j) = 1/(k+1)`` for every j: one sample feeds the residual check at
    every position, the bonus check and the per-position checks with equal power.
    """
    rng = np.random.default_rng(seed)
    p = peaked_rows(rng, k + 1, vocab)
    others = peaked_rows(rng, k, vocab, sharpness=2.5)
    q = np.empty((k, vocab))
    for j in range(k):
        # P(m=j) = reach_j * (1 - a_j) = 1/(k+1) with reach_j = (k+1-j)/(k+1)
        q[j] = mix_for_acceptance(p[j], others[j], 1.0 - 1.0 / (k + 1 - j))
    return Scenario(
        name="balanced",
        target=to_float32_rows(p),
        draft=to_float32_rows(q),
        purpose="distinct LM-like rows; every stopping position 0..k equally likely",
    )


def edge_scenario(k: int = 3, vocab: int = 12) -> Scenario:
    """Hand-made rows with the edge cases a verifier must guard.

    row 0: p = 0 where q > 0 (drafts there must always be rejected), q = 0 where p > 0, a tiny p mass;
    row 1: q = 0 where p > 0 (only the residual can emit those tokens), 1e-6 masses;
    row 2: p == q exactly (everything drafted is accepted, the residual is empty);
    row 3 (bonus): one-hot.
    """
    p = np.zeros((k + 1, vocab))
    q = np.zeros((k, vocab))
    p[0, :6] = [0.3, 0.25, 0.2, 0.15, 0.1 - 2e-6, 2e-6]
    q[0, :9] = [0.25, 0.2, 0.0, 0.15, 0.1, 0.1, 0.1, 0.05, 0.05]
    p[1, :] = [0.05, 0.05, 0.1, 0.1, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05 - 1e-6, 1e-6, 0.0]
    q[1, 2:8] = [0.25, 0.25, 0.2, 0.1, 0.1, 0.1]
    p[2, :] = np.linspace(1.0, 2.0, vocab)
    p[2] /= p[2].sum()
    q[2] = p[2]
    p[3, 7] = 1.0
    return Scenario(
        name="edges",
        target=to_float32_rows(p),
        draft=to_float32_rows(q),
        purpose="zeros on either side, tiny masses, p == q, one-hot bonus",
    )


STAT_SCENARIOS = {s.name: s for s in (balanced_scenario(), edge_scenario())}
