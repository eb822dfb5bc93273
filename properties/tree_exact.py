"""Exact (float64) laws of tree speculative verification, written from the tree verifier contract.

A tree is ``parents[n]`` (``-1``: a child of the root, the committed text; ``parents[i] < i``) and
``tokens[n]``; siblings are tried in index order. Target row ``p_rows[0]`` judges the root's
children, ``p_rows[i + 1]`` node ``i``'s children (and is the bonus row when ``i`` is a leaf);
draft row ``q_rows[i]`` is the row node ``i`` and its siblings were drawn from.

The walk (every exact scheme): stand at a node with residual ``r`` = its target row; try its children
``c_1..c_s`` in order, child ``j`` (token ``x``) accepted w.p. ``min(1, r_j(x) / q_j(x))``; on
acceptance move to it, on rejection ``r_{j+1} = norm([r_j - q_j]_+)`` (``r_j`` kept if that is all
zero); with no child left, the final token is a sample of ``r``. The schemes differ only in ``q_j``:

* ``specinfer``: ``q_j = q`` (siblings drawn i.i.d. from ``q``);
* ``recursive``: ``q_j`` = ``q`` without the earlier siblings' tokens, renormalised (siblings drawn
  without replacement);
* ``deterministic``: ``q_j`` = one-hot at ``x``: accepted w.p. ``r_j(x)``, a rejection removes ``x``
  from ``r`` (siblings are the draft row's top-k, in order);
* ``greedy``: ``deterministic`` on one-hot rows at ``argmax`` of the target rows (first maximal index):
  the first child carrying the argmax is accepted, the final token is the argmax.

Invariants (proved by ``tests/test_tree_exact.py`` for the formulas below):

* :func:`outcome_law` (the law of (end node, final token) given the tree) sums to 1;
* a chain reduces to the chain schemes: ``specinfer`` to ``token``, ``deterministic`` to
  ``one_hot_draft`` (:func:`specdec_properties.exact.outcome_given_drafts`);
* when the tree is drafted by the scheme's own protocol, every step of the walk is a lossless
  rejection step, so the tokens of a round follow the target and, round after round,
  :func:`tree_sequence_law` equals :func:`specdec_properties.markov.sequence_law` exactly, for every tree
  shape; ``specinfer`` judging trees drafted without replacement, or as the top-k, is not lossless
  (the check is not vacuous), while ``deterministic`` judging never reads ``q`` and stays lossless
  for siblings drawn by any protocol independent of the target;
* ``greedy`` is a point mass: the longest path of argmaxes, then the argmax of its last row.

All arithmetic is float64 numpy; rows are renormalised in float64 first.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .markov import MarkovPair

TREE_ORACLE_SCHEMES = ("specinfer", "recursive", "deterministic", "greedy")

#: How each scheme requires the siblings of a node to be drawn from the parent's draft row.
DRAFTING = {"specinfer": "specinfer", "recursive": "recursive", "deterministic": "deterministic", "greedy": "deterministic"}


# ----------------------------------------------------------------------------- tree shapes


def chain(n: int) -> np.ndarray:
    """``n`` nodes in a line: ``[-1, 0, 1, ..., n-2]``."""
    return np.arange(n) - 1


def star(n: int) -> np.ndarray:
    """``n`` children of the root."""
    return np.full(n, -1)


def kary(width: int, depth: int) -> np.ndarray:
    """Full ``width``-ary tree of ``depth`` levels below the root, in BFS order."""
    return _levels(width, depth, grow=None)


def eagle_like(width: int, depth: int) -> np.ndarray:
    """EAGLE-style tree in BFS order: ``width`` root children; on each further level the first
    ``width`` nodes of the previous level get ``width`` children each."""
    return _levels(width, depth, grow=width)


def _levels(width: int, depth: int, grow: int | None) -> np.ndarray:
    """BFS tree: each level gives ``width`` children to the first ``grow`` nodes of the previous one (all if None)."""
    parents: list[int] = []
    previous = [-1]
    for _ in range(depth):
        level = []
        for node in previous[:grow]:
            for _ in range(width):
                parents.append(node)
                level.append(len(parents) - 1)
        previous = level
    return np.array(parents, dtype=np.int64)


_SHAPES = {"chain": chain, "star": star, "kary": kary, "eagle_like": eagle_like}


def tree_shape(name: str, **kw) -> np.ndarray:
    """A standard shape by name: ``chain(n)``, ``star(n)``, ``kary(width, depth)``, ``eagle_like(width, depth)``."""
    if name not in _SHAPES:
        raise ValueError(f"unknown tree shape {name!r}; known: {', '.join(_SHAPES)}")
    return _SHAPES[name](**kw)


# ----------------------------------------------------------------------------- tree structure


def _check_parents(parents) -> np.ndarray:
    parents = np.asarray(parents, dtype=np.int64).reshape(-1)
    if np.any(parents < -1) or np.any(parents >= np.arange(parents.size)):
        raise ValueError(f"parents must satisfy -1 <= parents[i] < i, got {parents.tolist()}")
    return parents


def children_of(parents) -> dict[int, list[int]]:
    """``{node: [children in index order]}`` for every node and the root (``-1``)."""
    parents = _check_parents(parents)
    children: dict[int, list[int]] = {node: [] for node in range(-1, parents.size)}
    for i, parent in enumerate(parents):
        children[int(parent)].append(i)
    return children


def path_to(parents, node: int) -> list[int]:
    """Node indices from the root's child down to ``node`` (``[]`` for the root, ``-1``)."""
    parents = _check_parents(parents)
    path = []
    while node != -1:
        path.append(int(node))
        node = int(parents[node])
    return path[::-1]


def depths(parents) -> np.ndarray:
    """Depth of every node (a root child has depth 1)."""
    parents = _check_parents(parents)
    depth = np.zeros(parents.size, dtype=np.int64)
    for i, parent in enumerate(parents):
        depth[i] = 1 + (depth[parent] if parent >= 0 else 0)
    return depth


def _shape_key(parents) -> tuple:
    """The root's subtree as nested tuples (a node = the tuple of its children's subtrees)."""
    children = children_of(parents)

    def subtree(node: int) -> tuple:
        return tuple(subtree(c) for c in children[node])

    return subtree(-1)


# ----------------------------------------------------------------------------- one step of the walk


def _rows(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return p / p.sum(-1, keepdims=True)


def _one_hot(x: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab)
    row[x] = 1.0
    return row


def _greedy_rows(p: np.ndarray) -> np.ndarray:
    """One-hot rows at each row's argmax (first maximal index)."""
    return np.eye(p.shape[-1])[np.argmax(p, -1)]


def _without(q: np.ndarray, removed) -> np.ndarray:
    """``q`` with the tokens ``removed`` taken out, renormalised (ValueError when nothing is left)."""
    rest = q.copy()
    rest[list(removed)] = 0.0
    total = rest.sum()
    if total <= 0:
        raise ValueError("the earlier siblings exhaust the draft row's support: no tree can be drawn without replacement")
    return rest / total


def _judge_row(judge: str, q: np.ndarray | None, earlier, x: int, vocab: int) -> np.ndarray:
    """``q_j``: the row the walk compares child token ``x`` against, after earlier siblings' tokens ``earlier``."""
    if judge == "specinfer":
        return q
    if judge == "recursive":
        return _without(q, earlier)
    return _one_hot(x, vocab)  # deterministic (and greedy, on one-hot target rows)


def _try(r: np.ndarray, q_j: np.ndarray, x: int) -> tuple[float, np.ndarray]:
    """Try token ``x`` against residual ``r``: (acceptance probability, residual after a rejection)."""
    if q_j[x] <= 0:
        raise ValueError(f"token {x} has zero probability under the row it is judged against")
    accept = min(1.0, r[x] / q_j[x])
    residual = np.clip(r - q_j, 0.0, None)
    total = residual.sum()
    return accept, (residual / total if total > 0 else r)


def _drafting_row(protocol: str, q: np.ndarray, earlier, j: int) -> np.ndarray:
    """Law of sibling ``j``'s token given the earlier siblings' tokens, under a drafting protocol.

    ``deterministic``: the ``j``-th token of ``argsort(-q, kind="stable")`` (ties to the lower id);
    zero-probability tokens are drafted when there are more siblings than the support.
    """
    if protocol == "specinfer":
        return q
    if protocol == "recursive":
        return _without(q, earlier)
    return _one_hot(int(np.argsort(-q, kind="stable")[j]), q.size)


def _check_scheme(scheme: str) -> None:
    if scheme not in TREE_ORACLE_SCHEMES:
        raise ValueError(f"no exact tree law for scheme {scheme!r}; known: {', '.join(TREE_ORACLE_SCHEMES)}")


# ----------------------------------------------------------------------------- given the tree


def outcome_law(scheme: str, parents, tokens, p_rows, q_rows=None) -> np.ndarray:
    """Exact law ``[n+1, V]`` of (end, final token) given the tree: end 0 = nothing accepted,
    end ``i + 1`` = the walk ended at node ``i`` (``path_to(parents, i)`` accepted)."""
    _check_scheme(scheme)
    children = children_of(parents)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    p = _rows(p_rows)
    n, vocab = tokens.size, p.shape[-1]
    if p.shape != (n + 1, vocab):
        raise ValueError(f"p_rows must be [{n + 1}, V], got {p.shape}")
    if np.any(tokens < 0) or np.any(tokens >= vocab):
        raise ValueError(f"tokens must lie in [0, {vocab}), got {tokens.tolist()}")
    judge = scheme
    if scheme == "greedy":
        p, judge = _greedy_rows(p), "deterministic"
    q = None
    if judge in ("specinfer", "recursive"):
        if q_rows is None:
            raise ValueError(f"scheme {scheme!r} needs q_rows")
        q = _rows(q_rows)
    out = np.zeros((n + 1, vocab))

    def walk(node: int, mass: float) -> None:
        r, earlier = p[node + 1], []
        for c in children[node]:
            x = int(tokens[c])
            accept, residual = _try(r, _judge_row(judge, None if q is None else q[c], earlier, x, vocab), x)
            if mass * accept > 0:
                walk(c, mass * accept)
            mass *= 1.0 - accept
            r = residual
            earlier.append(x)
        out[node + 1] += mass * r

    walk(-1, 1.0)
    return out


# ----------------------------------------------------------------------------- marginalised over the drafting


class _RoundLaws:
    """Laws of one round on Markov tables, marginalised over the drafting, memoised per (subtree, token, budget).

    Below a node carrying token ``a`` the round depends only on ``a`` and the subtree's shape, so
    :meth:`law` is computed once per (shape, ``a``, budget). ``budget`` keeps the first ``budget``
    emitted tokens (``None``: all). With ``count_only`` the outcome is the accepted length instead
    of the emitted tokens.
    """

    def __init__(self, scheme: str, pair: MarkovPair, *, drafting: str | None = None, count_only: bool = False):
        _check_scheme(scheme)
        self.drafting = DRAFTING[scheme] if drafting is None else drafting
        if self.drafting not in ("specinfer", "recursive", "deterministic"):
            raise ValueError(f"unknown drafting protocol {self.drafting!r}")
        self.judge = "deterministic" if scheme == "greedy" else scheme
        self.target = _greedy_rows(_rows(pair.target)) if scheme == "greedy" else _rows(pair.target)
        self.draft = _rows(pair.draft)
        self.count_only = count_only
        # only without-replacement drafting or judging depends on which tokens earlier siblings carry
        self.remember = "recursive" in (self.judge, self.drafting)
        self.memo: dict = {}

    def _final(self, y: int):
        return 0 if self.count_only else (y,)

    def _extend(self, x: int, rest):
        return rest + 1 if self.count_only else (x,) + rest

    def law(self, shape: tuple, a: int, budget: int | None) -> dict:
        """Law of the outcome of the walk from a node with token ``a`` and subtree ``shape``."""
        key = (shape, a, budget)
        if key not in self.memo:
            self.memo[key] = {(): 1.0} if budget == 0 else self._walk(shape, a, budget)
        return self.memo[key]

    def _walk(self, shape: tuple, a: int, budget: int | None) -> dict:
        p, q = self.target[a], self.draft[a]
        vocab = p.size
        if self.drafting == "deterministic" and len(shape) > vocab:
            raise ValueError(f"{len(shape)} siblings of distinct tokens need a vocabulary of at least {len(shape)}")
        out: dict = defaultdict(float)
        # the rejected histories so far: (earlier tokens kept, residual) -> [mass, residual, earlier]
        frontier = {((), p.tobytes()): [1.0, p, ()]}
        for j, child in enumerate(shape):
            accepted = np.zeros(vocab)  # mass of "sibling j carries x and is accepted"
            rejected: dict = {}
            for mass, r, earlier in frontier.values():
                draw = _drafting_row(self.drafting, q, earlier, j)
                for x in map(int, np.flatnonzero(draw > 0)):
                    accept, residual = _try(r, _judge_row(self.judge, q, earlier, x, vocab), x)
                    accepted[x] += mass * draw[x] * accept
                    if accept < 1.0:
                        kept = tuple(sorted(earlier + (x,))) if self.remember else ()
                        entry = rejected.setdefault((kept, residual.tobytes()), [0.0, residual, kept])
                        entry[0] += mass * draw[x] * (1.0 - accept)
            for x in map(int, np.flatnonzero(accepted > 0)):
                below = self.law(child, x, None if budget is None else budget - 1)
                for rest, prob in below.items():
                    out[self._extend(x, rest)] += accepted[x] * prob
            frontier = rejected
        for mass, r, _ in frontier.values():
            for y in map(int, np.flatnonzero(r > 0)):
                out[self._final(y)] += mass * r[y]
        return dict(out)


def tree_round_law(scheme: str, parents, pair: MarkovPair, start: int, *, max_tokens: int | None = None,
                   drafting: str | None = None) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one round emits from last token ``start`` (accepted path, then the
    final token), the tree of shape ``parents`` drafted by the scheme's protocol (:data:`DRAFTING`).

    ``max_tokens`` keeps only the first ``max_tokens`` emitted tokens (the full law of a deep tree
    has up to ``V^(depth+1)`` cells). ``drafting`` overrides the protocol: a mismatched protocol is
    not lossless (for non-vacuity checks).
    """
    return _RoundLaws(scheme, pair, drafting=drafting).law(_shape_key(parents), int(start), max_tokens)


def tree_sequence_law(scheme: str, parents, pair: MarkovPair, length: int, *, drafting: str | None = None) -> np.ndarray:
    """Exact float64 law of the first ``length`` tokens decoded round after round with the tree
    ``parents`` (each round from the last emitted token); cells as :func:`specdec_properties.markov.sequence_law`."""
    vocab = pair.vocab
    laws = _RoundLaws(scheme, pair, drafting=drafting)
    shape = _shape_key(parents)
    memo: dict[tuple[int, int], np.ndarray] = {}

    def law_after(last: int, r: int) -> np.ndarray:
        """Law over ``vocab**r`` of the next ``r`` tokens after token ``last``."""
        if (last, r) not in memo:
            out = np.zeros(vocab**r)
            for head, mass in laws.law(shape, last, r).items():
                index = 0
                for t in head:
                    index = index * vocab + t
                rest = r - len(head)
                block = slice(index * vocab**rest, (index + 1) * vocab**rest)
                out[block] += mass * (law_after(head[-1], rest) if rest else 1.0)
            memo[(last, r)] = out
        return memo[(last, r)]

    return law_after(int(pair.start), length)


def tree_accepted_moments(scheme: str, parents, pair: MarkovPair) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of the accepted path length of one round, from each start token: two ``[V]``."""
    laws = _RoundLaws(scheme, pair, count_only=True)
    shape = _shape_key(parents)
    mean, var = np.empty(pair.vocab), np.empty(pair.vocab)
    for a in range(pair.vocab):
        law = laws.law(shape, a, None)
        m = np.array(list(law), dtype=np.float64)
        w = np.array(list(law.values()))
        mean[a] = w @ m
        var[a] = w @ m**2 - mean[a] ** 2
    return mean, var


def tree_tokens_per_round(scheme: str, parents, pair: MarkovPair) -> np.ndarray:
    """Exact expected tokens emitted by one round (accepted + 1) from each start token: ``[V]``."""
    return tree_accepted_moments(scheme, parents, pair)[0] + 1.0
