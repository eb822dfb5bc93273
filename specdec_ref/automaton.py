"""Grammar constraints as token automata: which tokens a state allows and where each leads.

:class:`TokenAutomaton` is the value of ``SamplingConfig.constraint`` (``specdec_ref.warp``); the per-row state
machine that applies it while decoding lives in :mod:`specdec_ref.history` (which re-exports the class).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["TokenAutomaton"]


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


@functools.lru_cache(maxsize=64)
def _table(automaton: TokenAutomaton, device: str) -> torch.Tensor:
    return torch.tensor(automaton.transitions, dtype=torch.long, device=device)
