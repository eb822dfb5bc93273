"""Proposers: where a speculative round's drafts come from (the seam between the decoder and its drafter).

What a caller passes as ``draft`` to :meth:`~specdec_ref.decode.SpeculativeDecoder.decode` /
``decode_batch`` is a *proposer spec*:

* a causal LM: the **draft model** (:class:`DraftModelProposer`), drafting autoregressively from its own KV cache;
* :class:`Ngram`: **prompt lookup** (:class:`NgramProposer`), drafts copied from an earlier occurrence of the text's
  last tokens, no model at all;
* a head on the target's hidden states (:mod:`specdec_ref.heads`: EAGLE, EAGLE-3, Medusa, MTP).

The decoder opens the spec once per call (:func:`open_proposer`) into a :class:`Proposer` over the batch's rows, then
every round asks it for drafts and tells it what was committed. The contract every proposer keeps:

* ``propose`` returns ``drafts [B, k]``, and either ``q [B, k, V]`` (``q[b, i]`` is exactly the distribution
  ``drafts[b, i]`` was drawn from, processed with the row's settings on its hypothetical history, as for a draft
  model) or ``None``: the drafts are *one-hot* (deterministic given the context; the verifier then judges them against
  ``q = one_hot(d)``, which is exact under every scheme). ``counts`` (or ``None`` = all ``k``) gives rows that draft
  fewer: row ``b`` proposes ``drafts[b, :counts[b]]`` (prompt lookup without a match proposes nothing).
* After the verify forward the decoder passes the target's hidden states of the block (:meth:`Proposer.observe`:
  the layers in ``target_capture``), then :meth:`Proposer.repair` with each row's new length: the proposer rolls its
  state back to exactly the committed text but the pending last token, as the caches are (``row(b)``'s
  ``tentative_length`` is that length: the decoder's invariant ``target_len == draft_len == committed_len - 1``).
* Rows leave with :meth:`Proposer.select`; a row's drafts depend on its own text, settings and generator only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .contract import NotSupportedError
from .draws import choose_rows

__all__ = ["Proposer", "DraftModelProposer", "Ngram", "NgramProposer", "open_proposer", "is_model", "proposer_kind",
           "PROPOSER_KINDS", "roll_back_draft"]

#: The proposer kinds a decoder may claim (``Capabilities.proposers``).
PROPOSER_KINDS = ("draft_model", "ngram", "eagle", "eagle3", "medusa", "mtp")


def is_model(spec) -> bool:
    """Whether ``spec`` is a draft model (a torch module with parameters) rather than another proposer spec."""
    return isinstance(spec, torch.nn.Module) and not getattr(spec, "proposer_kind", None)


def proposer_kind(spec) -> str:
    """The kind of a proposer spec (``"draft_model"`` for a model)."""
    if is_model(spec):
        return "draft_model"
    kind = getattr(spec, "proposer_kind", None)
    if kind not in PROPOSER_KINDS:
        raise ValueError(f"draft must be a draft model or a proposer spec ({', '.join(PROPOSER_KINDS)}), got "
                         f"{type(spec).__name__}")
    return kind


class _Lengths:
    """A proposer's per-row view for ``on_round``: its length (the committed text but the pending token) and the K/V
    it holds (none for a proposer without a cache)."""

    def __init__(self, owner: "Proposer", b: int):
        self._owner, self._b = owner, b

    @property
    def tentative_length(self) -> int:
        return self._owner.lengths[self._b]

    committed_length = tentative_length

    def layer_kv(self) -> list:
        return self._owner.row_kv(self._b)


class Proposer:
    """One decode call's drafter over the live rows (see the module docstring); subclasses implement it."""

    kind = "?"
    #: The target hidden states the proposer reads (``StaticModelCache.capture`` keys); empty: none.
    target_capture: tuple = ()
    #: Positions the proposer can hold (None: unbounded); the decoder never drafts past it.
    max_positions: int | None = None

    def __init__(self, draft_probs, lengths: Sequence[int]):
        """``draft_probs(logits [B, 1, V], configs, state, drafts [B, i])``: the decoder's rule for a draft's
        distributions (to sample from, and reported as ``q``; ``SpeculativeDecoder.draft_probs``, which mutants
        override); a sampling proposer draws with it and calls nothing else of the decoder's. ``lengths``: each row's
        positions held (its committed text but the pending token)."""
        self.draft_probs = draft_probs
        self.lengths = list(lengths)

    @property
    def draft_cache(self):
        """The draft side as the decoder's repair step and ``on_round`` see it: the proposer itself, which rolls its
        own state back (:meth:`repair`) and gives each row's view (:meth:`row`); a draft model gives its row caches."""
        return self

    def ready(self) -> bool:
        """Whether every live row can draft this round (a head needs one target forward past the prompt first)."""
        return True

    def plain_step(self, pending: torch.Tensor) -> int:
        """A round without drafts (no room, or not ready): follow the pending tokens; returns the drafter calls spent."""
        return 0

    def propose(self, pending: torch.Tensor, k: int, configs, state, generator):
        """``(drafts [B, k], q [B, k, V] | None, counts | None, calls)`` for the live rows."""
        raise NotImplementedError

    def observe(self, features: dict, starts: Sequence[int]) -> None:
        """The target's hidden states of the last forward (``{layer: [B, n, H]}``, row ``b``'s block starting at
        position ``starts[b]``)."""

    def repair(self, drafts: torch.Tensor, new_lens: Sequence[int], fed_all: Sequence[bool]) -> int:
        """Hold exactly ``new_lens[b]`` positions of row ``b`` (committed text but the pending token); returns calls."""
        self.lengths = list(new_lens)
        return 0

    def commit_tokens(self, b: int, tokens: Sequence[int]) -> None:
        """Row ``b`` committed ``tokens`` this round (host ids; called before :meth:`repair`)."""

    def select(self, rows: Sequence[int]) -> None:
        self.lengths = [self.lengths[i] for i in rows]

    def row(self, b: int):
        return _Lengths(self, b)

    def row_kv(self, b: int) -> list:
        return []


class DraftModelProposer(Proposer):
    """The draft model: its own KV cache of the rows (:class:`~specdec_ref.row_cache.RowCaches`), drafting one token
    per call with the decoder's ``draft_probs``, rolled back by :func:`roll_back_draft`."""

    kind = "draft_model"

    def __init__(self, draft_probs, cache):
        super().__init__(draft_probs, cache.tentative)
        self.cache = cache
        self.max_positions = cache.cache.max_positions or None

    @property
    def draft_cache(self):
        return self.cache

    def plain_step(self, pending):
        self.cache.feed(pending)
        return 1

    def propose(self, pending, k, configs, state, generator):
        """Feed the pending tokens, then draft ``k`` tokens per row, draft ``i + 1`` drawn from ``draft_probs`` of the
        draft's logits on the row's history plus ``d_1..d_i``; the cache ends ``k`` positions further but ``d_k``."""
        tokens, qs = [], []
        x = pending
        for _ in range(k):
            logits = self.cache.feed(x)[:, -1:]
            sample_probs, q = self.draft_probs(logits, configs, state, torch.stack(tokens, 1) if tokens else pending[:, :0])
            token = choose_rows(sample_probs, configs, generator)
            tokens.append(token)
            qs.append(q)
            x = token[:, None]
        return torch.stack(tokens, 1), torch.stack(qs, 1), None, k

    def repair(self, drafts, new_lens, fed_all):
        return roll_back_draft(self.cache, drafts, new_lens, fed_all)

    def select(self, rows):
        self.cache.select(rows)

    def row(self, b):
        return self.cache.row(b)


def roll_back_draft(cache, drafts: torch.Tensor, new_lens: Sequence[int], fed_all: Sequence[bool]) -> int:
    """A draft model's row caches after a round: feed ``d_k`` to the rows that accepted every draft (they never fed
    it), then hold exactly ``new_lens[b]`` positions of row ``b``; returns the draft calls spent (0 or 1)."""
    calls = 0
    if any(fed_all):
        cache.feed(drafts[:, -1:], advance=fed_all)
        calls = 1
    cache.commit(new_lens)
    return calls


# ----------------------------------------------------------------------------- prompt lookup


@dataclass(frozen=True)
class Ngram:
    """Prompt lookup (n-gram) proposals, vLLM's ``method="ngram"`` semantics.

    The pattern is the text's last ``n`` tokens (prompt and generated, the pending token included) for the largest
    ``n`` in ``[min_n, max_n]`` that occurs earlier in the text; the drafts are the up to ``k`` tokens that follow its
    first occurrence (fewer when the text ends sooner; none when nothing matches). One-hot: the drafts are a function
    of the text."""

    min_n: int = 1
    max_n: int = 3
    proposer_kind = "ngram"

    def __post_init__(self):
        for name in ("min_n", "max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Ngram.{name} must be an int >= 1, got {value!r}")
        if self.min_n > self.max_n:
            raise ValueError(f"Ngram.min_n ({self.min_n}) exceeds max_n ({self.max_n})")

    def open(self, decoder, target, batch, k, tokens, target_cache):
        return self.proposer_type(decoder.draft_probs, self, tokens)

    def lookup(self, text: Sequence[int], k: int) -> list[int]:
        """The drafts for ``text`` (a list of ids): see the class docstring."""
        text = list(text)
        for n in range(min(self.max_n, len(text) - 1), self.min_n - 1, -1):
            pattern = text[-n:]
            for start in range(len(text) - n):  # occurrences that end before the text does
                if text[start:start + n] == pattern:
                    return text[start + n:start + n + k]
        return []


class NgramProposer(Proposer):
    """:class:`Ngram` over the live rows: each row's text is kept on the host (prompt + committed tokens)."""

    kind = "ngram"

    def __init__(self, draft_probs, spec: Ngram, texts: Sequence[list[int]]):
        super().__init__(draft_probs, [len(t) - 1 for t in texts])
        self.spec = spec
        self.texts = [list(t) for t in texts]

    def lookup(self, b: int, k: int) -> list[int]:
        """Row ``b``'s drafts (mutants override this)."""
        return self.spec.lookup(self.texts[b], k)

    def propose(self, pending, k, configs, state, generator):
        found = [self.lookup(b, k) for b in range(len(self.texts))]
        drafts = torch.zeros(len(found), k, dtype=torch.long)
        for b, ids in enumerate(found):
            if ids:
                drafts[b, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        return drafts.to(pending.device), None, [len(ids) for ids in found], 0

    def commit_tokens(self, b, tokens):
        self.texts[b].extend(tokens)

    def select(self, rows):
        super().select(rows)
        self.texts = [self.texts[i] for i in rows]


Ngram.proposer_type = NgramProposer  # the class a spec opens (a mutant's copy names its buggy subclass)


# ----------------------------------------------------------------------------- opening a spec


def open_proposer(decoder, target, spec, batch, k: int, tokens: Sequence[list[int]], target_cache, open_cache):
    """The :class:`Proposer` for ``spec`` over the batch's rows (``tokens``: the prompts as host lists;
    ``open_cache(make_cache, model)`` opens a row cache holding the prompts but their last tokens). A spec other than
    a model opens itself (``spec.open(decoder, target, batch, k, tokens, target_cache)``)."""
    kind = proposer_kind(spec)
    if kind == "draft_model":
        cache, _ = open_cache(decoder.make_draft_cache, spec)
        return DraftModelProposer(decoder.draft_probs, cache)
    opener = getattr(spec, "open", None)
    if opener is None:
        raise NotSupportedError(f"the reference decoder cannot open this {kind} proposer ({type(spec).__name__})")
    return opener(decoder, target, batch, k, tokens, target_cache)
