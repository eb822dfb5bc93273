"""Exact laws of a correct block verifier, for fixed target rows ``p[0..k]`` and draft rows ``q[0..k-1]``.

With ``d_{i+1} ~ q_i`` drawn independently and ``a_i = sum_x min(p_i(x), q_i(x))``:

* the block reaches position ``j`` (``d_1..d_j`` accepted) with probability ``prod_{i<j} a_i``;
* at a reached position ``j < k`` the pair (accepted?, emitted token) has law
  ``accepted & x: min(p_j, q_j)(x)`` and ``rejected & x: [p_j - q_j]_+(x)``;
  so the emitted token follows ``p_j`` and a replacement follows the normalised residual;
* the accepted length ``m`` has ``P(m = j) = prod_{i<j} a_i (1 - a_j)`` and ``P(m = k) = prod a_i``;
* the bonus (``m = k``) follows ``p_k``.

All arithmetic is float64 numpy; rows are renormalised in float64 first.
"""
from __future__ import annotations

import numpy as np


def _rows(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return p / p.sum(-1, keepdims=True)


def acceptance_probs(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``a_i = sum_x min(p_i, q_i)`` for i < k."""
    p, q = _rows(target), _rows(draft)
    k = q.shape[0]
    return np.minimum(p[:k], q).sum(-1)


def reach_probs(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``P(m >= j)`` for j = 0..k."""
    a = acceptance_probs(target, draft)
    return np.concatenate([[1.0], np.cumprod(a)])


def length_law(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``P(m = j)`` for j = 0..k."""
    a = acceptance_probs(target, draft)
    reach = reach_probs(target, draft)
    law = reach.copy()
    law[:-1] *= 1.0 - a
    return law


def step_law(target: np.ndarray, draft: np.ndarray, j: int) -> np.ndarray:
    """Law of (accepted?, token) at a reached position j < k: cells ``[rejected x, accepted x]`` (2V)."""
    p, q = _rows(target)[j], _rows(draft)[j]
    return np.concatenate([np.clip(p - q, 0.0, None), np.minimum(p, q)])


def residual_law(target: np.ndarray, draft: np.ndarray, j: int) -> np.ndarray:
    """Law of the replacement after a rejection at j: normalised ``[p_j - q_j]_+``."""
    p, q = _rows(target)[j], _rows(draft)[j]
    r = np.clip(p - q, 0.0, None)
    total = r.sum()
    return r / total if total > 0 else p


def emitted_law(target: np.ndarray, j: int) -> np.ndarray:
    """Law of the token emitted at position j given the block reached j: ``p_j``."""
    return _rows(target)[j]
