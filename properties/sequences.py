"""The exact law of a decoded continuation, by enumeration in float64 (tiny vocabularies).

For the *sequence-level* exactness check of a decoder: a correct speculative sampler emits
continuations of a prompt with exactly the law of autoregressive sampling from the target,
whatever the draft. With a tiny target (vocabulary <= ~16) and short continuations (n = 2..4)
that law can be written down leaf by leaf::

    P(x_1 .. x_n | prompt) = prod_i  warp(z64(prompt, x_1 .. x_{i-1}), config)[x_i]

where ``z64`` are the target's next-token logits from a float64 copy of the model
(:func:`specdec_ref.forward.reference_logits`: full forward, no cache; for an exactly-known model,
``specdec_ref.exact.ExactModel``, its table logits ``next_logits``) and
:func:`specdec_ref.warp.warp` applies temperature / top-k / top-p in float64 (the decoder's own
steps; :func:`boundary_margin` uses them too, so the law cannot drift from the decoder).
:func:`continuation_law` computes it level by level: all live prefixes of one length go through
the model in one batched forward, so V=16, n=3 (4096 leaves) takes a few hundred milliseconds.

History-dependent settings (``logit_bias``, repetition / presence / frequency penalties,
``min_new_tokens``, ``constraint``) make a position's law depend on its whole prefix, not only on
the model's logits: before the warp, every prefix's float64 logits go through
:func:`specdec_properties.history_law.history_logits` (an independent numpy statement of the five steps of
:mod:`specdec_ref.history`, with history ``prompt + prefix``; ``min_new_tokens`` masks ``eos_id``).
:func:`processed_logits64` gives those logits and :func:`next_token_law` the per-position law, of
which the law of a continuation is the product along its path.
With ``eos_id`` (one id, or a sequence of ids that all end generation) a continuation stops right
after emitting an EOS (a shorter tuple ending in one); otherwise every continuation has length exactly n. Greedy (``config.greedy``) puts
mass 1 on the float64 first-index argmax path.

:func:`law_to_cells` turns a law into deterministic chi-square cells (labels like ``"3 7 12"`` or
``"3 EOS"``) with an ``index_of`` mapping and a ``counts`` helper, ready for
``specdec_properties.stats.assert_fits``; sequences outside the support land in an ``IMPOSSIBLE`` cell of
probability 0 (one such sample fails the test outright).

Numerical caveat (handled, not hidden)
--------------------------------------
The law is computed in float64; a backend samples from float32 (or bf16) probabilities. Away from
set boundaries the difference is ~1e-7 in probability, far below anything a chi-square test with
a few million samples can see. At a boundary it is not small: the *support* itself can change.
Top-k keeps the k largest logits, so a near-tie between the k-th and (k+1)-th logit can swap which
token is kept; top-p keeps the shortest prefix of the sorted distribution whose mass reaches
``top_p``, so a cumulative mass within rounding of ``top_p`` (or a near-tie at the cut) can add or
drop a token; min-p drops tokens below ``max + log(min_p)``, so a logit within rounding of that
threshold can go either way; greedy can flip at a near-tie of the top two. :func:`boundary_margin`
reports, over every enumerated prefix of positive probability, the smallest logit gap at the cut,
the smallest distance of a logit from the min-p threshold (both in processed logit units: history
steps applied, before temperature; comparable to :func:`specdec_properties.flips.tolerance_for`) and the
smallest distance of a cumulative mass from ``top_p``; tests should assert both are far above the precision under test
(:meth:`BoundaryMargin.assert_safe`) before trusting a chi-square verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np
import torch

from specdec_properties.flips import tolerance_for
from specdec_properties.history_law import eos_set, history_logits, history_settings_on
from specdec_ref.forward import as_prompt, reference_logits
from specdec_ref.warp import SamplingConfig, nucleus_masses, warp, warp_logits

__all__ = [
    "EOS_LABEL",
    "OTHER_LABEL",
    "IMPOSSIBLE_LABEL",
    "ContinuationLaw",
    "Cells",
    "BoundaryMargin",
    "continuation_law",
    "next_logits64",
    "processed_logits64",
    "next_token_law",
    "law_to_cells",
    "boundary_margin",
    "row_margins",
    "sequence_label",
]

EOS_LABEL = "EOS"
OTHER_LABEL = "OTHER"
IMPOSSIBLE_LABEL = "IMPOSSIBLE"
#: Continuations are computed in batches of at most this many prefixes.
BATCH = 1024
#: Tolerance of the "probabilities sum to 1" assertion.
SUM_TOLERANCE = 1e-9


class ContinuationLaw(dict):
    """``{continuation tuple: probability}`` plus how it was made.

    Attributes: ``prompt`` (list of ids), ``n``, ``config``, ``eos_id``, ``min_prob``,
    ``pruned_mass`` (mass of branches cut by ``min_prob``; 0 by default) and ``pruned_prefixes``
    (those branches' prefixes). ``sum(values) + pruned_mass == 1`` within 1e-9.
    """

    prompt: list[int]
    n: int
    config: SamplingConfig
    eos_id: int | Sequence[int] | None
    min_prob: float
    pruned_mass: float
    pruned_prefixes: frozenset

    def pruned_prefix_of(self, seq: tuple[int, ...]) -> tuple[int, ...] | None:
        """The pruned prefix ``seq`` extends, if any."""
        for i in range(1, len(seq) + 1):
            if seq[:i] in self.pruned_prefixes:
                return seq[:i]
        return None


def next_logits64(model, contexts) -> torch.Tensor:
    """float64 next-token logits ``[len(contexts), V]`` after each context (any lengths, any order).

    ``model`` is a transformers model (float64 forward, contexts of one length per batch) or an
    exactly-known model (``specdec_ref.exact.ExactModel``, anything with
    ``next_logits(contexts)`` that is not an ``nn.Module``), whose table logits are used instead of
    running a checkpoint.
    """
    contexts = [list(c) for c in contexts]
    if not isinstance(model, torch.nn.Module) and callable(getattr(model, "next_logits", None)):
        return torch.as_tensor(model.next_logits(contexts), dtype=torch.float64)
    if not contexts:
        return torch.zeros(0, model.config.vocab_size, dtype=torch.float64)
    by_len: dict[int, list[int]] = {}
    for i, c in enumerate(contexts):
        by_len.setdefault(len(c), []).append(i)
    out = [None] * len(contexts)
    for idx in by_len.values():
        for start in range(0, len(idx), BATCH):
            chunk = idx[start : start + BATCH]
            rows = reference_logits(model, [contexts[i] for i in chunk], dtype=torch.float64)[:, -1]
            for j, i in enumerate(chunk):
                out[i] = rows[j]
    return torch.stack(out)


def processed_logits64(model, prompt: Sequence[int], prefixes: Sequence[Sequence[int]], config: SamplingConfig, *,
                       eos_id: int | Sequence[int] | None = None) -> torch.Tensor:
    """float64 logits ``[len(prefixes), V]`` after ``prompt + prefix``, history-dependent steps applied.

    Row ``i`` is :func:`next_logits64` of ``prompt + prefixes[i]`` put through the five history steps
    (:func:`specdec_properties.history_law.history_logits`, generated tokens = ``prefixes[i]``); it is the raw
    row when ``config`` has no history setting. Temperature and the filters are not applied.
    """
    prompt = [int(t) for t in prompt]
    prefixes = [tuple(int(t) for t in p) for p in prefixes]
    raw = next_logits64(model, [prompt + list(p) for p in prefixes])
    vocab = raw.shape[-1]
    for e in eos_set(eos_id):
        if not 0 <= e < vocab:
            raise ValueError(f"eos_id={e} is outside the vocabulary [0, {vocab})")
    if not history_settings_on(config):
        return raw
    return torch.from_numpy(history_logits(raw.cpu().numpy(), config, prompt, prefixes, eos_id))


def _step_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Probabilities of processed logits: the one-hot first-index argmax (greedy) or the float64 warp."""
    if config.greedy:
        # first-index argmax, as in torch.argmax
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
    return warp(logits, config, dtype=torch.float64)


def next_token_law(model, prompt: Sequence[int], prefixes: Sequence[Sequence[int]], config: SamplingConfig, *,
                   eos_id: int | Sequence[int] | None = None) -> torch.Tensor:
    """float64 ``[len(prefixes), V]``: the law of the token after ``prompt + prefix`` under ``config``.

    History steps on the prefix's own history (:func:`processed_logits64`), then greedy one-hot or
    temperature / top-k / top-p / min-p and the softmax. Every row sums to 1.
    """
    return _step_probs(processed_logits64(model, prompt, prefixes, config, eos_id=eos_id), config)


def continuation_law(
    target_model: torch.nn.Module,
    prompt,
    n: int,
    config: SamplingConfig,
    *,
    eos_id: int | Sequence[int] | None = None,
    min_prob: float = 0.0,
    stop=None,
) -> ContinuationLaw:
    """Exact law of the next ``n`` tokens after ``prompt`` under AR sampling with ``config``.

    ``target_model``: a transformers model (its float64 copy is run) or an
    ``specdec_ref.exact.ExactModel`` (its table logits are used; no forward).
    ``prompt``: ``LongTensor[1, t]`` / ``[t]`` or a list of ids. Keys are tuples of generated
    tokens (length n, or shorter ending in ``eos_id`` or in the token that completes a stop string of ``stop``, a
    :class:`specdec_properties.stops.StopStrings`: a deterministic stopping rule like EOS); only continuations of positive
    probability appear. History-dependent settings are applied at every position on that
    position's own history (:func:`next_token_law`); ``min_new_tokens`` masks ``eos_id``. ``min_prob > 0`` prunes every branch (prefix) whose probability falls
    below it, at the level where it falls below (recorded in ``pruned_mass`` /
    ``pruned_prefixes``; :func:`law_to_cells` folds it into an ``OTHER`` cell). Asserts that the
    probabilities plus the pruned mass sum to 1 within 1e-9.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if min_prob < 0 or not math.isfinite(min_prob):
        raise ValueError(f"min_prob must be finite and >= 0, got {min_prob!r}")
    prompt_ids = as_prompt(prompt)[0].tolist()
    frontier: list[tuple[int, ...]] = [()]
    frontier_p = torch.ones(1, dtype=torch.float64)
    leaves: dict[tuple[int, ...], float] = {}
    pruned_mass = 0.0
    pruned: set[tuple[int, ...]] = set()
    eos = eos_set(eos_id)
    for level in range(n):
        step = next_token_law(target_model, prompt_ids, frontier, config, eos_id=eos_id)
        joint = frontier_p[:, None] * step  # [F, V]
        rows, toks = torch.nonzero(joint > 0, as_tuple=True)
        probs = joint[rows, toks]
        next_frontier, next_p = [], []
        last = level == n - 1
        for r, t, p in zip(rows.tolist(), toks.tolist(), probs.tolist()):
            seq = frontier[r] + (t,)
            if p < min_prob:
                pruned_mass += p
                pruned.add(seq)
            elif last or t in eos or (stop is not None and stop(seq)):
                leaves[seq] = p
            else:
                next_frontier.append(seq)
                next_p.append(p)
        if not next_frontier:
            break
        frontier, frontier_p = next_frontier, torch.tensor(next_p, dtype=torch.float64)
    total = math.fsum(leaves.values()) + pruned_mass
    assert abs(total - 1.0) <= SUM_TOLERANCE, f"continuation law sums to {total!r}, not 1"
    law = ContinuationLaw(sorted(leaves.items()))
    law.prompt = prompt_ids
    law.n = n
    law.config = config
    law.eos_id = eos_id
    law.stop = stop
    law.min_prob = float(min_prob)
    law.pruned_mass = pruned_mass
    law.pruned_prefixes = frozenset(pruned)
    return law


# --------------------------------------------------------------------------- cells


def sequence_label(seq: Sequence[int], eos_id: int | Sequence[int] | None = None) -> str:
    """``"3 7 12"``; an EOS id prints as ``EOS`` (``EOS:<id>`` when there are several)."""
    eos = eos_set(eos_id)
    names = {e: EOS_LABEL if len(eos) == 1 else f"{EOS_LABEL}:{e}" for e in eos}
    return " ".join(names.get(t, str(t)) for t in seq)


def _continuation_key(seq) -> tuple[int, ...]:
    """A generated continuation (tuple / list / 1-d tensor) as a tuple of ints (a tuple of ints is returned itself)."""
    if type(seq) is tuple and all(type(t) is int for t in seq):
        return seq
    return tuple(int(t) for t in (seq.reshape(-1).tolist() if isinstance(seq, torch.Tensor) else seq))


@dataclass
class Cells:
    """Chi-square cells of a continuation law.

    ``labels[i]`` / ``probs[i]``: one cell per continuation with probability >=
    ``min_expected_prob`` (lexicographic order of the token tuples), then ``OTHER`` (smaller
    continuations plus pruned mass; present only when that mass is > 0) and ``IMPOSSIBLE``
    (probability 0: anything outside the support). ``sequences[i]`` is the tuple of a
    per-sequence cell (``None`` for the two pooled cells).
    """

    labels: list[str]
    probs: np.ndarray
    sequences: list[tuple[int, ...] | None]
    law: ContinuationLaw
    _index: dict

    def index_of(self, seq) -> int:
        """Cell index of a generated continuation (tuple / list / 1-d tensor, prompt excluded)."""
        key = _continuation_key(seq)
        idx = self._index.get(key)
        if idx is not None:
            return idx
        eos = eos_set(self.law.eos_id)
        if len(key) > self.law.n or any(t in eos for t in key[:-1]):
            return len(self.labels) - 1  # too long, or tokens after EOS: IMPOSSIBLE
        if key in self.law or self.law.pruned_prefix_of(key) is not None:
            return self.labels.index(OTHER_LABEL)
        return len(self.labels) - 1  # IMPOSSIBLE

    def counts(self, seqs: Iterable) -> np.ndarray:
        """Counts per cell of an iterable of generated continuations (each distinct continuation is looked up once)."""
        out = np.zeros(len(self.labels), dtype=np.int64)
        tally: dict = {}
        for s in seqs:
            key = _continuation_key(s)
            tally[key] = tally.get(key, 0) + 1
        for key, count in tally.items():
            out[self.index_of(key)] += count
        return out

    def impossible_examples(self, seqs: Iterable, limit: int = 5) -> list[str]:
        """Labels of up to ``limit`` sequences that fall outside the support (for failure messages)."""
        found = []
        for s in seqs:
            if self.index_of(s) == len(self.labels) - 1:
                key = _continuation_key(s)
                found.append(sequence_label(key, self.law.eos_id) or "<empty>")
                if len(found) >= limit:
                    break
        return found


def law_to_cells(law: ContinuationLaw, min_expected_prob: float = 0.0) -> Cells:
    """Deterministic cells for ``specdec_properties.stats.assert_fits`` (see :class:`Cells`)."""
    if not isinstance(law, ContinuationLaw):
        raise TypeError("law_to_cells expects the ContinuationLaw returned by continuation_law")
    labels, probs, seqs, index = [], [], [], {}
    other = law.pruned_mass
    for seq in sorted(law):
        p = law[seq]
        if p >= min_expected_prob:
            index[seq] = len(labels)
            labels.append(sequence_label(seq, law.eos_id))
            probs.append(p)
            seqs.append(seq)
        else:
            other += p
    if other > 0:
        labels.append(OTHER_LABEL)
        probs.append(other)
        seqs.append(None)
    labels.append(IMPOSSIBLE_LABEL)
    probs.append(0.0)
    seqs.append(None)
    return Cells(labels, np.asarray(probs, dtype=np.float64), seqs, law, index)


# --------------------------------------------------------------------------- boundary margin


@dataclass(frozen=True)
class BoundaryMargin:
    """Distance of a law's support from the top-k / top-p / min-p / greedy set boundaries.

    Logits here are *processed*: history-dependent steps applied (:func:`processed_logits64`), before
    temperature; for a config without history settings they are the raw logits.
    ``logit_gap``: smallest processed-logit gap between the last kept and the first dropped token of
    the warped set (greedy: top-1 minus top-2; a token at ``-inf`` is no boundary), over all enumerated
    prefixes; ``inf`` when nothing is filtered. ``mass_gap``: smallest ``|mass_before_j - top_p|``
    over the sorted tokens of every prefix (top-p only, else ``inf``). ``min_p_gap``: smallest
    ``|z - (max z + temperature * log(min_p))|`` over the tokens min-p sees (after top-k / top-p; the
    row's argmax itself excluded), i.e. the distance from the min-p threshold in the same units as
    ``logit_gap`` (min-p only, else ``inf``). ``where_*``: the prefix (generated tokens) attaining each
    minimum. ``prefixes``: how many prefixes were examined.
    """

    logit_gap: float
    mass_gap: float
    where_logit: tuple[int, ...] | None
    where_mass: tuple[int, ...] | None
    prefixes: int
    min_p_gap: float = math.inf
    where_min_p: tuple[int, ...] | None = None

    def assert_safe(self, dtype: torch.dtype = torch.float32, *, factor: float = 10.0, mass_tol: float | None = None) -> None:
        """Assert the settings are far from every boundary for a sampler computing in ``dtype``.

        Logit side: ``logit_gap`` and ``min_p_gap > factor * tolerance_for(dtype)`` (flip tolerance at
        the default logit scale). Mass side: ``mass_gap > mass_tol`` (default ``factor * 1e-6`` for
        float32, ``factor * 1e-2`` for bf16 / fp16).
        """
        __tracebackhide__ = True
        need_logit = factor * tolerance_for(dtype)
        if mass_tol is None:
            mass_tol = factor * (1e-6 if dtype == torch.float32 else 1e-2)
        problems = []
        if not self.logit_gap > need_logit:
            problems.append(f"logit gap {self.logit_gap:.3g} at prefix {self.where_logit} <= {need_logit:.3g}")
        if not self.min_p_gap > need_logit:
            problems.append(f"min-p threshold gap {self.min_p_gap:.3g} at prefix {self.where_min_p} <= {need_logit:.3g}")
        if not self.mass_gap > mass_tol:
            problems.append(f"top-p mass gap {self.mass_gap:.3g} at prefix {self.where_mass} <= {mass_tol:.3g}")
        if problems:
            raise AssertionError(
                f"sampling settings are too close to a support boundary for {dtype}: " + "; ".join(problems)
                + " -- the float64 law may differ in support from what the sampler uses; choose other settings"
            )


def row_margins(z: torch.Tensor, config: SamplingConfig) -> dict[str, torch.Tensor]:
    """Per row of processed logits ``z [F, V]`` (float64), the distances :class:`BoundaryMargin` takes minima of.

    ``"logit"``: smallest gap at a top-k or final-support cut (a ``-inf`` token is no boundary);
    ``"mass"``: smallest ``|mass_before - top_p|`` over the tokens top-p sorts; ``"min_p"``: smallest
    distance from the min-p threshold, pre-temperature units, the row's argmax excluded. ``inf`` where a
    step is off or nothing is cut.
    """
    inf = torch.full((z.shape[0],), math.inf, dtype=torch.float64)
    sampling = not config.greedy
    return {
        "logit": _cut_gaps(z, config),
        "mass": _mass_gaps(z, config) if sampling and config.top_p is not None and config.top_p < 1.0 else inf,
        "min_p": _min_p_gaps(z, config) if sampling and config.min_p is not None else inf,
    }


def _cut_gaps(z: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    sorted_z, _ = torch.sort(z, dim=-1, descending=True)
    vocab = z.shape[-1]
    cuts = [(_step_probs(z, config) > 0).sum(-1)]  # the final support
    if not config.greedy and config.top_k is not None and config.top_k < vocab:
        cuts.append(torch.full_like(cuts[0], config.top_k))  # an exact tie at the k-th logit keeps more than k tokens
    best = torch.full((z.shape[0],), math.inf, dtype=torch.float64)
    for s in cuts:
        last_kept = sorted_z.gather(-1, (s - 1).clamp(0, vocab - 1)[:, None])[:, 0]
        first_dropped = sorted_z.gather(-1, s.clamp(max=vocab - 1)[:, None])[:, 0]
        gap = torch.where((s < vocab) & torch.isfinite(first_dropped), last_kept - first_dropped, math.inf)
        best = torch.minimum(best, gap)
    return best


def _min_p_gaps(z: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    x = warp_logits(z, replace(config, min_p=None), dtype=torch.float64)  # what min-p sees
    threshold = x.max(-1, keepdim=True).values + math.log(config.min_p)
    dist = ((x - threshold).abs() * config.temperature).masked_fill(~torch.isfinite(x), math.inf)
    return dist.scatter(-1, x.argmax(-1, keepdim=True), math.inf).min(-1).values


def _mass_gaps(z: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    x = warp_logits(z, replace(config, top_p=None, min_p=None), dtype=torch.float64)  # what top-p sees
    _, sp, before = nucleus_masses(x)
    return (before - config.top_p).abs().masked_fill(sp == 0, math.inf).min(-1).values


def boundary_margin(
    target_model: torch.nn.Module,
    prompt,
    n: int,
    config: SamplingConfig,
    *,
    eos_id: int | Sequence[int] | None = None,
) -> BoundaryMargin:
    """:class:`BoundaryMargin` over every prefix of positive probability of :func:`continuation_law`.

    The prefixes examined are the empty one and every proper prefix of a continuation (prefixes
    ending in ``eos_id`` are not extended, so not examined). Gaps are measured on each prefix's
    processed logits (history steps applied on its own history).
    """
    law = continuation_law(target_model, prompt, n, config, eos_id=eos_id)
    eos = eos_set(eos_id)
    prefixes = {()}
    for seq in law:
        for i in range(1, min(len(seq), n - 1) + 1):
            if seq[i - 1] not in eos:
                prefixes.add(seq[:i])
            else:
                break
    group = sorted(prefixes, key=lambda p: (len(p), p))
    margins = row_margins(processed_logits64(target_model, law.prompt, group, config, eos_id=eos_id), config)
    best = {}
    for name, per_row in margins.items():
        r = int(per_row.argmin())  # the first prefix attaining the minimum
        best[name] = (float(per_row[r]), group[r]) if float(per_row[r]) < math.inf else (math.inf, None)
    return BoundaryMargin(
        best["logit"][0], best["mass"][0], best["logit"][1], best["mass"][1], len(prefixes),
        min_p_gap=best["min_p"][0], where_min_p=best["min_p"][1],
    )
