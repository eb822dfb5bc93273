"""Sampling settings and the logits -> probabilities warp shared by target, draft and AR decoding.

Invariant: target and draft go through the *same* :func:`warp`, so ``q`` handed
to the verifier is exactly the distribution the draft sampled from, and the
target rows are exactly the distribution AR sampling would use.

Order (as in transformers' logits processors): temperature, then top-k, then
top-p (nucleus, keeping the smallest prefix of the sorted distribution whose
mass reaches ``top_p``, always at least one token), then softmax. Which tokens
top-k keeps when logits tie at the k-th largest is a declared convention,
``SamplingConfig.top_k_ties`` (:data:`TOP_K_TIES`): ``"all"`` (the default, Hugging
Face and vLLM) keeps every token tied with the k-th, ``"lowest_ids"`` keeps exactly
k, the smallest ids among the tied ones. Greedy skips
temperature and filtering: its probabilities are ``softmax(logits)`` and the
choice is their first-index argmax.

Each step is a function (:func:`scale_temperature`, :func:`top_k_filter`, :func:`top_p_filter`,
:func:`min_p_filter`; :func:`warp_logits` composes them, :func:`warp` is its softmax), so oracles that
reason about the warped support (``specdec_properties.sequences``) call these very steps instead of
re-implementing them.

History-dependent settings (``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``,
``logit_bias``, ``min_new_tokens``, ``constraint``) need the tokens generated so far: they are applied
by :mod:`specdec_ref.history` *before* this warp, at every position on that position's own (possibly
hypothetical) history; :func:`warp` alone only applies temperature, top-k, top-p and min-p. ``min_p``
(keep tokens with ``p >= min_p * max p``) comes last, after top-p, as in transformers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .automaton import TokenAutomaton


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen.

    ``greedy=True`` takes the first-index argmax and ignores ``temperature``, ``top_k``, ``top_p`` and
    ``min_p``; the history-dependent settings (penalties, ``logit_bias``, ``min_new_tokens``,
    ``constraint``, ``bad_words``) apply to greedy and sampling alike (see :mod:`specdec_ref.history` for their exact
    definitions and order). ``logit_bias`` may be given as a dict; it is stored as sorted
    ``(token, bias)`` pairs so that the config stays hashable. ``top_k_ties`` is the top-k tie rule
    (:data:`TOP_K_TIES`, :func:`top_k_filter`): ``"all"`` keeps every token tied with the k-th largest
    logit (more than k tokens at a tie), ``"lowest_ids"`` keeps exactly k, breaking ties at the boundary
    by the smallest id. ``bad_words``: token-id sequences; a word's last token is forbidden wherever the generated
    tokens end with the rest of it (stored as a tuple of tuples; :meth:`specdec_ref.automaton.TokenAutomaton.forbidding`).
    """

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Any = ()
    min_new_tokens: int = 0
    constraint: "TokenAutomaton | None" = field(default=None)
    top_k_ties: str = "all"
    bad_words: Any = ()

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r} (use greedy=True for argmax)")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if not (isinstance(self.top_k_ties, str) and self.top_k_ties in TOP_K_TIES):
            raise ValueError(
                f"top_k_ties must be one of {', '.join(repr(t) for t in TOP_K_TIES)} (the top-k tie rule: 'all' keeps every "
                f"token tied with the k-th largest logit, 'lowest_ids' keeps exactly k, the smallest ids), got {self.top_k_ties!r}"
            )
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")
        if self.min_p is not None and not (_real(self.min_p) and 0 < self.min_p <= 1):
            raise ValueError(f"min_p must be in (0, 1] or None, got {self.min_p!r}")
        if not (_real(self.repetition_penalty) and math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (_real(value) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number (0 = off), got {value!r}")
        if isinstance(self.min_new_tokens, bool) or not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an int >= 0, got {self.min_new_tokens!r}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        if self.constraint is not None:
            if not isinstance(self.constraint, TokenAutomaton):
                raise ValueError(f"constraint must be a specdec_ref.history.TokenAutomaton or None, got {type(self.constraint).__name__}")
        object.__setattr__(self, "bad_words", _words(self.bad_words))

    @property
    def history_dependent(self) -> bool:
        """Whether a token's probabilities depend on the tokens before it (penalties, bias, min_new_tokens, constraint)."""
        return bool(
            self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty or self.logit_bias
            or self.min_new_tokens or self.constraint is not None or self.bad_words
        )

    def as_dict(self) -> dict:
        """The settings as JSON-ready values (defaults that are off included, so records are uniform)."""
        return {
            "greedy": self.greedy, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
            "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "logit_bias": [list(pair) for pair in self.logit_bias], "min_new_tokens": self.min_new_tokens,
            "constraint": None if self.constraint is None else self.constraint.as_dict(),
            "top_k_ties": self.top_k_ties, "bad_words": [list(w) for w in self.bad_words],
        }

    def label(self) -> str:
        """``"temperature=0.7, top_k=2, frequency_penalty=0.5"``: the settings that are on, for messages."""
        off = {"greedy": False, "temperature": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, "logit_bias": [], "min_new_tokens": 0, "top_k_ties": "all",
               "bad_words": []}
        on = {k: v for k, v in self.as_dict().items() if v is not None and off.get(k, None) != v}
        if self.constraint is not None:
            on["constraint"] = f"{self.constraint.num_states}-state automaton"
        return ", ".join(f"{k}={v}" for k, v in on.items()) or "temperature=1.0"


#: The top-k tie rules :attr:`SamplingConfig.top_k_ties` takes (the first is the default).
TOP_K_TIES = ("all", "lowest_ids")


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _words(words) -> tuple[tuple[int, ...], ...]:
    """``bad_words`` as a tuple of non-empty tuples of token ids >= 0 (ValueError otherwise)."""
    try:
        out = tuple(tuple(w) for w in words)
    except TypeError:
        raise ValueError(f"bad_words must be token-id sequences, got {words!r}") from None
    for w in out:
        if not w or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in w):
            raise ValueError(f"bad_words: each word is a non-empty sequence of token ids >= 0, got {list(w)!r}")
    return out


def _bias_pairs(bias) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted ``(token, bias)`` pairs; ValueError for negative ids, repeats or non-finite biases."""
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(tok, b) for tok, b in items]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must be a dict or (token, bias) pairs, got {bias!r}") from None
    out = []
    for tok, b in pairs:
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ValueError(f"logit_bias: token ids must be ints >= 0, got {tok!r}")
        if not (_real(b) and math.isfinite(b)):
            raise ValueError(f"logit_bias: bias of token {tok} must be a finite number, got {b!r}")
        out.append((tok, float(b)))
    if len({t for t, _ in out}) != len(out):
        raise ValueError(f"logit_bias names a token twice: {bias!r}")
    return tuple(sorted(out))


GREEDY = SamplingConfig(greedy=True)


def scale_temperature(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """``x / temperature`` (``x`` itself at temperature 1)."""
    return x / temperature if temperature != 1.0 else x


def top_k_filter(x: torch.Tensor, k: int | None, ties: str = "all") -> torch.Tensor:
    """``x`` with every token outside its row's top k set to ``-inf``.

    ``ties="all"``: every entry below the k-th largest is dropped, so tokens tied with the k-th are all kept
    (more than k at a tie). ``ties="lowest_ids"``: exactly k tokens are kept, the largest, and among tokens
    tied at the boundary the smallest ids (a stable descending sort).
    """
    if k is None or k >= x.shape[-1]:
        return x
    if ties == "all":
        kth = torch.topk(x, k, dim=-1).values[..., -1:]
        return x.masked_fill(x < kth, float("-inf"))
    if ties != "lowest_ids":
        raise ValueError(f"top-k ties must be one of {TOP_K_TIES}, got {ties!r}")
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices  # equal values keep their id order
    drop = torch.ones_like(x, dtype=torch.bool).scatter(-1, order[..., :k], False)
    return x.masked_fill(drop, float("-inf"))


def nucleus_masses(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, sorted_p, mass_before)`` of ``x`` sorted descending: the sort permutation, the
    softmax of the sorted row and the probability mass strictly before each sorted token."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_x, dim=-1)
    return order, sorted_p, sorted_p.cumsum(-1) - sorted_p


def top_p_filter(x: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """``x`` with ``-inf`` outside the smallest sorted prefix whose mass reaches ``top_p`` (at least one token)."""
    if top_p is None or top_p >= 1.0:
        return x
    order, _, mass_before = nucleus_masses(x)
    drop_sorted = mass_before >= top_p  # keep tokens until the kept mass reaches top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def min_p_filter(x: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """``x`` with ``-inf`` where ``softmax(x) < min_p * max softmax(x)``, i.e. ``x < max x + log(min_p)`` (the max is kept)."""
    if min_p is None:
        return x
    top = x.max(-1, keepdim=True).values
    return x.masked_fill(x < top + math.log(min_p), float("-inf"))


def warp_logits(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The logits ``[..., V]`` (in ``dtype``) that :func:`warp` takes the softmax of.

    Temperature-scaled, then top-k, top-p and min-p filtered (dropped tokens are ``-inf``); greedy
    returns the logits cast to ``dtype``. History-dependent settings are not applied here
    (:func:`specdec_ref.history.process_logits` applies them first).
    """
    x = logits.to(dtype)
    if config.greedy:
        return x
    x = scale_temperature(x, config.temperature)
    x = top_k_filter(x, config.top_k, config.top_k_ties)
    x = top_p_filter(x, config.top_p)
    return min_p_filter(x, config.min_p)


def warp(logits: torch.Tensor, config: SamplingConfig, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Probabilities ``[..., V]`` (in ``dtype``) that ``config`` samples from, given raw logits."""
    return torch.softmax(warp_logits(logits, config, dtype), dim=-1)
