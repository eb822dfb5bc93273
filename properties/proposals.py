"""Exact proposal laws of the exactly-known proposers, and the exact acceptance of a round that uses them.

Independent of the reference's proposers (:mod:`specdec_ref.proposers`, :mod:`specdec_ref.heads`): everything is
float64 numpy on the order-1 tables (:mod:`specdec_ref.exact`) and the heads' table descriptions
(:mod:`specdec_ref.exact.heads`), never their weights or code.

A proposal law answers: at a round that starts from the text ``h`` (prompt and committed tokens, the pending token
last), after drafts ``d_1 .. d_i-1``, what is the law of ``d_i``? The raw logits come from the tables, the row's
settings are applied on the hypothetical history ``generated + drafts`` as for a draft model
(:func:`specdec_properties.history_law.history_logits`), then the draft is the argmax of the processed logits (one-hot
proposers: the law is a point mass) or a sample of the warped law.

* :class:`EagleLaw`: the head's hidden ``h_1 = alpha 4 e_x + 4 C[y]`` (``x`` the pending token, ``y`` the token
  before it, ``C`` the head's mixing table), ``h_i = alpha 4 e_d_i-1 + C^T h_i-1``, logits ``h_i / 4 @ T``;
* :class:`MedusaLaw`: draft ``i`` (0-based) is head ``i``'s row ``M_i+2[y]``, whatever the earlier drafts;
* :class:`Eagle3FeatureLaw`: the EAGLE-3 head written for engines (``specdec_ref.exact.head_files``, kind ``eagle3``):
  every draft is the row ``M_2[y]`` restricted to the draft vocabulary (its drafts read the fused feature only, so
  they repeat one token);
* :class:`NgramLaw`: the tokens after the first earlier occurrence of the longest suffix of ``h`` of length in
  ``[min_n, max_n]`` (vLLM's prompt lookup), point masses; fewer than ``k`` when the text ends sooner, none without a
  match.

:func:`round_acceptance` gives the law of the accepted count ``m`` of such a round under a declared scheme
(every draft path enumerated, :func:`specdec_properties.exact.outcome_given_drafts`), :func:`round_key` what it depends on
(so a check computes it once per distinct start).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["EagleLaw", "Eagle3Law", "Eagle3FeatureLaw", "MtpLaw", "MedusaLaw", "NgramLaw", "law_of", "round_acceptance",
           "round_key", "argmax_drafts", "greedy_round"]


@functools.lru_cache(maxsize=None)
def _target_rows(target_name: str) -> np.ndarray:
    from specdec_ref.exact import exact_model

    m = exact_model(target_name)
    if m.family != "order1":
        raise ValueError(f"proposal laws are stated on order-1 targets, not {target_name}")
    return np.asarray(m.next_logits([[a] for a in range(m.vocab)]), dtype=np.float64)


@dataclass(frozen=True)
class EagleLaw:
    target: str
    alpha: float
    sample: bool
    one_hot = property(lambda self: not self.sample)
    #: the text a round's law depends on: the pending token and the one before it
    context = 2
    #: the feature the first draft reads: of the token ``feature_back`` places before the pending one (1: the right
    #: one; a mutant's law in tests moves it)
    feature_back: int = 1

    def raw(self, text: Sequence[int], drafts: Sequence[int]) -> np.ndarray:
        """``h / 4 @ T`` for the head's hidden ``h`` (in units of ``e_t``): ``h_1 = alpha 4 e_x + 4 C[y]``, then
        ``h_i = alpha 4 e_d + C^T h_i-1``."""
        from specdec_ref.exact.heads import eagle_mix

        t, c = _target_rows(self.target), eagle_mix(self.target)
        h = self.alpha * 4 * np.eye(len(t))[text[-1]] + 4 * c[text[-1 - self.feature_back]]
        for d in drafts:
            h = self.alpha * 4 * np.eye(len(t))[d] + c.T @ h
        return h / 4 @ t

    def count(self, text, k):
        return k if len(text) >= 2 else 0


@dataclass(frozen=True)
class Eagle3Law(EagleLaw):
    """The exact EAGLE-3 head: the EAGLE law (its fused feature is ``4 e_y`` when every aux layer is right) restricted
    to the draft vocabulary ``vocab`` (target ids; every other id has logit ``-inf``)."""

    vocab: tuple = ()
    #: a mutant's law in tests: the fused feature's share ``wrong[1]`` is the feature of token ``y + wrong[0]``
    wrong: tuple = (0, 0.0)

    def raw(self, text, drafts):
        from specdec_ref.exact.heads import eagle_mix

        t, c = _target_rows(self.target), eagle_mix(self.target)
        y = text[-1 - self.feature_back]
        share, other = self.wrong[1], (y + self.wrong[0]) % len(t)
        h = self.alpha * 4 * np.eye(len(t))[text[-1]] + 4 * ((1 - share) * c[y] + share * c[other])
        for d in drafts:
            h = self.alpha * 4 * np.eye(len(t))[d] + c.T @ h
        out = np.full(len(t), -np.inf)
        out[list(self.vocab)] = (h / 4 @ t)[list(self.vocab)]
        return out


@dataclass(frozen=True)
class Eagle3FeatureLaw:
    """The EAGLE-3 head of the engine head files (``specdec_ref.exact.head_files``, kind ``eagle3``, on the deep
    target): its fused feature is ``4 e_y`` (``y`` the token before the pending one, whose auxiliary layers the first
    draft reads) and its decoder layer adds exactly zero, so every draft step reads the same feature and the token plays
    no part: draft ``i`` has the logits ``M_offset[y]`` (:func:`specdec_ref.exact.heads.medusa_table`, the log of the
    target's ``offset``-step law in eighths) on the draft vocabulary ``vocab`` (target ids) and ``-inf`` elsewhere,
    whatever the earlier drafts."""

    target: str
    vocab: tuple
    offset: int = 2
    sample: bool = False
    one_hot = property(lambda self: not self.sample)
    context = 2

    def raw(self, text, drafts):
        from specdec_ref.exact.heads import medusa_table

        row = medusa_table(self.target, self.offset)[text[-2]]
        out = np.full(len(row), -np.inf)
        out[list(self.vocab)] = row[list(self.vocab)]
        return out

    def count(self, text, k):
        return k if len(text) >= 2 else 0


@dataclass(frozen=True)
class MtpLaw:
    """The exact MTP module: ``u_1 = alpha 4 e_x + 4 C[y]`` (the token term zeroed when the pair sits at position 0,
    a two-token text), ``h_i = n(u_i)`` with ``n(v) = v / rms(v)`` over the 16 hidden channels, ``u_i = alpha 4 e_d +
    C^T h_i-1``; logits ``h_i / 4 @ T``. The float32 norm rounds (the law is float64): argmaxes within :attr:`tie`
    are treated as ties."""

    target: str
    alpha: float
    sample: bool = False
    mask_position0: bool = True
    one_hot = property(lambda self: not self.sample)
    context = 2
    tie = 1e-5
    hidden = 16
    #: a mutant's law in tests: the next step reads the un-normed ``u`` instead of ``h``
    recycle_pre_norm: bool = False

    def raw(self, text, drafts):
        from specdec_ref.exact.heads import eagle_mix

        t, c = _target_rows(self.target), eagle_mix(self.target)
        eye = np.eye(len(t))
        token = 0.0 if (self.mask_position0 and len(text) == 2) else self.alpha * 4
        u = token * eye[text[-1]] + 4 * c[text[-2]]
        h = self._norm(u)
        for d in drafts:
            u = self.alpha * 4 * eye[d] + c.T @ (u if self.recycle_pre_norm else h)
            h = self._norm(u)
        return h / 4 @ t

    def _norm(self, v):
        return v / np.sqrt((v ** 2).sum() / self.hidden)

    def count(self, text, k):
        return k if len(text) >= 2 else 0


@dataclass(frozen=True)
class MedusaLaw:
    target: str
    heads: int
    sample: bool = False
    one_hot = property(lambda self: not self.sample)
    context = 2

    def raw(self, text, drafts):
        from specdec_ref.exact.heads import medusa_table

        return medusa_table(self.target, len(drafts) + 2)[text[-2]]

    def count(self, text, k):
        return min(k, self.heads) if len(text) >= 2 else 0


@dataclass(frozen=True)
class NgramLaw:
    min_n: int
    max_n: int
    one_hot = True
    context = None  # the whole text

    def proposal(self, text: Sequence[int], k: int) -> list[int]:
        """The tokens after the first occurrence of the longest matching suffix (see the module docstring)."""
        text = list(text)
        longest = min(self.max_n, len(text) - 1)
        for n in range(longest, self.min_n - 1, -1):
            suffix = text[len(text) - n:]
            hits = [s for s in range(len(text) - n) if text[s:s + n] == suffix]
            if hits:
                return text[hits[0] + n:hits[0] + n + k]
        return []

    def count(self, text, k):
        return len(self.proposal(text, k))


def law_of(spec, target_name: str):
    """The proposal law of a reference proposer spec built by :mod:`specdec_ref.exact.heads` (or an ``Ngram``)."""
    kind = getattr(spec, "proposer_kind", None)
    if kind == "ngram":
        return NgramLaw(spec.min_n, spec.max_n)
    table = getattr(spec, "table_spec", None)
    if table is None:
        raise ValueError(f"{type(spec).__name__} has no exact proposal law (not built by specdec_ref.exact.heads)")
    if table[0] == "eagle":
        return EagleLaw(table[1], table[2], spec.sample)
    if table[0] == "eagle3":
        return Eagle3Law(table[1], table[2], spec.sample, vocab=table[3])
    if table[0] == "mtp":
        return MtpLaw(table[1], table[2], spec.sample, spec.mask_position0)
    if table[0] == "medusa":
        return MedusaLaw(table[1], table[2], spec.sample)
    raise ValueError(f"unknown exact head {table[0]!r}")


def round_key(law, text: Sequence[int], k: int) -> tuple:
    """What a round's acceptance law depends on: the proposer's context, the pending token (an order-1 target's rows
    then depend on the drafts only), and the drafts of a one-hot proposer that reads the whole text."""
    if law.context is None:
        drafts = tuple(law.proposal(text, k))
        return (text[-1], drafts)
    if getattr(law, "mask_position0", False):  # the first pair's token is masked: a two-token text is its own case
        return (len(text) == 2, *text[-law.context:])
    return tuple(text[-law.context:])


def _q_rows(law, prompt, generated, prefixes, config, eos_id, k, vocab: int) -> np.ndarray:
    """``[len(prefixes), V]``: the law of the next draft after each draft prefix."""
    import torch

    from specdec_ref.warp import warp

    from .history_law import history_logits, history_settings_on

    text = list(prompt) + list(generated)
    if isinstance(law, NgramLaw):
        drafts = law.proposal(text, k)
        rows = np.zeros((len(prefixes), vocab))
        for i, p in enumerate(prefixes):
            if len(p) < len(drafts):  # the row after the whole path judges nothing
                rows[i, drafts[len(p)]] = 1.0
        return rows
    raw = np.stack([law.raw(text, p) for p in prefixes])
    if history_settings_on(config):
        raw = history_logits(raw, config, list(prompt), [tuple(generated) + tuple(p) for p in prefixes], eos_id)
    if law.one_hot or config.greedy:
        return np.eye(raw.shape[-1])[raw.argmax(-1)]
    return warp(torch.from_numpy(raw), config, dtype=torch.float64).numpy()


def round_acceptance(target, law, prompt: Sequence[int], generated: Sequence[int], config, k: int, scheme, *,
                     eos_id=None) -> np.ndarray:
    """Law ``[count + 1]`` of the accepted drafts of one round of ``scheme`` from ``prompt + generated`` with at most
    ``k`` drafts from ``law`` (``count`` = the drafts it proposes there; an exactly-known ``target`` model)."""
    from .exact import outcome_given_drafts
    from .sequences import next_token_law

    text = list(prompt) + list(generated)
    count = law.count(text, k)
    if count == 0:
        return np.ones(1)
    vocab = target.vocab
    if law.one_hot or config.greedy:
        path, prefix = [], ()
        for _ in range(count):  # the single draft path
            q = _q_rows(law, prompt, generated, [prefix], config, eos_id, count, target.vocab)[0]
            path.append(int(q.argmax()))
            prefix = tuple(path)
        paths = np.array([path], dtype=np.int64)
    else:  # every draft path of positive probability, grown draft by draft (a token the draft never proposes,
        # such as <bos>, would make a context the target does not define)
        grown: list[tuple[int, ...]] = [()]
        for _ in range(count):
            q = _q_rows(law, prompt, generated, grown, config, eos_id, count, vocab)
            grown = [p + (int(t),) for p, row in zip(grown, q) for t in np.flatnonzero(row > 0)]
        paths = np.array(grown, dtype=np.int64).reshape(-1, count)
    prefixes = sorted({tuple(int(t) for t in path[:i]) for path in paths for i in range(count + 1)})
    index = {p: i for i, p in enumerate(prefixes)}
    p_law = next_token_law(target, list(prompt), [tuple(generated) + p for p in prefixes], config, eos_id=eos_id).numpy()
    q_law = _q_rows(law, prompt, generated, prefixes, config, eos_id, count, vocab)
    rows = np.array([[index[tuple(int(t) for t in path[:i])] for i in range(count + 1)] for path in paths])
    p, q = p_law[rows], q_law[rows[:, :count]]
    weight = np.prod(q[np.arange(len(paths))[:, None], np.arange(count)[None, :], paths], 1)
    keep = weight > 0
    stop, _ = outcome_given_drafts(scheme, p[keep], q[keep], paths[keep])
    return weight[keep] @ stop


#: Processed rows whose top two logits are closer than this are ties: an argmax there is ambiguous.
TIE = 1e-9


def _argmax(row: np.ndarray, tie: float = TIE) -> int | None:
    """The first-index argmax of ``row``, or None when the top two are tied (within ``tie``)."""
    top = np.sort(row)[-2:]
    return None if top[1] - top[0] < tie else int(row.argmax())


def argmax_drafts(law, text: Sequence[int], k: int) -> list[int] | None:
    """The drafts of a one-hot proposer (argmax drafts, prompt lookup) at a round from ``text`` with at most ``k``:
    ``law.count(text, k)`` of them, each the first-index argmax of the law's raw row after the earlier ones (the
    argmax of any tempered row: temperature keeps the order); prompt lookup's proposal. None when a row on the way is
    tied (within the law's ``tie``: the drafts are then ambiguous)."""
    text = list(text)
    if isinstance(law, NgramLaw):
        return law.proposal(text, k)
    drafts: list[int] = []
    for _ in range(law.count(text, k)):
        d = _argmax(law.raw(text, drafts), getattr(law, "tie", TIE))
        if d is None:
            return None
        drafts.append(d)
    return drafts


def greedy_round(target, law, text: Sequence[int], k: int) -> tuple[list[int], int] | None:
    """``(drafts, accepted)`` of a greedy round from ``text`` (pending token last) with argmax drafts from ``law``
    (:func:`argmax_drafts`) judged against the target's argmax (an order-1 exactly-known ``target``): every round's
    outcome is a function of its text. None when a draft or a target row on the way is tied (the outcome is then
    ambiguous)."""
    text = list(text)
    drafts = argmax_drafts(law, text, k)
    if drafts is None:
        return None
    accepted, last = 0, text[-1]
    for d in drafts:
        y = _argmax(np.asarray(target.next_logits([[last]]), dtype=np.float64)[0])
        if y is None:
            return None
        if y != d:
            break
        accepted, last = accepted + 1, d
    return drafts, accepted
