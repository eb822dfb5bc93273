"""Stop strings: a deterministic stopping rule on the generated text, and the text an engine must return.

Rule: a sequence of generated tokens is rendered as the concatenation of each token's *piece* (its text behind the
engine's token prefix: ``"t3"`` for llama.cpp, ``" t3"`` for vLLM's detokenizer on the exactly-known vocabulary;
special tokens render as nothing). Generation stops at the first token whose piece completes an occurrence of any
stop string in the generated text (never the prompt's): that token is the last one returned, earlier stop strings
win over later-listed ones only by completing earlier, and the returned text ends where the earliest-starting stop
string found in the stopped text begins (the stop string itself is not returned). Like EOS, the rule depends only on
the tokens so far, so the law of stopped sequences is the sampling law with every stopped prefix a leaf
(:func:`specdec_properties.sequences.continuation_law`'s ``stop``) and the law of each token given its context is
unchanged (the transition tests need no change beyond where a completion ends).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["StopStrings"]


@dataclass(frozen=True)
class StopStrings:
    """The stopping rule of ``strings`` (may be empty: the rendering alone) on a vocabulary whose token ``i`` renders
    as ``pieces[i]``."""

    strings: tuple[str, ...]
    pieces: tuple[str, ...]
    prefix: str = ""  # what every piece starts with (stated on replay command lines)

    def __post_init__(self):
        if any(not isinstance(s, str) or not s for s in self.strings):
            raise ValueError(f"stop strings must be non-empty strings, got {self.strings!r}")

    @classmethod
    def for_model(cls, model, strings: Sequence[str], prefix: str = "") -> "StopStrings":
        """The rule on an exactly-known model's vocabulary (``token_names()``; its BOS and EOS render as nothing),
        each piece ``prefix + name``."""
        names = model.token_names() if callable(getattr(model, "token_names", None)) else None
        if names is None:
            raise ValueError(f"stop strings need the model's token texts; {type(model).__name__} has no token_names()")
        specials = {getattr(model, "bos_id", None), getattr(model, "eos_id", None)}
        return cls(tuple(strings), tuple("" if i in specials else prefix + n for i, n in enumerate(names)), prefix)

    def text(self, tokens: Sequence[int]) -> str:
        """The generated text of ``tokens``, nothing cut."""
        return "".join(self.pieces[int(t)] for t in tokens)

    def end(self, tokens: Sequence[int]) -> int | None:
        """How many tokens generation keeps: up to and including the first that completes a stop string (None:
        no stop string completes in ``tokens``)."""
        if not self.strings:
            return None
        text = ""
        for j, t in enumerate(tokens, 1):
            piece = self.pieces[int(t)]
            if not piece:
                continue
            start = max(0, len(text) - max(map(len, self.strings)) + 1)
            text += piece
            if any(s in text[start:] for s in self.strings):
                return j
        return None

    def __call__(self, tokens: Sequence[int]) -> bool:
        """Whether the last of ``tokens`` completes a stop string first (the sequence is stopped there)."""
        return len(tokens) > 0 and self.end(tokens) == len(tokens)

    def matched(self, tokens: Sequence[int]) -> str | None:
        """The stop string that stops ``tokens`` (the earliest-starting one in the stopped text), or None."""
        j = self.end(tokens)
        if j is None:
            return None
        text = self.text(tokens[:j])
        return min((s for s in self.strings if s in text), key=lambda s: (text.index(s), self.strings.index(s)))

    def returned_text(self, tokens: Sequence[int]) -> str:
        """The text an engine returns for ``tokens`` (the tokens it returned): cut before the stop string that
        stopped them, whole when none did."""
        j = self.end(tokens)
        if j is None:
            return self.text(tokens)
        text = self.text(tokens[:j])
        return text[: text.index(self.matched(tokens))]

    def departure(self, tokens: Sequence[int], got: str) -> str | None:
        """How a returned text ``got`` departs from :meth:`returned_text` of ``tokens`` (None: it does not):
        ``not_cut`` (the stop string left in), ``held_back`` (no stop completed, the text short of its end, which
        begins a stop string: held back in case it completes), ``missing_end``, ``past_end``, or ``other``."""
        want = self.returned_text(tokens)
        if got == want:
            return None
        stopped = self.end(tokens) is not None
        if stopped and got == self.text(tokens[: self.end(tokens)]):
            return "not_cut"
        if want.startswith(got):
            held = len(want) - len(got)
            if not stopped and any(want.endswith(s[:i]) for s in self.strings for i in range(1, min(len(s), held + 1))):
                return "held_back"
            return "missing_end"
        return "past_end" if got.startswith(want) else "other"

    def label(self) -> str:
        strings = "stop " + ", ".join(repr(s) for s in self.strings) if self.strings else "no stop strings"
        return strings + (f" (token prefix {self.prefix!r})" if self.prefix else "")
