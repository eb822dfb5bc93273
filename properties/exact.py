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

from dataclasses import dataclass

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


# ----------------------------------------------------------------------------- every scheme
#
# The laws above are token-wise rejection sampling's, in closed form. The functions below give
# the same laws for every verification scheme a backend may declare, by enumerating the drafts:
# ``outcome_given_drafts`` states, for fixed drafts, where the block stops and what it emits there
# (one formula per scheme, written from the scheme's definition, independently of
# ``specdec_ref``); ``block_law`` averages it over the drafts' law.

#: Oracle schemes: the contract's exact schemes, plus ``typical`` (the reference lossy scheme,
#: Medusa's typical acceptance with thresholds ``epsilon``, ``delta``), whose law is known exactly
#: so that the lossy measurement can be calibrated against it.
ORACLE_SCHEMES = ("token", "one_hot_draft", "block", "typical")


@dataclass(frozen=True)
class SchemeSpec:
    """What the oracle needs to know about a verification scheme."""

    name: str = "token"
    bonus: bool = True
    epsilon: float = 0.09  # typical acceptance only
    delta: float = 0.3

    def __post_init__(self):
        if self.name not in ORACLE_SCHEMES:
            raise ValueError(f"no exact law for scheme {self.name!r}; known: {', '.join(ORACLE_SCHEMES)}")

    @property
    def label(self) -> str:
        return self.name + ("" if self.bonus else ", no bonus")


TOKEN = SchemeSpec()


def scheme_of(backend) -> SchemeSpec:
    """The oracle spec of a backend's declared scheme (``token`` for objects without capabilities)."""
    caps = getattr(backend, "capabilities", None)
    name = getattr(caps, "scheme", "token")
    if name == "lossy":
        raise ValueError("a backend declared 'lossy' has no exact per-block law")
    return SchemeSpec(name=name, bonus=bool(getattr(caps, "bonus", True)))


def _normalise_or(weights: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Rows of ``weights`` normalised; a row with no mass becomes the matching ``fallback`` row."""
    total = weights.sum(-1, keepdims=True)
    return np.where(total > 0, weights / np.where(total > 0, total, 1.0), fallback)


def outcome_given_drafts(scheme: SchemeSpec, p: np.ndarray, q: np.ndarray, drafts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For fixed drafts: ``stop[N, k+1]`` = P(m = j) and ``final[N, k+1, V]`` = law of the token
    emitted at position j given m = j (replacement, or the bonus at j = k).

    ``p[N, k+1, V]`` target rows, ``q[N, k, V]`` draft rows (row i judges ``drafts[:, i]``),
    ``drafts[N, k]`` with ``q(d) > 0``. Without a bonus, ``final[:, k]`` is all zero.
    """
    n, k = drafts.shape
    rows = np.arange(n)[:, None]
    pos = np.arange(k)[None, :]
    p_d = p[rows, pos, drafts]
    q_d = q[rows, pos, drafts]
    final = np.empty(p.shape)
    if scheme.name == "block":
        w = np.ones((n, k + 1))
        for i in range(k):
            w[:, i + 1] = np.minimum(1.0, w[:, i] * p_d[:, i] / q_d[:, i])
        residual = np.clip(w[:, :k, None] * p[:, :k] - q, 0.0, None)
        r = residual.sum(-1)
        den = r + 1.0 - w[:, :k]
        h = np.where(den > 0, r / np.where(den > 0, den, 1.0), 1.0)
        h[:, 0] = 1.0  # position 0 is the fallback when no later position is accepted
        h_all = np.concatenate([h, w[:, k:]], 1)  # h_0 (=1), h_1..h_{k-1}, h_k = w_k
        # P(tau = j) = h_j prod_{i > j} (1 - h_i): the largest accepted position wins
        later = np.cumprod((1.0 - h_all)[:, ::-1], 1)[:, ::-1]  # later[:, j] = prod_{i >= j} (1 - h_i)
        stop = h_all * np.concatenate([later[:, 1:], np.ones((n, 1))], 1)
        final[:, :k] = _normalise_or(residual, p[:, :k])
    else:
        if scheme.name == "token":
            accept = np.minimum(1.0, p_d / q_d)
            final[:, :k] = _normalise_or(np.clip(p[:, :k] - q, 0.0, None), p[:, :k])
        elif scheme.name == "one_hot_draft":
            accept = p_d
            removed = p[:, :k].copy()
            removed[rows, pos, drafts] = 0.0
            final[:, :k] = _normalise_or(removed, p[:, :k])
        else:  # typical
            entropy = -(p[:, :k] * np.log(np.where(p[:, :k] > 0, p[:, :k], 1.0))).sum(-1)
            accept = (p_d > np.minimum(scheme.epsilon, scheme.delta * np.exp(-entropy))).astype(np.float64)
            final[:, :k] = p[:, :k]
        reach = np.concatenate([np.ones((n, 1)), np.cumprod(accept, 1)], 1)
        stop = reach * np.concatenate([1.0 - accept, np.ones((n, 1))], 1)
    final[:, k] = p[:, k] if scheme.bonus else 0.0
    return stop, final


@dataclass(frozen=True)
class BlockLaw:
    """Exact laws of one block with fixed rows under one scheme (what the per-block checks test).

    ``length[j]`` = P(m = j); ``reach[j]`` = P(m >= j); ``steps[j]`` (j < k) = law of
    ``[stopped at j & emitted x (V), accepted d_{j+1} = x (V)]`` given m >= j; ``bonus`` = law of the
    bonus given m = k (``None`` without a bonus); ``emitted(j)``: token at position j given m >= j.
    """

    length: np.ndarray
    reach: np.ndarray
    steps: np.ndarray
    bonus: np.ndarray | None

    @property
    def k(self) -> int:
        return self.steps.shape[0]

    def emitted(self, j: int) -> np.ndarray:
        if j == self.k:
            if self.bonus is None:
                raise ValueError("no bonus token in this scheme")
            return self.bonus
        vocab = self.steps.shape[1] // 2
        return self.steps[j, :vocab] + self.steps[j, vocab:]

    def residual(self, j: int) -> np.ndarray:
        """Law of the replacement given m = j (j < k)."""
        vocab = self.steps.shape[1] // 2
        r = self.steps[j, :vocab]
        return r / r.sum() if r.sum() > 0 else r

    def mean_accepted(self) -> float:
        return float(np.dot(np.arange(self.length.size), self.length))


#: Draft vectors enumerated per chunk in :func:`block_law`.
ENUMERATION_CHUNK = 1 << 14


def _token_block_law(target: np.ndarray, draft: np.ndarray, bonus: bool) -> BlockLaw:
    k = draft.shape[0]
    steps = np.stack([step_law(target, draft, j) for j in range(k)])
    return BlockLaw(length_law(target, draft), reach_probs(target, draft), steps, emitted_law(target, k) if bonus else None)


def block_law(scheme: SchemeSpec, target: np.ndarray, draft: np.ndarray, *, enumerate_drafts: bool = False) -> BlockLaw:
    """Exact :class:`BlockLaw` of ``scheme`` for rows ``target[k+1, V]``, ``draft[k, V]`` (drafts ``d_{i+1} ~ q_i``).

    Token-wise in closed form (``enumerate_drafts=True`` forces the enumeration, to test one against
    the other); the other schemes by enumerating every draft vector of positive probability
    (chunked; ``prod_i |supp q_i|`` vectors).
    """
    p, q = _rows(target), _rows(draft)
    k, vocab = q.shape
    if scheme.name == "token" and not enumerate_drafts:
        return _token_block_law(p, q, scheme.bonus)
    supports = [np.flatnonzero(q[i] > 0) for i in range(k)]
    grids = np.stack(np.meshgrid(*supports, indexing="ij"), -1).reshape(-1, k)
    length = np.zeros(k + 1)
    joint = np.zeros((k, 2 * vocab))  # unnormalised [stop at j & emit x, accept d_{j+1} = x]
    bonus = np.zeros(vocab)
    for start in range(0, len(grids), ENUMERATION_CHUNK):
        drafts = grids[start : start + ENUMERATION_CHUNK]
        n = len(drafts)
        weight = np.prod(q[np.arange(k)[None, :], drafts], 1)
        stop, final = outcome_given_drafts(scheme, np.broadcast_to(p, (n, k + 1, vocab)), np.broadcast_to(q, (n, k, vocab)), drafts)
        length += weight @ stop
        beyond = np.cumsum(stop[:, ::-1], 1)[:, ::-1]  # beyond[:, j] = P(m >= j)
        for j in range(k):
            joint[j, :vocab] += (weight * stop[:, j]) @ final[:, j]
            joint[j, vocab:] += np.bincount(drafts[:, j], weights=weight * beyond[:, j + 1], minlength=vocab)
        bonus += (weight * stop[:, k]) @ final[:, k]
    reach = np.cumsum(length[::-1])[::-1]
    steps = joint / np.where(reach[:k, None] > 0, reach[:k, None], 1.0)
    bonus_law = bonus / length[k] if (scheme.bonus and length[k] > 0) else (p[k] if scheme.bonus else None)
    return BlockLaw(length, reach, steps, bonus_law)
