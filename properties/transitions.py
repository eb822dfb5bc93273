"""The law of every generated token given its context: pooled transition counts against the exact law.

A speculative engine samples the first generated token from the prefill, before any draft exists; the
tokens after it are where drafts are accepted, rejected and repaired. A test of the law of the first
``L`` tokens of a completion needs the cells of every continuation, so at the sample sizes people
produce (20 000 completions) ``L`` is often 1, and no drafted token is tested at all.

This module tests *every* generated position after the first at once. Position ``i`` of a completion
(1-based; the first generated token is position 1) was drawn, under the null, from the target's
processed next-token law given the prompt and the ``i - 1`` tokens before it
(:func:`specdec_properties.sequences.next_token_law`, history settings included). Positions whose exact
conditional laws are identical form one *context class* (for the order-1 checkpoints: the last
token; for order-2: the last two tokens and the position's parity; with penalties, more classes),
and the counts of (class, next token) are tested with
:func:`specdec_properties.stats.conditional_goodness_of_fit`, the goodness-of-fit test of a chain's
transitions. The classes are found by computing the law of every visited context exactly, never by
assuming the model's order, so the test is valid for any settings.

What each test sees: the transition test sees any bias in the conditional law of the tokens after
the first that survives averaging over the visits of a class (a wrong residual, a stale K/V entry, a
wrong position, a penalty on the wrong history, a sampling parameter read from the wrong request),
with power from *all* positions pooled, which grows with the number of generated tokens. It is
blind to a bias that cancels within a class: a law that is right on average over the histories of a
context class but wrong for each (say, wrong after a rejected draft, right after an accepted one, in
proportions that balance). The full-law test of the first ``L`` tokens (``conformance.samples``)
sees any dependence across those positions but needs many more samples per token.

A token the exact law of its context gives probability 0 (say ``<bos>`` inside an ``order2``
completion, or a token top-k drops) is the engine's failure, and the contexts after it are outside the
law's support (for ``order2`` not even defined). :func:`first_impossible` walks the completions
position by position and finds each one's first such token without evaluating any context past it;
given that list, :func:`count_transitions` counts a completion up to that token (an impossible
outcome of its class) and excludes the tokens after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np
import torch

from specdec_properties.history_law import eos_set
from specdec_properties.sequences import next_token_law, processed_logits64
from specdec_properties.stats import ALPHA, TV, FitResult, conditional_goodness_of_fit
from specdec_ref.warp import SamplingConfig, warp, warp_logits

__all__ = [
    "ContextClass", "TransitionCounts", "ImpossibleToken", "count_transitions", "first_impossible", "tie_split_mask",
    "transition_test", "FIRST_TESTED_POSITION", "AFTER_IMPOSSIBLE",
]

#: Position 1 is sampled from the prefill; the transition test covers positions 2, 3, ...
FIRST_TESTED_POSITION = 2
#: Laws equal to this many decimals are one class (they come from one table row through the same float64 code).
_CLASS_DECIMALS = 12
#: Why the tokens after a completion's first impossible token are not tested (``TransitionCounts.excluded``).
AFTER_IMPOSSIBLE = "after a token of probability 0 (its context is outside the law's support)"
_SPLIT = "a top-p cut splits tied logits (which tied token survives is implementation-defined)"


@dataclass
class ContextClass:
    """Positions whose next-token law is one and the same vector ``probs``."""

    probs: np.ndarray
    example: tuple[int, ...]  # one visited context (prompt + generated prefix), for the reader
    contexts: int = 0  # distinct contexts in the class
    counts: dict[int, np.ndarray] = field(default_factory=dict)  # position -> next-token counts

    def name(self) -> str:
        """``ctx [6, 0, 4] +8 alike``: one visited context (prompt + prefix) and how many others share its law."""
        more = f" +{self.contexts - 1} alike" if self.contexts > 1 else ""
        return f"ctx {list(self.example)}{more}"


@dataclass
class TransitionCounts:
    """Every tested transition of a file, by class and position; ``excluded``: why some were not tested."""

    vocab: int
    classes: list[ContextClass]
    positions: list[int]  # the generated positions (1-based) that have at least one transition
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(sum(c.sum() for cl in self.classes for c in cl.counts.values()))

    def groups(self, positions: Iterable[int] | None = None) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """``(name, counts, probs)`` per class, pooled over ``positions`` (default: all)."""
        wanted = None if positions is None else set(positions)
        out = []
        for cl in self.classes:
            counts = np.zeros(self.vocab, dtype=np.int64)
            for pos, c in cl.counts.items():
                if wanted is None or pos in wanted:
                    counts += c
            if counts.sum():
                out.append((cl.name(), counts, cl.probs))
        return out


def tie_split_mask(rows: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Bool ``[F, V]``: tokens a top-p cut drops although they tie with the lowest token it keeps.

    ``rows``: processed logits (history steps applied, before temperature). Where a row has one, the law is not
    determined by the settings (which tied token survives depends on how the sampler sorts equal values). Only
    tokens top-k kept count: a top-k cut through a tie is decided by ``config.top_k_ties``, and min-p never
    separates equal logits.
    """
    if config.greedy or config.top_p is None:
        return torch.zeros(rows.shape, dtype=torch.bool)
    kept = warp(rows, config, dtype=torch.float64) > 0
    after_top_k = torch.isfinite(warp_logits(rows, replace(config, top_p=None, min_p=None), dtype=torch.float64))
    lowest = torch.where(kept, rows, torch.full_like(rows, float("inf"))).min(-1, keepdim=True).values
    return after_top_k & ~kept & (rows == lowest)


def _tie_split(rows: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Bool per row: a top-p cut drops a token tied with the lowest kept one (the law is then not determined)."""
    return tie_split_mask(rows, config).any(-1)


@dataclass(frozen=True)
class ImpossibleToken:
    """A completion's first generated token of probability 0 under the exact law of its context."""

    index: int  # the completion's index among those given
    position: int  # 1-based generated position
    context: tuple[int, ...]  # prompt + the generated tokens before it
    token: int


def _ends(completion: Sequence[int], eos: set, stop=None) -> int:
    """How many tokens of ``completion`` the law covers: up to and including its first EOS, or the token that
    completes its first stop string (``stop``: a :class:`specdec_properties.stops.StopStrings`), whichever comes first."""
    end = len(completion)
    for i, t in enumerate(completion):
        if t in eos:
            end = i + 1
            break
    stopped = stop.end(completion[:end]) if stop is not None else None
    return end if stopped is None else stopped


def first_impossible(
    model, completions: Iterable[tuple[Sequence[int], Sequence[int]]], config: SamplingConfig, *, eos_id=None,
    max_position: int | None = None, stop=None,
) -> list[ImpossibleToken | None]:
    """Per completion, its first token (up to the first EOS or completed stop string (``stop``) and ``max_position``)
    that the exact law of its context gives probability 0.

    Walks every completion position by position (one batched law per prompt and position) and stops a completion at
    its first impossible token, so no context past one is evaluated (it may not be a context the model defines).
    Where a top-p cut splits tied logits (:func:`tie_split_mask`) the tied tokens it drops count as possible.
    """
    eos = set(eos_set(eos_id))
    items = [(tuple(int(t) for t in p), [int(t) for t in c]) for p, c in completions]
    ends = [_ends(c, eos, stop) if max_position is None else min(_ends(c, eos, stop), max_position) for _, c in items]
    out: list[ImpossibleToken | None] = [None] * len(items)
    alive = [i for i in range(len(items)) if ends[i] > 0]
    pos = 1
    while alive:
        visits: dict[tuple[int, ...], dict[tuple[int, ...], list[int]]] = {}
        for i in alive:
            prompt, completion = items[i]
            visits.setdefault(prompt, {}).setdefault(tuple(completion[: pos - 1]), []).append(i)
        survivors = []
        for prompt, prefixes in visits.items():
            keys = list(prefixes)
            rows = processed_logits64(model, list(prompt), keys, config, eos_id=eos_id)
            possible = (warp(rows, config, dtype=torch.float64) > 0) | tie_split_mask(rows, config)
            for key, allowed in zip(keys, possible.tolist()):
                for i in prefixes[key]:
                    token = items[i][1][pos - 1]
                    if not allowed[token]:
                        out[i] = ImpossibleToken(i, pos, prompt + key, token)
                    elif ends[i] > pos:
                        survivors.append(i)
        alive, pos = survivors, pos + 1
    return out


def count_transitions(
    model,
    completions: Iterable[tuple[Sequence[int], Sequence[int]]],
    config: SamplingConfig,
    *,
    eos_id=None,
    first_position: int = FIRST_TESTED_POSITION,
    max_position: int | None = None,
    impossible: Sequence[ImpossibleToken | None] | None = None,
    stop=None,
) -> TransitionCounts:
    """Count (context class, next token) over generated positions ``first_position..max_position``.

    ``completions``: ``(prompt_ids, completion_ids)`` pairs. Tokens after the first EOS or completed stop string
    (``stop``; an invariant violation, reported elsewhere) are not counted; contexts whose law a top-p cut splits between tied
    logits are excluded and counted in ``excluded``. ``impossible``: :func:`first_impossible` of the same
    completions; a completion is then counted up to its first impossible token (an impossible outcome of its
    class) and the tokens after it are excluded (:data:`AFTER_IMPOSSIBLE`). Without it, a completion whose
    context leaves the law's support may reach a context the model does not define (a ValueError).
    """
    eos = set(eos_set(eos_id))
    visits: dict[tuple[int, ...], dict[tuple[int, ...], list[int]]] = {}  # prompt -> prefix -> [tokens...] per pos
    positions: set[int] = set()
    excluded: dict[str, int] = {}
    for index, (prompt, completion) in enumerate(completions):
        prompt = tuple(int(t) for t in prompt)
        completion = [int(t) for t in completion]
        end = _ends(completion, eos, stop)
        bad = impossible[index] if impossible is not None else None
        if bad is not None:
            after = range(max(bad.position + 1, first_position), (end if max_position is None else min(end, max_position)) + 1)
            if len(after):
                excluded[AFTER_IMPOSSIBLE] = excluded.get(AFTER_IMPOSSIBLE, 0) + len(after)
            end = bad.position
        last = end if max_position is None else min(end, max_position)
        per_prompt = visits.setdefault(prompt, {})
        for pos in range(first_position, last + 1):
            per_prompt.setdefault(tuple(completion[: pos - 1]), []).append(completion[pos - 1])
            positions.add(pos)
    classes: dict[bytes, ContextClass] = {}
    vocab = None
    for prompt, prefixes in visits.items():
        keys = sorted(prefixes)
        laws = next_token_law(model, list(prompt), keys, config, eos_id=eos_id).cpu().numpy()
        split = _tie_split(processed_logits64(model, list(prompt), keys, config, eos_id=eos_id), config)
        vocab = laws.shape[-1]
        for prefix, law, bad in zip(keys, laws, split.tolist()):
            tokens = prefixes[prefix]
            if bad:
                excluded[_SPLIT] = excluded.get(_SPLIT, 0) + len(tokens)
                continue
            key = np.round(law, _CLASS_DECIMALS).tobytes()
            cl = classes.get(key)
            if cl is None:
                cl = classes[key] = ContextClass(probs=law, example=prompt + prefix)
            cl.contexts += 1
            pos = len(prefix) + 1
            counts = cl.counts.setdefault(pos, np.zeros(vocab, dtype=np.int64))
            np.add.at(counts, np.asarray(tokens, dtype=np.int64), 1)
    if vocab is None:
        vocab = int(getattr(model, "vocab", 0) or 0)
    return TransitionCounts(vocab=vocab, classes=list(classes.values()), positions=sorted(positions), excluded=excluded)


def transition_test(counts: TransitionCounts, *, what: str, positions: Iterable[int] | None = None,
                    alpha: float = ALPHA, tv: float = TV, possible_only: bool = False) -> FitResult:
    """The pooled transition test over ``positions`` (default: every counted position).

    ``possible_only``: leave out the tokens their class's law gives probability 0 (impossible outcomes), so the test
    says whether the rest of a file that holds some follows the law (a diagnostic: the impossible tokens fail it anyway).
    """
    labels = [str(t) for t in range(counts.vocab)]
    groups = counts.groups(positions)
    if possible_only:
        groups = [(name, np.where(probs > 0, c, 0), probs) for name, c, probs in groups]
        groups = [g for g in groups if g[1].sum()]
    return conditional_goodness_of_fit(groups, what=what, labels=labels, alpha=alpha, tv=tv)
