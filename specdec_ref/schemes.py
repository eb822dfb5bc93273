"""Verification schemes other than token-wise rejection sampling, each a small subclass of the reference.

Every class keeps the verifier contract (:class:`specdec_ref.contract.Verifier`): same inputs, same output
layout, greedy verification unchanged (``draft_probs=None`` follows the target's greedy path), no
host synchronisation, randomness only from the given generator. What differs is how a sampled
block is judged; ``scheme`` names it, as a backend declares it in ``Capabilities.scheme``.

* :class:`OneHotDraftVerifier` (``one_hot_draft``): exact, whatever the draft distribution.
* :class:`BlockwiseVerifier` (``block``): exact, never fewer accepted drafts on average than
  token-wise verification.
* :class:`TypicalAcceptanceVerifier` (``lossy``): Medusa's typical acceptance; faster, not exact.

Each takes ``bonus=False`` for its no-bonus variant. The suite's oracle for each scheme's laws is
written independently, in float64 numpy (``specdec_properties.exact``).
"""
from __future__ import annotations

import torch

from .rng import uniform
from .verify import RESIDUAL_EPS, BlockVerifier

__all__ = ["OneHotDraftVerifier", "BlockwiseVerifier", "TypicalAcceptanceVerifier"]


class OneHotDraftVerifier(BlockVerifier):
    """Token-wise rejection sampling with the draft distribution replaced by the one-hot of the draft.

    Accept ``d`` with probability ``min(1, p(d) / 1) = p(d)``; on rejection emit a sample of
    ``[p - onehot(d)]_+``, i.e. ``p`` with ``d`` removed. Exact for any draft, because the
    draft's law never enters; per draft the acceptance is ``sum_x q(x) p(x)`` instead of
    ``sum_x min(p(x), q(x))`` (a mode of vLLM's rejection sampler, used when the proposer's
    probabilities are not kept).
    """

    scheme = "one_hot_draft"

    def draft_rows(self, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(draft_tokens, draft_probs.shape[-1]).to(draft_probs.dtype)


class BlockwiseVerifier(BlockVerifier):
    """Block verification: Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block verification
    accelerates speculative decoding", ICLR 2025 (arXiv 2403.10444), Algorithm 2.

    With ``p_i``, ``q_i`` the target and draft rows judging ``d_{i+1}``:

    * weights ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_{i-1}(d_i) / q_{i-1}(d_i))``;
    * for ``i < k``: ``h_i = r_i / (r_i + 1 - w_i)`` with ``r_i = sum_x [w_i p_i(x) - q_i(x)]_+``
      (``h_i = 1`` when the denominator is 0, which only happens when ``w_i = 1`` and ``p_i = q_i``;
      then a later position is always accepted and ``h_i`` does not matter); ``h_k = w_k``;
    * with ``eta_i ~ U[0, 1)``, the accepted length is the *largest* ``i`` with ``eta_i < h_i`` (0 if
      none): the block is judged jointly, a later draft can rescue earlier ones;
    * the replacement at ``tau < k`` is a sample of ``[w_tau p_tau - q_tau]_+`` normalised
      (``w_0 = 1``: the token-wise residual at position 0); at ``tau = k`` the bonus, from ``p_k``.

    The paper's two-token example (``p = (1/3, 2/3)``, ``q = (2/3, 1/3)``, context-independent,
    ``k = 2``) accepts 11/9 drafts per block on average against 10/9 for token-wise verification
    (``tests/test_schemes.py`` reproduces it).
    """

    scheme = "block"

    def block_weights(self, p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
        """``w[B, k+1]``: the running, clipped likelihood ratio of the drafted prefix (``w_0 = 1``).

        ``q(d) = 0`` counts as an infinite ratio when ``p(d) > 0`` (as token-wise acceptance does);
        once a weight is 0 it stays 0."""
        ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(torch.finfo(q_d.dtype).tiny), (p_d > 0).to(p_d.dtype) * torch.inf)
        weights = [torch.ones_like(p_d[:, 0])]
        for i in range(p_d.shape[1]):
            prev = weights[-1]
            weights.append(torch.where(prev > 0, torch.clamp(prev * ratio[:, i], max=1.0), prev))
        return torch.stack(weights, 1)

    def block_residuals(self, w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``[w_i p_i - q_i]_+`` for positions ``i < k``: ``[B, k, V]``."""
        return (w[..., None] * p - q).clamp_min(0)

    def replacement_weights(self, residuals: torch.Tensor, w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Weights of the replacement at each stop position ``i < k``: the block residuals themselves."""
        return residuals

    def sampling(self, draft_tokens, draft_probs, target_probs, generator=None):
        batch, k = draft_tokens.shape
        p = target_probs.to(torch.float32)
        q = draft_probs.to(torch.float32)
        index = draft_tokens[..., None]
        p_d = p[:, :k].gather(2, index).squeeze(-1)
        q_d = q.gather(2, index).squeeze(-1)
        w = self.block_weights(p_d, q_d)  # [B, k+1]
        residuals = self.block_residuals(w[:, :k], p[:, :k], q)  # [B, k, V]: position i < k
        r = residuals.sum(-1)
        den = r + 1 - w[:, :k]
        h = torch.where(den > 0, r / den.clamp_min(torch.finfo(den.dtype).tiny), torch.ones_like(r))
        stop_probs = torch.cat([h[:, 1:], w[:, k:]], 1)  # h_1..h_k
        eta = uniform((batch, k), generator, p.device)
        positions = torch.arange(1, k + 1, device=p.device)
        m = ((eta < stop_probs) * positions).amax(1)
        rows = torch.arange(batch, device=p.device)
        p_m = p[rows, m]
        weights = torch.cat([self.replacement_weights(residuals, w[:, :k], p[:, :k], q), torch.zeros_like(p[:, :1])], 1)[rows, m]
        use_p = (m == k) | (weights.sum(-1) <= RESIDUAL_EPS)
        final = self.sample(torch.where(use_p[:, None], p_m, weights), generator)
        return m, self.assemble(draft_tokens, m, final)


class TypicalAcceptanceVerifier(BlockVerifier):
    """Medusa's typical acceptance (Cai et al., "Medusa: simple LLM inference acceleration framework
    with multiple decoding heads", 2024, section 2.3.1): a *lossy* scheme.

    ``d_{i+1}`` is accepted, deterministically, when ``p_i(d) > min(epsilon, delta * exp(-H(p_i)))``
    (``H``: entropy in nats), up to the first failure; the token after the accepted prefix is a
    sample of the target row there (``p_m``, the bonus row when all are accepted), not of a residual.
    The draft distribution is ignored, so the emitted text is biased towards what the draft proposes;
    the suite measures how far, as a total variation with a confidence interval.
    """

    scheme = "lossy"

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3, *, bonus: bool = True):
        super().__init__(bonus=bonus)
        if not (0 < epsilon <= 1 and 0 < delta):
            raise ValueError(f"need 0 < epsilon <= 1 and delta > 0, got epsilon={epsilon!r}, delta={delta!r}")
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    def thresholds(self, p: torch.Tensor) -> torch.Tensor:
        """``min(epsilon, delta * exp(-H(p)))`` per row of ``p[..., V]``."""
        entropy = -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)
        return torch.clamp(self.delta * torch.exp(-entropy), max=self.epsilon)

    def sampling(self, draft_tokens, draft_probs, target_probs, generator=None):
        batch, k = draft_tokens.shape
        p = target_probs.to(torch.float32)
        p_d = p[:, :k].gather(2, draft_tokens[..., None]).squeeze(-1)
        m = self.accepted_length(p_d > self.thresholds(p[:, :k]))
        rows = torch.arange(batch, device=p.device)
        final = self.sample(p[rows, m], generator)
        return m, self.assemble(draft_tokens, m, final)
