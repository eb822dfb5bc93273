"""What a decoder returns and receives besides tensors: a round's record, a decode's result, a batched request.

Part of the backend contract (:mod:`specdec_ref.contract` re-exports every name here; its protocols
:class:`~specdec_ref.contract.Decoder` and :class:`~specdec_ref.contract.BatchedDecoder` say what a decoder puts in
them).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .warp import GREEDY, SamplingConfig

__all__ = ["RoundRecord", "DecodeResult", "Request"]


@dataclass
class RoundRecord:
    """What one speculative round did for one request, and its cache lengths right after the repair."""

    round: int
    start: int  # committed length before the round
    proposed: int  # k used this round
    accepted: int  # m: drafts the verifier accepted (before EOS truncation)
    emitted: int  # tokens committed this round (after EOS / max_new_tokens truncation)
    target_len: int
    draft_len: int
    committed_len: int
    target_calls: int  # cumulative
    draft_calls: int  # cumulative
    row: int = 0  # the request's index in the batch it was submitted with
    #: wall seconds of the round's phases, as the decoder reports them (:class:`specdec_ref.contract.Decoder`, "Phase
    #: timings"); None: not reported. Never compared (two decodes of the same request are equal whatever their timings).
    seconds: dict[str, float] | None = field(default=None, compare=False)
    #: what the round drafted (:class:`specdec_ref.contract.Decoder`, "Drafts in the round records"; claimed with
    #: ``round_drafts``): chain rounds the ``proposed`` draft tokens, tree rounds every node's token in the tree
    #: verifier's order; None: not reported.
    drafts: list[int] | None = None
    #: tree rounds: each node's parent (an index into ``drafts``; -1: a child of the root); None otherwise.
    parents: list[int] | None = None
    #: tree rounds: each node's probability in the row it was drawn from, where the drafter reports it; None otherwise.
    #: Never compared (float bookkeeping: the checks compare it with a tolerance).
    draft_probs: list[float] | None = field(default=None, compare=False)

    @property
    def pending(self) -> int:
        return self.committed_len - self.target_len


@dataclass
class DecodeResult:
    """Generated tokens (prompt excluded) and how they were produced."""

    tokens: list[int]
    prompt_len: int
    finished_by: str  # "eos" | "max_new_tokens"
    rounds: list[RoundRecord] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    host_syncs: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(r.proposed for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / proposed if proposed else float("nan")

    @property
    def tokens_per_round(self) -> float:
        return len(self.tokens) / len(self.rounds) if self.rounds else float("nan")

    def as_record(self) -> dict:
        d = asdict(self)
        d["rounds"] = [asdict(r) for r in self.rounds]
        return d


@dataclass
class Request:
    """One request of a batched decode (``decode_batch``): its own prompt, settings, stop ids and randomness.

    ``prompt``: token ids (a list, ``Long[t]`` or ``Long[1, t]``; any length >= 1). ``eos_ids``: ids that end
    generation (an int, a sequence, or None). ``generator`` (a ``torch.Generator``) or ``seed`` (an int; the
    decoder makes the generator) makes the request reproducible; with neither it is *unseeded* and draws
    from the global RNG.
    """

    prompt: Any
    max_new_tokens: int
    sampling: SamplingConfig = GREEDY
    eos_ids: Any = None
    generator: torch.Generator | None = None
    seed: int | None = None
