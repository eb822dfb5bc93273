"""Tree verification: one target forward judges a whole tree of drafts; one root-to-node path is kept.

Shapes and semantics are the tree verifier contract (:class:`specdec_ref.contract.TreeVerifier`): node ``i`` has
token ``draft_tokens[b, i]`` under ``parents[b, i]`` (``-1``: the root), nodes topologically
ordered, padded nodes (token ``-1``) at the end; ``target_probs[b, 0]`` judges the root's
children, ``target_probs[b, i + 1]`` node ``i``'s children; ``draft_probs[b, i]`` is the draft row
node ``i`` and its siblings were drawn from.

One walk down the tree, written as a single pass over the nodes in index order (so it needs no
host synchronisation and no data-dependent Python branching; every step is a ``[B, V]`` tensor op):
the walk stands at a node (``current``, the root first) with a residual ``r`` (the target row of
that node at first). A node is *tried* when its parent is ``current``; siblings are therefore tried
in index order, and a node whose parent was rejected or never reached is never tried. A tried node
with token ``x`` and sibling draft row ``q_j`` is accepted when ``u * q_j(x) < r(x)``
(probability ``min(1, r(x) / q_j(x))``); the walk then moves to it and ``r`` becomes its target row.
Otherwise ``r`` becomes ``norm([r - q_j]_+)``. After the last node the final token is a sample of
``r``: the residual when every child of the last accepted node was rejected, its own target row
(the bonus) when it is a leaf. Invariant: given the tree, the final token and each acceptance have
the scheme's law; with siblings drafted as the scheme requires, the emitted text follows the
target's law exactly (proved by enumeration in ``tests/test_tree.py``).

The schemes differ only in ``q_j``, the distribution the ``j``-th sibling was actually drawn from:

* :class:`SpecInferTreeVerifier` (``specinfer``): siblings drawn independently from ``q``;
  ``q_j = q``. Multi-step speculative sampling: Miao et al., "SpecInfer: accelerating large
  language model serving with tree-based speculative inference and verification", ASPLOS 2024.
* :class:`RecursiveTreeVerifier` (``recursive``): siblings drawn without replacement; ``q_j`` is
  ``q`` with the earlier siblings removed, renormalised. Recursive rejection sampling: Jeon et al.,
  "Recursive speculative decoding: accelerating LLM inference via sampling without replacement",
  2024 (arXiv 2402.14160).
* :class:`DeterministicTreeVerifier` (``deterministic``): siblings are fixed distinct tokens (the
  draft's top-k); ``q_j`` is one-hot at the sibling's token, so it is accepted with probability
  ``r(x)`` and ``r`` loses ``x`` on rejection. What SGLang's ``tree_speculative_sampling_target_only``
  computes at thresholds 1, 1; exact for any tree that does not depend on the coins.

Greedy (``draft_probs=None``, every class): the walk accepts a tried node whose token is the greedy
choice (``argmax``, first maximal index) of ``current``'s target row, and emits the greedy choice of
the last accepted node's row: the longest greedy path in the tree (EAGLE, Li et al. 2024).

Computation is in float32 whatever the input dtype, on the input's device.
"""
from __future__ import annotations

import math

from typing import NamedTuple

import torch

from .contract import PAD_TOKEN
from .rng import check_generators, exponential_like, is_per_row, uniform
from .validate import check_probs
from .verify import RESIDUAL_EPS, race_winner, sample_from_weights

__all__ = [
    "TreeResult",
    "TreeVerifierBase",
    "SpecInferTreeVerifier",
    "RecursiveTreeVerifier",
    "DeterministicTreeVerifier",
    "TREE_VERIFIERS",
    "chain_parents",
    "validate_tree_inputs",
]


class TreeResult(NamedTuple):
    """``verify_tree``'s output: accepted length, accepted nodes (``-1`` padded), accepted tokens then the final one."""

    num_accepted: torch.Tensor  # Long[B]
    path: torch.Tensor  # Long[B, n]
    tokens: torch.Tensor  # Long[B, n + 1]


def chain_parents(batch: int, n: int, device=None) -> torch.Tensor:
    """``parents`` of a chain of ``n`` drafts (``[-1, 0, 1, ..., n-2]`` per row): a chain verifier's block."""
    return (torch.arange(n, device=device) - 1).expand(batch, n).clone()


def validate_tree_inputs(
    draft_tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> None:
    """``ValueError`` naming the argument for wrong shapes or dtypes, parents that are not a topologically
    ordered forest, padding before a real node, token ids outside ``[0, V)``, vocabulary mismatch, or
    invalid probability rows of real nodes (padded nodes' rows are not read)."""
    for name, value in (("draft_tokens", draft_tokens), ("parents", parents), ("target_probs", target_probs)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in (("draft_tokens", draft_tokens), ("parents", parents)):
        if value.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name} must be an integer tensor (int64 or int32), got dtype {value.dtype}")
        if value.dim() != 2:
            raise ValueError(f"{name} must have shape [B, n], got {tuple(value.shape)}")
    batch, n = draft_tokens.shape
    if batch < 1 or n < 1:
        raise ValueError(f"draft_tokens must have B >= 1 rows and n >= 1 nodes, got shape {tuple(draft_tokens.shape)}")
    if tuple(parents.shape) != (batch, n):
        raise ValueError(f"parents must have the shape of draft_tokens {(batch, n)}, got {tuple(parents.shape)}")
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (batch, n + 1):
        raise ValueError(f"target_probs must have shape [B, n+1, V] = [{batch}, {n + 1}, V], got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[-1]
    if vocab < 1:
        raise ValueError("target_probs has an empty vocabulary (V = 0)")
    for name, value in (("draft_tokens", draft_tokens), ("parents", parents)):
        if value.device != target_probs.device:
            raise ValueError(f"{name} is on {value.device}, target_probs on {target_probs.device}")
    real = draft_tokens >= 0
    late = real[:, 1:] & ~real[:, :-1]
    if bool(late.any()):
        b, i = late.nonzero()[0].tolist()
        raise ValueError(f"padding must come last: row {b} has a padded node {i} before the real node {i + 1}")
    if not bool(real[:, 0].all()):
        b = int((~real[:, 0]).nonzero()[0])
        raise ValueError(f"row {b} has no real node (draft_tokens[{b}, 0] = {int(draft_tokens[b, 0])}); every row needs n >= 1 nodes")
    bad = (draft_tokens < PAD_TOKEN) | (draft_tokens >= vocab)
    if bool(bad.any()):
        b, i = bad.nonzero()[0].tolist()
        raise ValueError(f"draft_tokens must be in [0, {vocab}) (or -1 for padding); draft_tokens[{b}, {i}] = {int(draft_tokens[b, i])}")
    index = torch.arange(n, device=parents.device)
    unordered = real & ((parents < -1) | (parents >= index))
    if bool(unordered.any()):
        b, i = unordered.nonzero()[0].tolist()
        raise ValueError(
            f"parents must be topologically ordered (-1 <= parents[b, i] < i): parents[{b}, {i}] = {int(parents[b, i])}"
        )
    padded = not bool(real.all())  # unpadded trees (the usual case) are checked in place, without gathering the real rows
    real_rows = torch.cat([torch.ones_like(real[:, :1]), real], 1)
    if padded:
        check_probs("target_probs", target_probs[real_rows], (int(real_rows.sum()), vocab))
    else:
        check_probs("target_probs", target_probs.reshape(-1, vocab), (batch * (n + 1), vocab))
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor):
            raise ValueError(f"draft_probs must be a torch.Tensor or None, got {type(draft_probs).__name__}")
        if draft_probs.dim() == 3 and draft_probs.shape[-1] != vocab:
            raise ValueError(f"vocabulary mismatch: draft_probs has V={draft_probs.shape[-1]}, target_probs has V={vocab}")
        if tuple(draft_probs.shape) != (batch, n, vocab):
            raise ValueError(f"draft_probs must have shape [B, n, V] = {(batch, n, vocab)}, got {tuple(draft_probs.shape)}")
        if draft_probs.device != target_probs.device:
            raise ValueError(f"draft_probs is on {draft_probs.device}, target_probs on {target_probs.device}")
        if padded:
            check_probs("draft_probs", draft_probs[real], (int(real.sum()), vocab))
        else:
            check_probs("draft_probs", draft_probs.reshape(-1, vocab), (batch * n, vocab))


class TreeVerifierBase:
    """The walk of the module docstring, one overridable decision per method (a mutant is a one-method subclass).

    Subclasses set ``tree_scheme`` and :meth:`sibling_row`.
    """

    tree_scheme = ""
    #: Whether :meth:`sibling_row` reads the earlier siblings' tokens (``drawn``); the walk tracks them only then.
    uses_drawn = False

    def coins(self, parents: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One independent uniform per node: ``u[B, n]``."""
        return uniform(tuple(parents.shape), generator, parents.device)

    def tried(self, parents_i: torch.Tensor, current: torch.Tensor, real_i: torch.Tensor) -> torch.Tensor:
        """Node ``i`` is tried when it is real and its parent is the node the walk stands at."""
        return real_i & (parents_i == current)

    def sibling_row(self, q: torch.Tensor, token: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
        """``q_j``: the distribution the tried sibling was drawn from (``drawn``: its earlier siblings' tokens, one-hot sum)."""
        raise NotImplementedError

    def accept(self, u: torch.Tensor, r_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
        """Accept with probability ``min(1, r(x) / q_j(x))``, written without a division."""
        return u * q_x < r_x

    def after_rejection(self, r: torch.Tensor, q_j: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The next sibling's residual: ``norm([r - q_j]_+)`` (``r`` itself if that is empty, i.e. ``r == q_j``)."""
        residual = (r - q_j).clamp_min(0)
        total = residual.sum(-1, keepdim=True)
        return torch.where(total > RESIDUAL_EPS, residual / total.clamp_min(RESIDUAL_EPS), r)

    def node_row(self, p: torch.Tensor, i: int, parents: torch.Tensor) -> torch.Tensor:
        """The target row after node ``i``'s path: ``target_probs[:, i + 1]``."""
        return p[:, i + 1]

    def greedy_choice(self, probs: torch.Tensor) -> torch.Tensor:
        return probs.argmax(-1)

    def sample(self, weights: torch.Tensor, generator, race: torch.Tensor | None = None) -> torch.Tensor:
        """A sample of ``weights``; ``race``: the row's Exp(1) draws when they were drawn ahead (per-row generators)."""
        return sample_from_weights(weights, generator) if race is None else race_winner(weights, race)

    def assemble(self, draft_tokens: torch.Tensor, path: torch.Tensor, m: torch.Tensor, final: torch.Tensor) -> TreeResult:
        """``tokens[:m]`` = the path's tokens, ``tokens[m]`` = final, ``-1`` after."""
        batch, n = draft_tokens.shape
        on_path = draft_tokens.gather(1, path.clamp_min(0))
        positions = torch.arange(n + 1, device=draft_tokens.device)
        tokens = torch.where(positions[:n] < m[:, None], on_path, PAD_TOKEN)
        tokens = torch.cat([tokens, tokens.new_full((batch, 1), PAD_TOKEN)], 1)
        return TreeResult(m, path, tokens.scatter_(1, m[:, None], final[:, None]))

    def walk(self, draft_tokens, parents, draft_probs, target_probs, generator):
        """The single pass over the nodes; ``draft_probs is None`` walks the greedy path."""
        batch, n = draft_tokens.shape
        device = target_probs.device
        greedy = draft_probs is None
        p = target_probs.to(torch.float32)
        if greedy and n and self._greedy_steps_are_the_reference():
            return self._greedy_path(draft_tokens, parents, p)
        q = None if greedy else draft_probs.to(torch.float32)
        real = draft_tokens >= 0
        tokens = draft_tokens.clamp_min(0)
        current = torch.full((batch,), -1, dtype=torch.long, device=device)
        r = p[:, 0]
        drawn = torch.zeros_like(r)
        # Per-row generators: each row's final-sample draws come first, then its coins, so the trailing coins of
        # padding never shift a row's draws: a row reproduces alone or padded in any ragged batch.
        race = exponential_like(r, generator) if not greedy and is_per_row(generator) else None
        u = None if greedy else self.coins(parents, generator)
        # every node's columns as views, split once (the loop then issues only the walk's own ops)
        xs, x_index, parent_of, real_at = tokens.unbind(1), tokens.split(1, 1), parents.unbind(1), real.unbind(1)
        u_at, q_at = (None, None) if greedy else (u.unbind(1), q.unbind(1))
        accepted_at = []
        for i in range(n):
            x = xs[i]
            tried = self.tried(parent_of[i], current, real_at[i])
            if greedy:
                accepted = tried & (x == self.greedy_choice(r))
            else:
                q_j = self.sibling_row(q_at[i], x, drawn)
                r_x = r.gather(1, x_index[i]).squeeze(1)
                q_x = q_j.gather(1, x_index[i]).squeeze(1)
                accepted = tried & self.accept(u_at[i], r_x, q_x)
                rejected = tried & ~accepted
                r = torch.where(rejected[:, None], self.after_rejection(r, q_j, x), r)
                if self.uses_drawn:
                    seen = torch.nn.functional.one_hot(x, r.shape[-1]).to(drawn.dtype)
                    drawn = torch.where(accepted[:, None], 0.0, torch.where(rejected[:, None], drawn + seen, drawn))
            r = torch.where(accepted[:, None], self.node_row(p, i, parents), r)
            current = torch.where(accepted, i, current)
            accepted_at.append(accepted)
        m, path = _accepted_path(accepted_at, batch, n, device)
        final = self.greedy_choice(r) if greedy else self.sample(r, generator, race)
        return self.assemble(draft_tokens.long(), path, m, final)

    def _greedy_steps_are_the_reference(self) -> bool:
        """Whether the greedy walk's decisions are this module's own (a mutant overriding one walks node by node)."""
        cls = type(self)
        return all(getattr(cls, name) is getattr(TreeVerifierBase, name) for name in ("tried", "node_row", "greedy_choice"))

    def _greedy_path(self, draft_tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor) -> TreeResult:
        """The greedy walk without the loop over nodes, node for node the same result: node ``i`` is accepted iff every
        node on its path (itself included) is real, its token is the greedy choice of its parent's row (row 0 for the
        root's children) and no earlier sibling is (the walk tries siblings in index order and moves to the first that
        matches). "Every node on its path" is an AND along the parent pointers, by pointer doubling: after ``t`` steps
        each node holds the AND over itself and its ``2^t - 1`` nearest ancestors (a root column, true and its own
        parent, ends every chain); ``ceil(log2(n + 1))`` steps cover any depth (no host synchronisation, the step count
        comes from the shape)."""
        batch, n = draft_tokens.shape
        device = p.device
        choice = p.argmax(-1)  # [B, n + 1]: the greedy choice of every row (row i + 1: after node i's path)
        slot = parents + 1  # the parent's row (0: the root's)
        match = (draft_tokens == choice.gather(1, slot)) & (draft_tokens >= 0)
        index = torch.arange(n, device=device).expand(batch, n)
        first = torch.full((batch, n + 1), n, dtype=torch.long, device=device)  # per parent: its first matching child
        first.scatter_reduce_(1, slot, torch.where(match, index, n), "amin")
        # column n stands for the root: always true, its own parent, so that every pointer ends there
        ok = torch.cat([match & (index == first.gather(1, slot)), match.new_ones(batch, 1)], 1)
        up = torch.cat([torch.where(parents < 0, n, parents), index.new_full((batch, 1), n)], 1)
        for _ in range(max(1, math.ceil(math.log2(n + 1)))):
            ok = ok & ok.gather(1, up)
            up = up.gather(1, up)
        m, path = _path_of(ok[:, :n], n, device)
        last = path.gather(1, (m - 1).clamp_min(0)[:, None]).squeeze(1)
        final = choice.gather(1, torch.where(m > 0, last + 1, 0)[:, None]).squeeze(1)
        return self.assemble(draft_tokens.long(), path, m, final)

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        parents: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        validate: bool = True,
    ) -> TreeResult:
        """Verify one tree per row; ``draft_probs=None`` selects greedy verification.

        ``validate=False`` skips the input checks (which synchronise with the host).
        """
        check_generators(generator, draft_tokens.shape[0])
        if validate:
            validate_tree_inputs(draft_tokens, parents, draft_probs, target_probs)
        return self.walk(draft_tokens.long(), parents.long(), draft_probs, target_probs, generator)


def _accepted_path(accepted_at: list[torch.Tensor], batch: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m [B], path [B, n])`` from each node's acceptance flags (``accepted_at[i]``: Bool ``[B]``): the accepted nodes
    in index order (the walk accepts at most one node per depth, parents first), ``PAD_TOKEN`` after the ``m``-th."""
    if not n:
        return torch.zeros(batch, dtype=torch.long, device=device), torch.full((batch, 0), PAD_TOKEN, dtype=torch.long, device=device)
    return _path_of(torch.stack(accepted_at, 1), n, device)


def _path_of(accepted: torch.Tensor, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_accepted_path` from the flags as one Bool ``[B, n]``."""
    order = torch.where(accepted, torch.arange(n, device=device), n).sort(1).values
    return accepted.sum(1), order.masked_fill_(order == n, PAD_TOKEN)


class SpecInferTreeVerifier(TreeVerifierBase):
    """Siblings drawn independently (with replacement) from the parent's draft row: ``q_j = q``
    (SpecInfer's multi-step speculative sampling, Miao et al. 2024, Algorithm 2)."""

    tree_scheme = "specinfer"

    def sibling_row(self, q, token, drawn):
        return q


class RecursiveTreeVerifier(TreeVerifierBase):
    """Siblings drawn without replacement: ``q_j`` = ``q`` without the earlier siblings, renormalised
    (recursive rejection sampling, Jeon et al. 2024, arXiv 2402.14160)."""

    tree_scheme = "recursive"
    uses_drawn = True

    def sibling_row(self, q, token, drawn):
        left = q * (drawn == 0)
        total = left.sum(-1, keepdim=True)
        return torch.where(total > 0, left / total.clamp_min(torch.finfo(q.dtype).tiny), q)


class DeterministicTreeVerifier(TreeVerifierBase):
    """Siblings are fixed distinct tokens (e.g. the draft's top-k): ``q_j`` is one-hot at the sibling's
    token, accepted with probability ``r(x)`` (sequential one-hot-draft acceptance; SGLang's tree
    kernel at thresholds 1, 1). The draft rows are not read."""

    tree_scheme = "deterministic"

    def sibling_row(self, q, token, drawn):
        return torch.nn.functional.one_hot(token, q.shape[-1]).to(q.dtype)


#: One reference verifier per exact tree scheme.
TREE_VERIFIERS = {
    cls.tree_scheme: cls for cls in (SpecInferTreeVerifier, RecursiveTreeVerifier, DeterministicTreeVerifier)
}
