"""Independent float64 oracle of the history-dependent sampling steps (plain numpy; one row, or every row at once).

This module deliberately does not import :mod:`specdec_ref.history` (the implementation under test): it
re-states the steps from their definition and only reads the settings off
:class:`specdec_ref.warp.SamplingConfig` (and the ``transitions`` / ``start`` data of its constraint
automaton). At a position whose history is the prompt ``P`` and the generated tokens ``G``, the raw
logits ``z`` become, in this order:

1. ``z[v] += logit_bias[v]``;
2. repetition penalty ``r``: for ``v`` in ``P`` or ``G``, ``z[v] / r`` if ``z[v] > 0`` else ``z[v] * r``;
3. ``z[v] -= presence * [count_G(v) > 0] + frequency * count_G(v)`` (generated tokens only);
4. while ``len(G) < min_new_tokens``, ``z[e] = -inf`` for every EOS id ``e`` (``eos_id``: None, one id or several);
5. with a constraint, ``z[v] = -inf`` for every ``v`` forbidden in the state reached by reading ``G``
   from the automaton's start (the prompt is not read);
6. for every bad word ``w``, ``z[w[-1]] = -inf`` when ``G`` ends with ``w[:-1]`` (read off the words directly, not
   through an automaton; the prompt is not read).

Temperature / top-k / top-p / min-p come after and are not applied here.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["eos_set", "history_settings_on", "automaton_state", "history_row", "history_logits"]


def eos_set(eos_id) -> tuple[int, ...]:
    """The EOS ids as a tuple: ``None`` -> ``()``, one id -> ``(id,)``, a sequence of ids -> those ids."""
    if eos_id is None:
        return ()
    if isinstance(eos_id, (int, np.integer)) and not isinstance(eos_id, bool):
        return (int(eos_id),)
    ids = tuple(eos_id)
    if not all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in ids):
        raise ValueError(f"eos_id must be None, a token id or a sequence of token ids, got {eos_id!r}")
    return tuple(int(e) for e in ids)


def history_settings_on(config) -> bool:
    """Whether any of the history steps can change a logit (the oracle's own reading of ``config``)."""
    return bool(
        config.logit_bias
        or config.repetition_penalty != 1.0
        or config.presence_penalty
        or config.frequency_penalty
        or config.min_new_tokens
        or config.constraint is not None
        or config.bad_words
    )


def automaton_state(constraint, generated: Sequence[int]) -> int:
    """The state after reading ``generated`` from ``constraint.start``; ValueError at a forbidden token."""
    state = constraint.start
    for i, t in enumerate(generated):
        nxt = constraint.transitions[state][t]
        if nxt < 0:
            raise ValueError(f"generated token {t} at position {i} is forbidden by the constraint (state {state})")
        state = nxt
    return state


def history_row(z, config, prompt: Sequence[int], generated: Sequence[int], eos_id=None) -> np.ndarray:
    """Steps 1-6 (module docstring) on one row of raw logits ``z [V]``: a new float64 array.

    Raises ValueError when a token id is outside the vocabulary or when no token is left (e.g. a
    constraint state allowing only EOS while ``min_new_tokens`` masks it).
    """
    return _history_rows(np.array(z, dtype=np.float64)[None], config, list(prompt), [list(generated)], eos_id)[0]


def history_logits(logits, config, prompt: Sequence[int], generated: Sequence[Sequence[int]], eos_id=None) -> np.ndarray:
    """Row ``i`` of ``logits [F, V]`` after :func:`history_row` with history ``prompt`` + ``generated[i]``.

    Returns the logits unchanged (as float64) when no history setting is on.
    """
    z = np.array(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[0] != len(generated):
        raise ValueError(f"logits must be [F={len(generated)}, V], got {z.shape}")
    if not history_settings_on(config):
        return z
    if not len(z):
        return z
    return _history_rows(z, config, list(prompt), [list(g) for g in generated], eos_id)


def _history_rows(z: np.ndarray, config, prompt: list[int], generated: list[list[int]], eos_id) -> np.ndarray:
    """Steps 1-6 on every row of ``z [F, V]`` (float64, changed in place) with history ``prompt`` + ``generated[i]``:
    one count matrix for the generated tokens, steps 1-3 on the whole array, 4-5 on the rows they concern; no row's
    result depends on the others."""
    vocab = z.shape[-1]
    eos = eos_set(eos_id)
    flat = [t for g in generated for t in g]
    for t, _ in config.logit_bias:
        if not 0 <= t < vocab:
            raise ValueError(f"logit_bias names token {t}, outside the vocabulary [0, {vocab})")
    for t in prompt + flat + list(eos):
        if not 0 <= t < vocab:
            raise ValueError(f"token {t} is outside the vocabulary [0, {vocab})")
    rows = np.repeat(np.arange(len(generated)), [len(g) for g in generated])
    counts = np.bincount(rows * vocab + np.asarray(flat, dtype=np.int64), minlength=len(generated) * vocab)
    counts = counts.reshape(len(generated), vocab).astype(np.float64)
    for t, b in config.logit_bias:  # 1
        z[:, t] += b
    r = config.repetition_penalty
    if r != 1.0:  # 2
        seen = counts > 0
        seen[:, prompt] = True
        z = np.where(seen, np.where(z > 0, z / r, z * r), z)
    z = z - (config.presence_penalty * (counts > 0) + config.frequency_penalty * counts)  # 3
    if eos and config.min_new_tokens:  # 4
        early = np.array([len(g) < config.min_new_tokens for g in generated])
        z[np.ix_(early, list(eos))] = -np.inf
    if config.constraint is not None:  # 5
        for i, g in enumerate(generated):
            table = np.asarray(config.constraint.transitions[automaton_state(config.constraint, g)])
            if table.shape[0] != vocab:
                raise ValueError(f"constraint automaton has {table.shape[0]} tokens per state, the vocabulary has V={vocab}")
            z[i, table < 0] = -np.inf
    for w in config.bad_words:  # 6
        if not all(0 <= t < vocab for t in w):
            raise ValueError(f"bad word {list(w)} names a token outside the vocabulary [0, {vocab})")
        k = len(w) - 1
        for i, g in enumerate(generated):
            if len(g) >= k and tuple(g[len(g) - k:]) == tuple(w[:k]):
                z[i, w[-1]] = -np.inf
    dead = ~np.isfinite(z).any(-1)
    if dead.any():
        i = int(dead.nonzero()[0][0])
        raise ValueError(f"no token is allowed after generated tokens {generated[i]} ({config.label()})")
    return z
