"""Losslessness at the verifier level: many rounds of speculative decoding on models whose law is a table.

A :class:`MarkovPair` is a target and a draft whose next-token distributions depend only on the
last token: ``target[a]`` and ``draft[a]`` are the rows after token ``a`` (float64 arrays whose
values are exactly representable in float32, as the backend receives them). The law of the first
``L`` generated tokens under plain autoregressive sampling from the target is then exact and
cheap (:func:`sequence_law`): ``P(x_1..x_L) = target[s, x_1] target[x_1, x_2] ... ``.

:func:`simulate` runs the decode loop around a backend's ``verify``: every round each
unfinished sequence drafts ``k`` tokens from the draft table, the target rows are read from the
target table at the last committed token and at each draft, ``verify`` decides, and the emitted
tokens are appended (the first ``L`` are kept). Whatever exact verification scheme the backend
implements (token-wise, draft treated as one-hot, block verification, ...), the emitted text must
follow :func:`sequence_law`; any bias in any round — wrong residual, wrong row, a token lost or
duplicated between rounds — changes that law. This is the scheme-agnostic law the per-block checks
cannot state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .sampling import is_batched, verify_rows
from .scenarios import mix_for_acceptance, peaked_rows, to_float32_rows

CHUNK = 1 << 16


@dataclass(frozen=True, eq=False)
class MarkovPair:
    """Target and draft tables ``[V, V]`` (row ``a``: the next-token law after token ``a``) and the last prompt token."""

    name: str
    target: np.ndarray
    draft: np.ndarray
    start: int
    purpose: str

    @property
    def vocab(self) -> int:
        return self.target.shape[0]

    def acceptance(self) -> np.ndarray:
        """Per-row token-wise acceptance ``sum_x min(p, q)``."""
        return np.minimum(self.target, self.draft).sum(-1)

    def describe(self) -> str:
        a = self.acceptance()
        return f"{self.name} (V={self.vocab}, start token {self.start}, acceptance {a.min():.2f}..{a.max():.2f})"


def markov_pair(seed: int = 2027, vocab: int = 8, acceptance: float = 0.7) -> MarkovPair:
    """Distinct LM-like target rows; each draft row mixes its target row with another so that
    the token-wise acceptance is ``acceptance`` (every verification path is exercised)."""
    rng = np.random.default_rng(seed)
    p = peaked_rows(rng, vocab, vocab, sharpness=1.2)
    others = peaked_rows(rng, vocab, vocab, sharpness=2.5)
    q = np.stack([mix_for_acceptance(p[a], others[a], acceptance) for a in range(vocab)])
    return MarkovPair(
        name="markov",
        target=to_float32_rows(p),
        draft=to_float32_rows(q),
        start=0,
        purpose=f"next-token law depends on the last token; token-wise acceptance {acceptance}",
    )


def sequence_law(pair: MarkovPair, length: int) -> np.ndarray:
    """Exact float64 law of the first ``length`` tokens, flattened: cell ``sum_i x_i V^(L-1-i)``."""
    law = pair.target[pair.start].copy()
    for _ in range(length - 1):
        last = np.arange(law.size) % pair.vocab
        law = (law[:, None] * pair.target[last]).reshape(-1)
    return law


def sequence_labels(vocab: int, length: int) -> list[str]:
    """``"x_1 x_2 .. x_L"`` for every cell of :func:`sequence_law`."""
    digits = np.indices((vocab,) * length).reshape(length, -1).T
    return [" ".join(map(str, row)) for row in digits]


@dataclass
class Simulation:
    """What :func:`simulate` observed: ``counts`` over the cells of :func:`sequence_law`, and per
    round start state ``a`` (the last committed token) how many rounds started there
    (``rounds[a]``) and how many tokens they emitted (``emitted[a]``, before truncation to L)."""

    counts: np.ndarray
    rounds: np.ndarray
    emitted: np.ndarray

    @property
    def tokens_per_round(self) -> float:
        return float(self.emitted.sum() / max(self.rounds.sum(), 1))

    def __add__(self, other: "Simulation") -> "Simulation":
        """Both samples' counts together (two draws of the same simulation, e.g. consecutive chunks)."""
        return Simulation(self.counts + other.counts, self.rounds + other.rounds, self.emitted + other.emitted)


#: ``round_fn(last[b]) -> (emitted[b], out[b, w])``: one round for the unfinished sequences whose last
#: committed tokens are ``last``; ``out[:, :emitted]`` are the tokens the round emitted.
RoundFn = Callable[[torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]]


def simulate_rounds(pair: MarkovPair, n: int, *, length: int, round_fn: RoundFn, step: int, where: str) -> Simulation:
    """Decode ``n`` sequences of ``length`` tokens, ``step`` at a time, calling ``round_fn`` once per round
    for every unfinished sequence; count the first ``length`` tokens and the tokens per round by start state."""
    vocab = pair.vocab
    weights = vocab ** torch.arange(length - 1, -1, -1)
    counts = np.zeros(vocab**length, dtype=np.int64)
    round_starts = np.zeros(vocab, dtype=np.int64)
    round_tokens = np.zeros(vocab, dtype=np.int64)
    done = rounds = 0
    while done < n:
        b = min(step, n - done)
        tokens = torch.zeros(b, length, dtype=torch.long)
        filled = torch.zeros(b, dtype=torch.long)
        last = torch.full((b,), pair.start, dtype=torch.long)
        while True:
            rows = (filled < length).nonzero().squeeze(1)
            if len(rows) == 0:
                break
            emitted, out = round_fn(last[rows], f"{where}: sequences {done}..{done + b - 1}, round {rounds}")
            round_starts += np.bincount(last[rows].numpy(), minlength=vocab)
            round_tokens += np.bincount(last[rows].numpy(), weights=emitted.numpy(), minlength=vocab).astype(np.int64)
            for j in range(out.shape[1]):
                write = (j < emitted) & (filled[rows] + j < length)
                tokens[rows[write], filled[rows[write]] + j] = out[write, j]
            last[rows] = out.gather(1, (emitted - 1)[:, None]).squeeze(1)
            filled[rows] += emitted
            rounds += 1
        counts += np.bincount((tokens * weights).sum(1).numpy(), minlength=vocab**length)
        done += b
    return Simulation(counts=counts, rounds=round_starts, emitted=round_tokens)


def simulate(backend, pair: MarkovPair, n: int, *, length: int, k: int, seed: int, chunk: int = CHUNK) -> Simulation:
    """Decode ``n`` sequences of ``length`` tokens through ``backend.verify``, ``k`` drafts per round.

    Drafts come from a generator seeded with ``2 * seed``, the backend gets one seeded with
    ``2 * seed + 1``. Every ``verify`` output is structure-checked (``verify_rows``); a backend that
    does not claim ``batched`` gets one B = 1 call per sequence and round. A backend declaring
    ``bonus=False`` emits ``m`` tokens (not ``m + 1``) when it accepts all ``k``.
    """
    draw = markov_sampler(backend, pair, length=length, k=k, seed=seed)
    step = chunk if is_batched(backend) else min(chunk, 4096)
    parts = [draw(min(step, n - done)) for done in range(0, n, step)]
    return sum(parts, empty_simulation(pair, length))


def empty_simulation(pair: MarkovPair, length: int) -> Simulation:
    """The :class:`Simulation` of no sequence (zero counts), the start of a sum of draws."""
    return Simulation(np.zeros(pair.vocab**length, dtype=np.int64), np.zeros(pair.vocab, dtype=np.int64),
                      np.zeros(pair.vocab, dtype=np.int64))


def markov_sampler(backend, pair: MarkovPair, *, length: int, k: int, seed: int) -> Callable[[int], Simulation]:
    """``draw(b)``: the :class:`Simulation` of the next ``b`` sequences of :func:`simulate`'s run (its generators
    carried from call to call), so that consecutive draws add up to one run in chunks of those sizes."""
    target = torch.tensor(pair.target, dtype=torch.float32)
    draft = torch.tensor(pair.draft, dtype=torch.float32)
    draft_gen = torch.Generator().manual_seed(2 * seed)
    verify_gen = torch.Generator().manual_seed(2 * seed + 1)

    def round_fn(last: torch.Tensor, where: str):
        cur, drafts, qs = last, [], []
        for _ in range(k):
            q = draft[cur]
            cur = torch.multinomial(q, 1, generator=draft_gen).squeeze(1)
            drafts.append(cur)
            qs.append(q)
        d = torch.stack(drafts, 1)
        p = target[torch.cat([last[:, None], d], 1)]
        m, out = verify_rows(backend, d, torch.stack(qs, 1), p, generator=verify_gen, where=where, vocab=pair.vocab)
        return m + (out.gather(1, m[:, None]).squeeze(1) >= 0).long(), out  # m + 1, or m without a bonus

    return rounds_sampler(pair, length=length, round_fn=round_fn, where=f"{pair.name}, seed {seed}")


def rounds_sampler(pair: MarkovPair, *, length: int, round_fn: RoundFn, where: str) -> Callable[[int], Simulation]:
    """``draw(b)``: :func:`simulate_rounds` of the next ``b`` sequences with ``round_fn`` (whose generators carry over
    from call to call): consecutive draws add up to one simulation in chunks of those sizes."""
    done = [0]

    def draw(b: int) -> Simulation:
        at = f"{where}, sequences from {done[0]}"
        done[0] += b
        return simulate_rounds(pair, b, length=length, round_fn=round_fn, step=b, where=at)

    return draw


# ----------------------------------------------------------------------------- exact laws of a scheme


def _round_outcomes(pair: MarkovPair, scheme, start: int, k: int):
    """Every round from last token ``start``: ``(drafts[D, k], weight[D], stop[D, k+1], final[D, k+1, V])``
    (the draft chain's probability, and the scheme's exact outcome law given the drafts)."""
    from .exact import outcome_given_drafts

    vocab = pair.vocab
    drafts = np.indices((vocab,) * k).reshape(k, -1).T
    context = np.concatenate([np.full((len(drafts), 1), start), drafts], 1)
    q = pair.draft[context[:, :k]]  # row i judges d_{i+1}, after context[:, i]
    weight = np.prod(q[np.arange(len(drafts))[:, None], np.arange(k)[None, :], drafts], 1)
    keep = weight > 0
    drafts, context, q, weight = drafts[keep], context[keep], q[keep], weight[keep]
    stop, final = outcome_given_drafts(scheme, pair.target[context], q, drafts)
    return drafts, weight, stop, final


def scheme_sequence_law(pair: MarkovPair, scheme, length: int, k: int) -> np.ndarray:
    """Exact float64 law (cells as :func:`sequence_law`) of the first ``length`` tokens decoded over
    rounds with the oracle ``scheme`` (:class:`specdec_properties.exact.SchemeSpec`) and ``k`` drafts per round.

    Equal to :func:`sequence_law` for every lossless scheme (``tests/test_schemes.py`` proves it for
    the oracle's formulas); for ``typical`` it is the lossy scheme's own law, so the distance the
    suite measures can be checked against the exact one.
    """
    vocab = pair.vocab
    memo: dict[tuple[int, int], np.ndarray] = {}

    def law_after(last: int, r: int) -> np.ndarray:
        """Law over vocab**r of the next r tokens after token ``last``."""
        if (last, r) in memo:
            return memo[(last, r)]
        out = np.zeros(vocab**r)
        drafts, weight, stop, final = _round_outcomes(pair, scheme, last, k)
        for j in range(k + 1):
            for y in range(vocab):
                mass = weight * stop[:, j] * final[:, j, y]
                if j == k and not scheme.bonus:
                    mass = weight * stop[:, j] * (y == 0)  # one pass, no emitted token after d_k
                for row in np.flatnonzero(mass > 0):
                    emitted = list(drafts[row, :j]) + ([y] if (j < k or scheme.bonus) else [])
                    head = emitted[:r]
                    rest = r - len(head)
                    index = 0
                    for t in head:
                        index = index * vocab + int(t)
                    if rest == 0:
                        out[index] += mass[row]
                    else:
                        tail = law_after(int(head[-1]), rest)
                        out[index * vocab**rest : (index + 1) * vocab**rest] += mass[row] * tail
        memo[(last, r)] = out
        return out

    return law_after(pair.start, length)


def tokens_per_round(pair: MarkovPair, scheme, k: int) -> np.ndarray:
    """Exact expected tokens emitted by one round of ``scheme`` from each last token ``a``: ``[V]``."""
    per_state = np.empty(pair.vocab)
    for a in range(pair.vocab):
        _, weight, stop, final = _round_outcomes(pair, scheme, a, k)
        emitted = np.arange(k + 1) + 1.0
        if not scheme.bonus:
            emitted[k] = k
        per_state[a] = float(weight @ (stop @ emitted))
    return per_state


def accepted_moments(pair: MarkovPair, scheme, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of the accepted drafts ``m`` of one round of ``scheme`` with ``k``
    drafts, from each last token ``a``: two ``[V]`` arrays (the scheme's own efficiency)."""
    mean, var = np.empty(pair.vocab), np.empty(pair.vocab)
    positions = np.arange(k + 1, dtype=np.float64)
    for a in range(pair.vocab):
        _, weight, stop, _ = _round_outcomes(pair, scheme, a, k)
        law = weight @ stop
        mean[a] = law @ positions
        var[a] = law @ positions**2 - mean[a] ** 2
    return mean, var
