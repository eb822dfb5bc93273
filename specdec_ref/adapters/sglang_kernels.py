"""Pure-PyTorch ports of SGLang's two tree verification kernels, called exactly like ``sgl_kernel``'s.

SGLang (EAGLE-2/3, MTP, standalone drafts) verifies a draft tree with two CUDA kernels of ``sgl-kernel``:

* ``tree_speculative_sampling_target_only`` (sampling), ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``
  (``TreeSpeculativeSamplingTargetOnly``) and its launcher ``speculative_sampling.cu``;
* ``verify_tree_greedy`` (greedy), ``sgl-kernel/csrc/speculative/eagle_utils.cu`` (``VerifyTreeGreedy``),

with Python bindings in ``sgl-kernel/python/sgl_kernel/speculative.py`` and golden cases in
``sgl-kernel/tests/speculative/test_speculative_sampling.py`` and ``test_eagle_utils.py`` (all in
https://github.com/sgl-project/sglang). This module is our own code written from those files. The kernels speak
SGLang's tree layout, described in :mod:`specdec_ref.adapters.sglang`, which re-exports every name here and puts any kernel
with this signature behind our ``verify_tree`` (:class:`~specdec_ref.adapters.sglang.SGLangTreeBackend`).

The algorithm (``TreeSpeculativeSamplingTargetOnly``)
----------------------------------------------------
One walk per row from the root. At the node it stands on (``last``) it holds one coin,
``uniform_samples[b, last]`` (a coin per *level*, indexed by the parent; the coin of a leaf is unused), and
``prob_acc = 0``. It tries the children in sibling order: ``prob_acc += p_last(x)`` and the child is accepted
when ``coin <= prob_acc / threshold_acc`` or ``p_last(x) >= threshold_single``; it then records
``predicts[last] = x``, appends the child to ``accept_index``, moves to it, takes its coin and resets
``prob_acc``. A rejected child writes ``draft_probs[b, last, x] = p_last(x)`` (the caller passes
``draft_probs`` all zeros, a scratch buffer; "FIXME: leverage draft probs" in the source) and the walk tries
the next sibling. When all children are rejected, or at a leaf, or after ``S - 1`` acceptances, the *final*
token is sampled with ``uniform_samples_for_final_sampling[b]`` from ``relu(p_last - draft_probs_last)``
(``p_last`` alone after ``S - 1`` acceptances), i.e. ``p_last`` with the rejected children removed, by inverse
CDF: the first token whose cumulative weight exceeds ``coin * total`` (the last positive-weight token if
rounding leaves none, ``V - 1`` if all weights are 0). It is written to ``predicts[last]``.
``threshold_acc`` is floored at ``1e-9`` by the launcher, which also requires ``0 <= thresholds <= 1``.

At thresholds ``(1, 1)`` and distinct sibling tokens, one coin per level with cumulative sums is the same law
as one coin per sibling (:class:`~specdec_ref.tree.DeterministicTreeVerifier`): child ``j`` is accepted with
probability ``P(sum_{l<j} p(x_l) < u <= sum_{l<=j} p(x_l)) = p(x_j)``, exactly the sequential one-hot
acceptance ``r_j(x_j) * prod_{l<j} (1 - r_l(x_l))``, and the final token is ``p`` without the rejected
children. Below 1 the kernel accepts more than that law allows: it is lossy.

``VerifyTreeGreedy`` walks the same links and accepts a child whose token equals ``target_predict[b, last]``;
the final token is ``target_predict[b, last]``.
"""
from __future__ import annotations

import torch

__all__ = [
    "TreeSpeculativeSamplingTargetOnly",
    "VerifyTreeGreedy",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy",
    "THRESHOLD_ACC_FLOOR",
]

#: The launcher's floor on ``threshold_acc`` (``fmaxf(threshold_acc, 1e-9f)`` in ``speculative_sampling.cuh``).
THRESHOLD_ACC_FLOOR = 1e-9


def _check_kernel_args(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num):
    """The launchers' shape checks (``CHECK_DIM`` / ``CHECK_EQ`` in ``speculative_sampling.cu`` / ``eagle_utils.cu``), as ValueError."""
    if candidates.dim() != 2:
        raise ValueError(f"candidates must be [bs, num_draft_tokens], got {tuple(candidates.shape)}")
    links = (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling))
    for name, value in links:
        if tuple(value.shape) != tuple(candidates.shape):
            raise ValueError(f"{name} must have the shape of candidates {tuple(candidates.shape)}, got {tuple(value.shape)}")
    for name, value in (("candidates", candidates), *links):
        if value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {value.dtype}")
    batch, size = candidates.shape
    if predicts.dim() != 1 or accept_index.dim() != 2 or accept_token_num.dim() != 1:
        raise ValueError("predicts must be 1-d, accept_index 2-d and accept_token_num 1-d")
    if accept_index.shape[0] != batch or accept_token_num.shape[0] != batch or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index must be [bs, S >= 1] and accept_token_num [bs] with bs = {batch}")
    if predicts.numel() < batch * size:
        raise ValueError(f"predicts must hold bs * num_draft_tokens = {batch * size} entries, got {predicts.numel()}")


def _put(flat: torch.Tensor, index: torch.Tensor, value: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``flat[index[b]] = value[b]`` for the rows where ``where[b]`` (one scatter, no host sync)."""
    return flat.scatter(0, index, torch.where(where, value, flat.gather(0, index)))


def _put_row(table: torch.Tensor, column: torch.Tensor, value: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``table[b, column[b]] = value[b]`` for the rows where ``where[b]``."""
    col = column[:, None]
    return table.scatter(1, col, torch.where(where, value, table.gather(1, col).squeeze(1))[:, None])


class _TreeWalk:
    """The link walk both kernels share, vectorised over the batch: one tried child per row per step.

    Each step is a few ``[bs]`` tensor ops (no host sync); ``num_draft_tokens - 1`` steps visit every node
    a walk can reach (each node is tried at most once). Subclasses decide acceptance and the final token.
    """

    def links(self, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor):
        """The (first child, next sibling) links the walk follows."""
        return retrive_next_token.long(), retrive_next_sibling.long()

    def walk(self, state, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num):
        batch, size = candidates.shape
        columns = accept_index.shape[1]
        device = candidates.device
        rows = torch.arange(batch, device=device)
        cand = candidates.long()
        ridx = retrive_index.long()
        next_token, next_sibling = self.links(retrive_next_token, retrive_next_sibling)
        pred = predicts.long().reshape(-1)
        acc = accept_index.long().clone()
        acc[:, 0] = ridx[:, 0]
        last = torch.zeros(batch, dtype=torch.long, device=device)
        num = torch.zeros(batch, dtype=torch.long, device=device)
        cur = next_token[:, 0]
        active = (cur >= 0) & (columns > 1)
        for _ in range(size - 1):
            node = cur.clamp(0, size - 1)
            token = cand[rows, node]
            accepted = active & self.judge(state, rows, last, node, token)
            rejected = active & ~accepted
            self.after_judge(state, rows, last, node, token, accepted, rejected)
            pred = _put(pred, ridx[rows, last].clamp(0, pred.numel() - 1), token, accepted)
            num = num + accepted.long()
            acc = _put_row(acc, num.clamp(max=columns - 1), ridx[rows, node], accepted)
            last = torch.where(accepted, node, last)
            cur = torch.where(accepted, next_token[rows, node], torch.where(rejected, next_sibling[rows, node], cur))
            active = active & (cur >= 0) & (num < columns - 1)
        final = self.final_token(state, rows, last, num, columns)
        pred = _put(pred, ridx[rows, last].clamp(0, pred.numel() - 1), final, torch.ones_like(active))
        predicts.copy_(pred.to(predicts.dtype).reshape(predicts.shape))
        accept_index.copy_(acc.to(accept_index.dtype))
        accept_token_num.copy_(num.to(accept_token_num.dtype))

    def judge(self, state, rows, last, node, token) -> torch.Tensor:
        raise NotImplementedError

    def after_judge(self, state, rows, last, node, token, accepted, rejected) -> None:
        pass

    def final_token(self, state, rows, last, num, columns) -> torch.Tensor:
        raise NotImplementedError


class _SamplingState:
    def __init__(self, target_probs, draft_probs, uniform_samples, threshold_single, threshold_acc):
        self.p = target_probs
        self.q = draft_probs  # [B, N, V] scratch, written on rejection
        self.u = uniform_samples
        self.threshold_single = threshold_single
        self.threshold_acc = threshold_acc
        batch = target_probs.shape[0]
        self.coin = uniform_samples[:, 0]
        self.prob_acc = torch.zeros(batch, dtype=target_probs.dtype, device=target_probs.device)
        self.final_coin = None


class TreeSpeculativeSamplingTargetOnly(_TreeWalk):
    """Port of ``tree_speculative_sampling_target_only`` (``speculative_sampling.cuh``), SGLang's argument names.

    Called exactly like ``sgl_kernel.tree_speculative_sampling_target_only``: writes ``predicts``,
    ``accept_index`` and ``accept_token_num`` in place (any integer dtype) and ``draft_probs`` (the scratch
    buffer of rejected mass; a zero buffer is allocated when it is ``None``, as newer ``sgl_kernel`` does).
    Probabilities and coins are used in float32 as in the kernel; ``deterministic`` (the CUDA scan mode) is
    accepted and ignored. One overridable step per method, so a kernel bug is a one-method subclass
    (``fixtures/mutants/sglang.py``).
    """

    def __call__(
        self,
        predicts: torch.Tensor,
        accept_index: torch.Tensor,
        accept_token_num: torch.Tensor,
        candidates: torch.Tensor,
        retrive_index: torch.Tensor,
        retrive_next_token: torch.Tensor,
        retrive_next_sibling: torch.Tensor,
        uniform_samples: torch.Tensor,
        uniform_samples_for_final_sampling: torch.Tensor,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        threshold_single: float = 1.0,
        threshold_acc: float = 1.0,
        deterministic: bool = True,
    ) -> None:
        _check_kernel_args(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num)
        batch, size = candidates.shape
        if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (batch, size):
            raise ValueError(f"target_probs must be [bs, num_draft_tokens, V] = [{batch}, {size}, V], got {tuple(target_probs.shape)}")
        if tuple(uniform_samples.shape) != (batch, size):
            raise ValueError(f"uniform_samples must be [bs, num_draft_tokens] = {(batch, size)}, got {tuple(uniform_samples.shape)}")
        if tuple(uniform_samples_for_final_sampling.shape) != (batch,):
            raise ValueError(f"uniform_samples_for_final_sampling must be [bs] = ({batch},), got {tuple(uniform_samples_for_final_sampling.shape)}")
        if draft_probs is not None and tuple(draft_probs.shape) != tuple(target_probs.shape):
            raise ValueError(f"draft_probs must have the shape of target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}")
        for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1] (CHECK_GE in speculative_sampling.cu), got {value!r}")
        p = target_probs.to(torch.float32)
        q = torch.zeros_like(p) if draft_probs is None else draft_probs.to(torch.float32).clone()
        state = _SamplingState(
            p, q, uniform_samples.to(torch.float32), float(threshold_single), max(float(threshold_acc), THRESHOLD_ACC_FLOOR)
        )
        state.final_coin = uniform_samples_for_final_sampling.to(torch.float32)
        self.walk(state, candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num)
        if draft_probs is not None:
            draft_probs.copy_(state.q.to(draft_probs.dtype))

    # --- one decision per method

    def accepts(self, coin, prob_acc, p_single, threshold_single, threshold_acc) -> torch.Tensor:
        """``coin <= prob_acc / threshold_acc || p_single >= threshold_single``."""
        return (coin <= prob_acc / threshold_acc) | (p_single >= threshold_single)

    def reset_prob_acc(self, prob_acc: torch.Tensor) -> torch.Tensor:
        """``prob_acc = 0`` after an acceptance: the next level starts its cumulative sum afresh."""
        return torch.zeros_like(prob_acc)

    def next_coin(self, state, rows, node, coin) -> torch.Tensor:
        """The coin judging the accepted node's children: ``uniform_samples[b, node]``."""
        return state.u[rows, node]

    def rejected_mass(self, p_single: torch.Tensor) -> torch.Tensor:
        """What a rejected child writes into ``draft_probs[b, last, x]``: its target mass ``p_last(x)``."""
        return p_single

    def final_weights(self, p_last, q_last, bonus) -> torch.Tensor:
        """``relu(p_last - draft_probs_last)``, or ``p_last`` after ``S - 1`` acceptances (no draft row for the bonus)."""
        return torch.where(bonus[:, None], p_last, (p_last - q_last).clamp_min(0))

    def sample(self, weights, coin) -> torch.Tensor:
        """Inverse CDF at ``coin * total``: the first token whose cumulative weight exceeds it; if rounding leaves
        none, the last positive-weight token; ``V - 1`` if every weight is 0 (``DeviceSamplingFromProb`` and the
        kernel's ``last_valid_id`` fallback)."""
        vocab = weights.shape[-1]
        threshold = coin * weights.sum(-1)
        above = weights.cumsum(-1) > threshold[:, None]
        first = above.long().argmax(-1)
        positive = weights > 0
        last_positive = vocab - 1 - positive.flip(-1).long().argmax(-1)
        return torch.where(above.any(-1), first, torch.where(positive.any(-1), last_positive, vocab - 1))

    # --- the walk's hooks

    def judge(self, state, rows, last, node, token):
        vocab = state.p.shape[-1]
        p_single = state.p[rows, last, token.clamp(0, vocab - 1)]
        prob_acc = state.prob_acc + p_single
        accepted = self.accepts(state.coin, prob_acc, p_single, state.threshold_single, state.threshold_acc)
        state.pending = (p_single, prob_acc)
        return accepted

    def after_judge(self, state, rows, last, node, token, accepted, rejected):
        p_single, prob_acc = state.pending
        vocab = state.p.shape[-1]
        tried = accepted | rejected
        state.prob_acc = torch.where(accepted, self.reset_prob_acc(prob_acc), torch.where(tried, prob_acc, state.prob_acc))
        state.coin = torch.where(accepted, self.next_coin(state, rows, node, state.coin), state.coin)
        flat = state.q.reshape(state.q.shape[0], -1)
        column = last * vocab + token.clamp(0, vocab - 1)
        state.q = _put_row(flat, column, self.rejected_mass(p_single), rejected).reshape(state.q.shape)

    def final_token(self, state, rows, last, num, columns):
        bonus = num == columns - 1
        weights = self.final_weights(state.p[rows, last], state.q[rows, last], bonus)
        return self.sample(weights, state.final_coin)


class VerifyTreeGreedy(_TreeWalk):
    """Port of ``verify_tree_greedy`` (``eagle_utils.cu``, ``VerifyTreeGreedy``), SGLang's argument names.

    A child is accepted when its token equals ``target_predict[b, last]`` (the argmax of the target row of the
    node the walk stands on); the final token is ``target_predict[b, last]``. Writes the outputs in place.
    """

    def __call__(
        self,
        predicts: torch.Tensor,
        accept_index: torch.Tensor,
        accept_token_num: torch.Tensor,
        candidates: torch.Tensor,
        retrive_index: torch.Tensor,
        retrive_next_token: torch.Tensor,
        retrive_next_sibling: torch.Tensor,
        target_predict: torch.Tensor,
    ) -> None:
        _check_kernel_args(candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num)
        if tuple(target_predict.shape) != tuple(candidates.shape):
            raise ValueError(f"target_predict must have the shape of candidates {tuple(candidates.shape)}, got {tuple(target_predict.shape)}")
        self.walk(target_predict.long(), candidates, retrive_index, retrive_next_token, retrive_next_sibling, predicts, accept_index, accept_token_num)

    def judge(self, target_predict, rows, last, node, token):
        return token == target_predict[rows, last]

    def final_token(self, target_predict, rows, last, num, columns):
        return target_predict[rows, last]


#: The ports, callable as ``sgl_kernel.tree_speculative_sampling_target_only`` / ``sgl_kernel.verify_tree_greedy``.
tree_speculative_sampling_target_only = TreeSpeculativeSamplingTargetOnly()
verify_tree_greedy = VerifyTreeGreedy()
