"""Grammar constraints as token automata: which tokens a state allows and where each leads.

:class:`TokenAutomaton` is the value of ``SamplingConfig.constraint`` (``specdec_ref.warp``); the per-row state
machine that applies it while decoding lives in :mod:`specdec_ref.history` (which re-exports the class).
``SamplingConfig.bad_words`` is an automaton too (:meth:`TokenAutomaton.forbidding`): a word ``w`` forbids its
last token wherever the generated tokens end with ``w[:-1]``; with a constraint as well, a row runs the product
(:func:`automaton_of`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["TokenAutomaton", "automaton_of", "forbidden_by"]


@dataclass(frozen=True)
class TokenAutomaton:
    """A deterministic automaton over token ids: ``transitions[s][v]`` is the state after token ``v`` in state
    ``s``, or ``-1`` when ``v`` is forbidden there. Generation starts in state ``start``; the prompt is not read.

    Every state must allow at least one token (a grammar that allows nothing would leave no distribution).
    """

    transitions: tuple[tuple[int, ...], ...]
    start: int = 0

    def __post_init__(self):
        rows = tuple(tuple(int(x) for x in row) for row in self.transitions)
        if not rows or not rows[0]:
            raise ValueError("TokenAutomaton needs at least one state and one token")
        width = len(rows[0])
        for s, row in enumerate(rows):
            if len(row) != width:
                raise ValueError(f"TokenAutomaton: state {s} has {len(row)} entries, state 0 has {width}")
            bad = [x for x in row if not -1 <= x < len(rows)]
            if bad:
                raise ValueError(f"TokenAutomaton: state {s} goes to {bad[0]}, outside [-1, {len(rows)})")
            if all(x < 0 for x in row):
                raise ValueError(f"TokenAutomaton: state {s} allows no token")
        if not 0 <= self.start < len(rows):
            raise ValueError(f"TokenAutomaton: start state {self.start} outside [0, {len(rows)})")
        object.__setattr__(self, "transitions", rows)

    @property
    def num_states(self) -> int:
        return len(self.transitions)

    @property
    def vocab(self) -> int:
        return len(self.transitions[0])

    def state_after(self, tokens: Sequence[int]) -> int:
        """The state reached by reading ``tokens`` from ``start`` (ValueError at a forbidden token)."""
        state = self.start
        for i, t in enumerate(tokens):
            nxt = self.transitions[state][t]
            if nxt < 0:
                raise ValueError(f"token {t} at generated position {i} is forbidden in state {state}")
            state = nxt
        return state

    def allowed(self, state: int) -> tuple[int, ...]:
        return tuple(v for v, nxt in enumerate(self.transitions[state]) if nxt >= 0)

    def table(self, device) -> torch.Tensor:
        """``Long[S, V]`` transitions on ``device`` (built once per device)."""
        return _table(self, str(torch.device(device)))

    def as_dict(self) -> dict:
        return {"transitions": [list(r) for r in self.transitions], "start": self.start}

    @classmethod
    def forbidding(cls, words: Sequence[Sequence[int]], vocab: int) -> "TokenAutomaton":
        """The automaton of "bad words": token ``w[-1]`` is forbidden wherever the generated tokens end with
        ``w[:-1]`` (a one-token word: everywhere; the prompt is not read, as vLLM's ``bad_words`` reads the output
        only). A state is the longest end of the generated tokens that begins some word (Aho-Corasick); raises
        ValueError when the words forbid every token somewhere."""
        words = [tuple(int(t) for t in w) for w in words]
        if not words or any(not w for w in words) or any(not 0 <= t < vocab for w in words for t in w):
            raise ValueError(f"bad words must be non-empty token-id sequences in [0, {vocab}), got {words!r}")
        begins = {w[:i] for w in words for i in range(len(w))}  # proper beginnings of words, () included

        def state_of(seq: tuple) -> tuple:
            return next(seq[i:] for i in range(len(seq) + 1) if seq[i:] in begins)

        states, index, rows = [()], {(): 0}, []
        for seq in states:  # grows while reading: breadth-first over the reachable states
            row = []
            for v in range(vocab):
                nxt = seq + (v,)
                if any(nxt[len(nxt) - len(w):] == w for w in words if len(w) <= len(nxt)):
                    row.append(-1)
                    continue
                target = state_of(nxt)
                if target not in index:
                    index[target] = len(states)
                    states.append(target)
                row.append(index[target])
            rows.append(tuple(row))
        return cls(tuple(rows))

    def product(self, other: "TokenAutomaton") -> "TokenAutomaton":
        """Both automata at once: a token is allowed where both allow it (reachable state pairs only)."""
        if other.vocab != self.vocab:
            raise ValueError(f"automata over {self.vocab} and {other.vocab} tokens")
        start = (self.start, other.start)
        pairs, index, rows = [start], {start: 0}, []
        for a, b in pairs:
            row = []
            for v in range(self.vocab):
                na, nb = self.transitions[a][v], other.transitions[b][v]
                if na < 0 or nb < 0:
                    row.append(-1)
                    continue
                if (na, nb) not in index:
                    index[(na, nb)] = len(pairs)
                    pairs.append((na, nb))
                row.append(index[(na, nb)])
            rows.append(tuple(row))
        return TokenAutomaton(tuple(rows))


@functools.lru_cache(maxsize=64)
def _table(automaton: TokenAutomaton, device: str) -> torch.Tensor:
    return torch.tensor(automaton.transitions, dtype=torch.long, device=device)


@functools.lru_cache(maxsize=256)
def automaton_of(constraint: "TokenAutomaton | None", bad_words: tuple, vocab: int) -> "TokenAutomaton | None":
    """The automaton a row runs: its constraint, its bad words' (:meth:`TokenAutomaton.forbidding`), their product
    when it has both, or None."""
    words = TokenAutomaton.forbidding(bad_words, vocab) if bad_words else None
    if constraint is None or words is None:
        return constraint or words
    return constraint.product(words)


def forbidden_by(constraint: "TokenAutomaton | None", bad_words: tuple, generated: Sequence[int], token: int) -> str | None:
    """Which of a row's rules forbids ``token`` after its generated tokens ``generated``: ``"grammar"`` (the
    constraint has no transition for it in the state ``generated`` leads to), ``"bad words"`` (``generated`` followed
    by it ends with a banned word), or None (both allow it, or ``generated`` already left the grammar)."""
    token = int(token)
    if constraint is not None and 0 <= token < constraint.vocab:
        try:
            state = constraint.state_after(generated)
        except ValueError:
            state = None
        if state is not None and constraint.transitions[state][token] < 0:
            return "grammar"
    seq = tuple(int(t) for t in generated) + (token,)
    if any(len(w) <= len(seq) and seq[len(seq) - len(w):] == tuple(w) for w in bad_words or ()):
        return "bad words"
    return None
