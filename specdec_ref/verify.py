"""Block verification: greedy and distribution-exact rejection sampling.

Invariant (sampling): for fixed rows, the token emitted at position ``j`` given
that ``d_1..d_j`` were accepted is distributed as ``target_probs[:, j]``;
acceptance of ``d_{j+1}`` happens with probability ``min(1, p(d)/q(d))``
and a rejection emits a sample of ``[p_j - q_j]_+`` normalised. The row ``k``
bonus is the residual of ``p_k`` against an all-zero draft row.

Invariant (greedy): ``m`` is the length of the longest prefix of drafts equal
to ``argmax`` of their rows; the emitted token is ``argmax`` of row ``m``.

The whole computation stays on the input's device with no host
synchronisation: no ``.item()``, no data-dependent Python branching. It runs in
float32 whatever the input dtype. See :meth:`specdec_ref.contract.Verifier.verify` for shapes.
"""
from __future__ import annotations

import torch

from .contract import PAD_TOKEN
from .rng import Generators, check_generators, exponential_like, uniform
from .validate import validate_verify_inputs

#: A residual whose total mass is at or below this is treated as empty (p == q
#: on that row up to rounding); the emitted token is then drawn from p itself.
RESIDUAL_EPS = 1e-12


def sample_from_weights(weights: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One index per row of ``weights[..., V]`` with probability ``w_i / sum(w)``.

    The exponential race ``argmax(w_i / E_i)``, ``E_i ~ Exp(1)``, is exact and
    needs neither a cumulative sum nor a host sync; a zero weight can never win
    (``E`` is clamped away from 0 so that ``0 / E`` is never NaN).
    """
    return race_winner(weights, exponential_like(weights, generator))


def race_winner(weights: torch.Tensor, race: torch.Tensor) -> torch.Tensor:
    """``argmax(w / E)`` per row for given ``Exp(1)`` draws ``race`` (the second half of :func:`sample_from_weights`)."""
    return (weights / race.clamp_min(1e-30)).argmax(-1)


def rows_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b]]`` for every row ``b`` of ``x [B, n, V]`` (``[B, V]``); a batch expanded from one block (stride
    0) is read as that block's rows, the same values without indexing the broadcast batch."""
    if x.stride(0) == 0 and x.shape[0]:
        return x[0].index_select(0, index)
    return x[torch.arange(x.shape[0], device=x.device), index]


def _first_false(flags: torch.Tensor) -> torch.Tensor:
    """Index of the first False in each row of ``flags[B, k]``, or k if none."""
    stop = torch.zeros(flags.shape[0], 1, dtype=torch.uint8, device=flags.device)
    return torch.cat([flags.to(torch.uint8), stop], dim=1).argmin(dim=1)


class BlockVerifier:
    """The reference verifier (scheme ``token``), one overridable step per method.

    Each method is one decision of the algorithm, so that a known bug (a
    mutant in ``fixtures/mutants``) is a one-method subclass of the reference.
    Other exact schemes (:mod:`specdec_ref.schemes`) are subclasses too.
    ``bonus=False`` is the no-bonus variant: a fully accepted block emits no
    bonus token (``tokens[:, k]`` stays ``PAD_TOKEN``).
    """

    #: The scheme this verifier implements (``specdec_ref.contract.SCHEMES``).
    scheme = "token"
    bonus = True

    def __init__(self, *, bonus: bool = True):
        self.bonus = bonus

    def draft_rows(self, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        """The draft distributions the decisions use: the reported ``q`` itself for ``token``."""
        return draft_probs

    def judging_rows(self, target_probs: torch.Tensor, k: int) -> torch.Tensor:
        """Rows that judge ``d_1..d_k``: row ``i`` judges ``d_{i+1}`` (row 0 is saved_next)."""
        return target_probs[:, :k]

    def greedy_choice(self, probs: torch.Tensor) -> torch.Tensor:
        """The target's greedy token per row: first maximal index, as AR decoding."""
        return probs.argmax(-1)

    def accept(self, u: torch.Tensor, p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
        """Accept with probability ``min(1, p/q)``: ``u < p/q`` written without a division,
        so ``q(d) = 0`` accepts iff ``p(d) > 0`` and ``p(d) = 0`` always rejects."""
        return u * q_d < p_d

    def accepted_length(self, accepted: torch.Tensor) -> torch.Tensor:
        """Length of the contiguous accepted prefix: nothing after a rejection counts."""
        return _first_false(accepted)

    def final_rows(self, p: torch.Tensor, q: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Target and draft rows at the stopping position; row k has no draft (all zero)."""
        k = q.shape[1]
        p_m = rows_at(p, m)
        q_m = rows_at(q, m.clamp(max=k - 1)) * (m < k)[:, None]
        return p_m, q_m

    def residual(self, p_m: torch.Tensor, q_m: torch.Tensor) -> torch.Tensor:
        """Weights of the replacement: ``[p - q]_+``, or ``p`` if that is empty (p == q)."""
        residual = (p_m - q_m).clamp_min_(0)
        empty = residual.sum(-1, keepdim=True) <= RESIDUAL_EPS
        return torch.where(empty, p_m, residual)

    def sample(self, weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return sample_from_weights(weights, generator)

    def assemble(self, draft_tokens: torch.Tensor, m: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        """``tokens[:m]`` = drafts, ``tokens[m]`` = final, the rest PAD_TOKEN."""
        batch, k = draft_tokens.shape
        positions = torch.arange(k + 1, device=draft_tokens.device)
        padded = torch.cat([draft_tokens, draft_tokens.new_zeros(batch, 1)], dim=1)
        tokens = torch.where(positions < m[:, None], padded, PAD_TOKEN)
        if not self.bonus:
            final = torch.where(m == k, PAD_TOKEN, final)
        return tokens.scatter_(1, m[:, None], final[:, None])

    def greedy(self, draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = draft_tokens.shape[1]
        judged = self.greedy_choice(self.judging_rows(target_probs, k))
        m = self.accepted_length(draft_tokens == judged)
        final = self.greedy_choice(target_probs).gather(1, m[:, None]).squeeze(1)
        return m, self.assemble(draft_tokens, m, final)

    def sampling(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, k = draft_tokens.shape
        p = target_probs.to(torch.float32)
        q = self.draft_rows(draft_probs.to(torch.float32), draft_tokens)
        index = draft_tokens[..., None]
        p_d = self.judging_rows(p, k).gather(2, index).squeeze(-1)
        q_d = q.gather(2, index).squeeze(-1)
        u = uniform((batch, k), generator, p.device)
        m = self.accepted_length(self.accept(u, p_d, q_d))
        final = self.sample(self.residual(*self.final_rows(p, q, m)), generator)
        return m, self.assemble(draft_tokens, m, final)

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        validate: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Verify one block per row; ``draft_probs=None`` selects greedy verification.

        ``validate=False`` skips the input checks (which synchronise with the host).
        """
        check_generators(generator, draft_tokens.shape[0])
        if validate:
            validate_verify_inputs(draft_tokens, draft_probs, target_probs)
        draft_tokens = draft_tokens.long()
        if draft_probs is None:
            return self.greedy(draft_tokens, target_probs)
        return self.sampling(draft_tokens, draft_probs, target_probs, generator)


#: The reference verifier (see :class:`BlockVerifier` and :mod:`specdec_ref.contract`).
verify_block = BlockVerifier()
