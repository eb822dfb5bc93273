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


#: Denominator of the dyadic probabilities of :func:`near_equal_scenario` (exact in float32).
DYADIC = 1 << 12


def _dyadic_row(probs: np.ndarray) -> np.ndarray:
    """Integer counts out of :data:`DYADIC`, each >= 1, summing exactly to it."""
    counts = np.maximum(np.round(probs * DYADIC).astype(np.int64), 1)
    counts[np.argmax(counts)] += DYADIC - counts.sum()
    return counts


def near_equal_scenario(seed: int = 2028, k: int = 3, vocab: int = 12, acceptance: float = 0.75) -> Scenario:
    """Rows where ``p ~ q``: where subtle verifier bugs live (a ratio rounded to 1, ``u <= p/q``,
    acceptance in low precision), at every position.

    Probabilities are multiples of 1/4096 (exact in float32). In each draft row three tokens have
    ``q == p`` exactly, every other token but two has ``q/p`` within 5% of 1 (both sides), and one
    the two likeliest tokens give mass to the least likely one (a large mismatch) so that the token-wise acceptance is ``acceptance`` and every stop
    position has mass >= 0.1.
    """
    rng = np.random.default_rng(seed)
    p_counts = np.stack([_dyadic_row(row) for row in peaked_rows(rng, k + 1, vocab, sharpness=1.0)])
    q_counts = np.empty((k, vocab), dtype=np.int64)
    for j in range(k):
        n = p_counts[j]
        order = rng.permutation(vocab)
        big = [int(t) for t in np.argsort(-n)[:2]]  # give mass: q < p there by a lot
        rest = [int(t) for t in order if t not in big]
        small = min(rest, key=lambda t: n[t])  # takes the mass: q > p there
        equal = [t for t in rest if t != small][:3]
        m = n.copy()
        for t in rest:
            if t not in equal and t != small:
                m[t] = n[t] + int(np.round(n[t] * rng.uniform(-0.05, 0.05)))
        deficit = int(np.round((1 - acceptance) * DYADIC)) - int(np.clip(n - m, 0, None).sum())
        share = int(np.round(deficit * n[big[0]] / (n[big[0]] + n[big[1]])))
        m[big[0]], m[big[1]] = n[big[0]] - share, n[big[1]] - (deficit - share)
        m[small] = DYADIC - (m.sum() - m[small])
        if min(m[big]) <= 0 or m[small] <= n[small]:
            raise ValueError("near_equal_scenario: the mismatch tokens cannot carry the requested acceptance")
        q_counts[j] = m
    return Scenario(
        name="near_equal",
        target=p_counts / DYADIC,
        draft=q_counts / DYADIC,
        purpose="p ~ q: ratios within 5% of 1 and p == q on three tokens per row, mass moved off the two likeliest tokens",
    )


def crossing_scenario(seed: int = 2029, k: int = 3, vocab: int = 8) -> Scenario:
    """Draft and target that disagree: independent ``Dirichlet(1)`` rows, so likelihood ratios fall on
    both sides of 1 and drafts are often accepted with a ratio well below 1.

    This is where verification schemes differ: block verification often stops carrying a weight
    ``w < 1`` and its residual ``[w p - q]_+`` is far from the token-wise ``[p - q]_+``. The first
    seed from ``seed`` at which every stop position has mass >= 0.1 under both token-wise and block
    verification is used (deterministic).
    """
    for attempt in range(1000):
        rng = np.random.default_rng(seed + attempt)
        p = to_float32_rows(dirichlet_rows(rng, k + 1, vocab, 1.0))
        q = to_float32_rows(dirichlet_rows(rng, k, vocab, 1.0))
        laws = (exact.length_law(p, q), exact.block_law(exact.SchemeSpec("block"), p, q).length)
        if all(law.min() >= 0.1 for law in laws):
            return Scenario(
                name="crossing",
                target=p,
                draft=q,
                purpose="draft and target disagree (independent rows): ratios on both sides of 1, every scheme stops everywhere",
            )
    raise RuntimeError("crossing_scenario: no seed gave every stop position mass >= 0.1")


STAT_SCENARIOS = {s.name: s for s in (balanced_scenario(), edge_scenario(), near_equal_scenario(), crossing_scenario())}

#: The highest per-row acceptance :func:`for_scheme` aims at for ``one_hot_draft`` (a row where
#: token-wise acceptance is 1, p == q, keeps its edge features rather than becoming one-hot).
ONE_HOT_MAX_ACCEPTANCE = 0.75


def _one_hot_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.dot(p, q))


def _concentrate(p: np.ndarray, q: np.ndarray, acceptance: float) -> tuple[np.ndarray, np.ndarray]:
    """``(1-l) onehot(c) + l row`` for both rows, ``c`` the likeliest token both give mass, with
    ``l`` found by bisection so that the one-hot-draft acceptance ``sum p q`` equals ``acceptance``.

    Zeros elsewhere, tiny masses and ``p == q`` survive (scaled by ``l``)."""
    both = (p > 0) & (q > 0)
    c = int(np.argmax(np.where(both, p * q, -1.0)))
    hot = np.zeros_like(p)
    hot[c] = 1.0
    mix = lambda row, lam: (1 - lam) * hot + lam * row  # noqa: E731
    if _one_hot_acceptance(p, q) >= acceptance:
        return p, q
    lo, hi = 0.0, 1.0  # acceptance falls from 1 (l = 0) to sum p q (l = 1)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _one_hot_acceptance(mix(p, mid), mix(q, mid)) > acceptance else (lo, mid)
    return mix(p, lo), mix(q, lo)


def for_scheme(scenario: Scenario, scheme: str) -> Scenario:
    """The scenario as the per-block checks use it for a backend declaring ``scheme``.

    ``token`` and ``block`` use it unchanged (every stop position keeps a mass >= 0.1 under both).
    ``one_hot_draft`` accepts only ``sum_x p(x) q(x)`` per draft, so on LM-like rows it almost never
    gets past position 0 and the later positions could not be tested; its rows are concentrated
    on a common token until each row's one-hot acceptance equals the token-wise acceptance the
    scenario was designed with (capped at :data:`ONE_HOT_MAX_ACCEPTANCE`): the same stop law, so the
    same power at every position, and the same edge features. Names are kept, so case ids are too.
    """
    if scheme != "one_hot_draft":
        return scenario
    token_acceptance = exact.acceptance_probs(scenario.target, scenario.draft)
    target, draft = scenario.target.copy(), scenario.draft.copy()
    for j, a in enumerate(token_acceptance):
        target[j], draft[j] = _concentrate(scenario.target[j], scenario.draft[j], min(a, ONE_HOT_MAX_ACCEPTANCE))
    return Scenario(
        name=scenario.name,
        target=to_float32_rows(target),
        draft=to_float32_rows(draft),
        purpose=scenario.purpose + "; rows concentrated so the one-hot-draft scheme reaches every position",
    )
