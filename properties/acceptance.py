"""Exact acceptance of one speculative round on an exactly-known pair, under history-dependent sampling.

The efficiency laws the batched decoder checks test (``conformance.batch_checks``): given a row's prompt and
generated tokens ``G`` at the start of a round,

* sampling: the drafts ``d_1..d_k`` are drawn from ``q_i`` = the draft's law after ``G + d_<i`` (its
  settings applied on that hypothetical history, :func:`specdec_properties.sequences.next_token_law`), the target's rows
  ``p_i`` likewise; the declared scheme's exact outcome given the drafts (:func:`specdec_properties.exact.outcome_given_drafts`)
  averaged over every draft path gives the law of the accepted count ``m`` (:func:`round_acceptance_moments`);
* greedy: an ideal draft proposes its own argmax, so along the emitted (greedy) path ``y`` the accepted count
  is the number of leading positions where the draft's argmax equals ``y_i``, capped at ``k``
  (:func:`greedy_accepted`).

Everything is float64 numpy on the tables of :mod:`specdec_ref.exact`, independent of the decoder.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

__all__ = ["round_acceptance_moments", "greedy_accepted"]

#: Draft rows whose top two processed logits are closer than this are ties: the greedy draft is ambiguous there.
TIE = 1e-9


def round_acceptance_moments(target, draft, prompt: Sequence[int], generated: Sequence[int], config, k: int, scheme, *,
                             eos_id: int | Sequence[int] | None = None) -> tuple[float, float]:
    """Exact ``(mean, variance)`` of the accepted drafts of one round of ``scheme`` with ``k`` drafts, from the history
    ``prompt + generated`` (sampling ``config``, history-dependent settings included; ``eos_id`` for ``min_new_tokens``)."""
    from .exact import outcome_given_drafts
    from .sequences import next_token_law

    generated = tuple(int(t) for t in generated)
    vocab = target.vocab
    paths = np.array(list(itertools.product(range(vocab), repeat=k)), dtype=np.int64)
    prefixes = sorted({generated + tuple(int(t) for t in path[:i]) for path in paths for i in range(k + 1)})
    index = {p: i for i, p in enumerate(prefixes)}
    p_law = next_token_law(target, list(prompt), prefixes, config, eos_id=eos_id).numpy()
    q_law = next_token_law(draft, list(prompt), prefixes, config, eos_id=eos_id).numpy()
    rows = np.array([[index[generated + tuple(int(t) for t in path[:i])] for i in range(k + 1)] for path in paths])
    p, q = p_law[rows], q_law[rows[:, :k]]
    weight = np.prod(q[np.arange(len(paths))[:, None], np.arange(k)[None, :], paths], 1)
    keep = weight > 0
    stop, _ = outcome_given_drafts(scheme, p[keep], q[keep], paths[keep])
    law = weight[keep] @ stop
    positions = np.arange(k + 1, dtype=np.float64)
    mean = float(law @ positions)
    return mean, float(law @ positions**2 - mean**2)


def greedy_accepted(draft, prompt: Sequence[int], generated: Sequence[int], emitted: Sequence[int], config, k: int, *,
                    eos_id: int | Sequence[int] | None = None) -> int | None:
    """The accepted count of a greedy round from ``prompt + generated`` whose emitted tokens are ``emitted`` (the
    greedy path; at least ``k + 1`` of them or ending where the round ended), for a draft proposing its argmax
    under ``config``'s history-dependent settings. ``None`` when a draft row on the way has a tie (ambiguous)."""
    from .sequences import processed_logits64

    generated = tuple(int(t) for t in generated)
    steps = min(k, len(emitted))
    prefixes = [generated + tuple(int(t) for t in emitted[:i]) for i in range(steps)]
    if not prefixes:
        return 0
    logits = processed_logits64(draft, list(prompt), prefixes, config, eos_id=eos_id).numpy()
    for i, row in enumerate(logits):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < TIE:
            return None
        if int(row.argmax()) != int(emitted[i]):
            return i
    return steps
