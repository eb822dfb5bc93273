"""One prompt's test: the law of its completions' first L tokens (sampling), or their greedy walk (``--greedy``).

Invariant: a :class:`PromptReport` passes when its goodness-of-fit passes (sampling) or when no completion has
an algorithmic divergence (greedy); numerical flips are reported, never failures, and the walk goes on along
the engine's own path after one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec_properties.flips import ALGORITHMIC_DIVERGENCE, NUMERICAL_FLIP, FlipVerdict, tolerance_for
from specdec_properties.sequences import law_to_cells, processed_logits64
from specdec_properties.stats import FitResult, goodness_of_fit

from .law import AmbiguousLawError, _law, _settings_label, choose_length, split_ties
from .read import SampleRecord
from ..report import show_ids


@dataclass
class PromptReport:
    """One prompt's test: ``fit`` (sampling) or greedy divergences / flips."""

    prompt: tuple[int, ...]
    n: int
    lines: list[int]
    length: int | None = None
    length_reason: str = ""
    fit: FitResult | None = None
    rest_fit: FitResult | None = None  # the same test without the impossible continuations (only when there are some)
    divergences: list[dict] = field(default_factory=list)  # algorithmic: line, position, expected, got, verdict
    flips: list[dict] = field(default_factory=list)  # numerical flips (reported, not failures)
    pooled: int = 1  # distinct prompts whose completions this test pools (they end in one table cell)

    @property
    def pooled_text(self) -> str:
        return "" if self.pooled == 1 else f" and {self.pooled - 1} other prompt(s) ending in its table cell"

    @property
    def passed(self) -> bool:
        return (self.fit is None or self.fit.passed) and not self.divergences

    @property
    def fails_beyond_impossible(self) -> bool:
        """Failed, and not only by impossible continuations (the rest departs too, or there are none)."""
        return not self.passed and (self.rest_fit is None or not self.rest_fit.passed)


def check_poolable(model, sampling, stop) -> None:
    """Prompts are pooled by their table cell (``certify_samples(pool_prompts=True)``) only for a model whose law is a
    table by cell, under settings whose law reads the prompt through that cell: ValueError for a model without cells,
    penalties, logit bias, bad words, a constraint, stop strings."""
    if not callable(getattr(model, "cell", None)):
        raise ValueError(f"pool_prompts: {getattr(model, 'name', model)} has no table cells to pool prompts by")
    if sampling.history_dependent or stop is not None:
        raise ValueError("pool_prompts: prompts are pooled by their table cell only under settings whose law reads the "
                         f"prompt through that cell; these read more ({sampling.label()}"
                         f"{', stop strings' if stop is not None else ''})")


def prompt_groups(model, records: list[SampleRecord], pool: bool) -> tuple[dict, dict]:
    """``(groups, distinct)``: the records by prompt, or with ``pool`` by the table cell their prompt ends in
    (``model.cell``), keyed by the first such prompt (its law is the group's); ``distinct``: each key's prompts."""
    groups: dict[tuple[int, ...], list[SampleRecord]] = {}
    first_of: dict = {}
    distinct: dict[tuple[int, ...], set] = {}
    for r in records:
        key = first_of.setdefault(model.cell(r.prompt), r.prompt) if pool else r.prompt
        groups.setdefault(key, []).append(r)
        distinct.setdefault(key, set()).add(r.prompt)
    return groups, distinct


def _sampling_test(model, prompt, group: list[SampleRecord], sampling, *, max_new_tokens, eos_id, length, alpha, tv,
                   length_n: int | None = None, stop=None) -> PromptReport:
    """``length_n``: the N that L is chosen for (default: this prompt's lines; planned looks pass the full look's)."""
    n = len(group)
    if length is None:
        length, reason = choose_length(model, prompt, length_n or n, sampling, max_new_tokens=max_new_tokens,
                                       eos_id=eos_id, alpha=alpha, tv=tv, stop=stop)
        if length_n and length_n != n:
            reason = f"chosen for the full look's N={length_n}: " + reason
    else:
        reason = "set by --length"
    split = split_ties(model, prompt, length, sampling, eos_id=eos_id, stop=stop)
    if split:
        raise AmbiguousLawError(
            f"prompt {show_ids(prompt)}: with these settings the law of the first {length} token(s) is not determined by "
            f"them: {split[0]}{f' (and {len(split) - 1} more)' if len(split) > 1 else ''}. Which tied tokens a top-p cut "
            "keeps depends on how the sampler sorts equal logits (torch.sort descending keeps the lowest ids, "
            "transformers' TopPLogitsWarper the highest); choose another top_p (or top_k) for this prompt"
            + (", or a smaller --length" if length > 1 else "")
        )
    cells = law_to_cells(_law(model, prompt, length, sampling, eos_id, stop))
    counts = cells.counts(r.completion[:length] for r in group)
    settings = _settings_label(sampling, eos_id, stop)
    fit = goodness_of_fit(
        counts, cells.probs, what=f"prompt {show_ids(prompt)}: first {length} generated token(s) ({settings})",
        labels=cells.labels, alpha=alpha, tv=tv,  # the verdict prints the replay command once
    )
    report = PromptReport(prompt, n, [r.line for r in group], length, reason, fit)
    if fit.impossible:
        examples = cells.impossible_examples(r.completion[:length] for r in group)
        lines = [r.line for r in group if cells.index_of(r.completion[:length]) == len(cells.labels) - 1][:5]
        report.length_reason += f"; impossible continuations {examples} on line(s) {lines}"
        rest = counts.copy()
        rest[cells.probs == 0] = 0  # the rest of the file, tested as usual: does it follow the law?
        report.rest_fit = goodness_of_fit(
            rest, cells.probs, what=f"prompt {show_ids(prompt)} without its impossible continuations: first {length} "
            f"generated token(s) ({settings})", labels=cells.labels, alpha=alpha, tv=tv,
        )
    return report


# ----------------------------------------------------------------------------- greedy


def _classify(model, prefix: list[int], got: int | None, z: torch.Tensor, dtype, position: int, tolerance: float | None = None) -> FlipVerdict:
    """specdec_properties.flips' verdict for the engine's ``got`` against the greedy choice, from table logits ``z``."""
    order = torch.argsort(-z, stable=True)
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(z.shape[-1])
    top1_token, top2_token = int(order[0]), int(order[1]) if z.shape[-1] > 1 else int(order[0])
    top1, top2 = float(z[top1_token]), float(z[top2_token])
    # the row's logit scale over tokens of positive probability (order2's <bos> logit, -2**16, is a mask, not a scale)
    scale = float(z[torch.softmax(z, -1) > 0].abs().max())
    tol = tolerance_for(dtype, None, scale) if tolerance is None else float(tolerance)
    la = None if got is None else float(z[got])
    if la is None:
        kind, gap_between = ALGORITHMIC_DIVERGENCE, None
    else:
        gap_between = abs(la - top1)
        kind = NUMERICAL_FLIP if top1 - la <= tol else ALGORITHMIC_DIVERGENCE
    note = "exact tie in the table" if la is not None and la == top1 else ""
    return FlipVerdict(
        prefix=list(prefix), token_a=got, token_b=top1_token, logit_a=la, logit_b=top1,
        rank_a=None if got is None else int(ranks[got]), rank_b=0, top1=top1, top2=top2,
        top1_token=top1_token, top2_token=top2_token, gap_top1_top2=top1 - top2, gap_between=gap_between,
        logits_scale=scale, tolerance=tol, dtype=str(dtype), kind=kind, position=position,
        labels=("engine", "greedy"), note=note,
    )


def _greedy_walk(model, prompt, completion, sampling, *, max_new_tokens, eos_id, dtype,
                 tolerance=None, stop=None) -> tuple[dict | None, list[dict]]:
    """Walk one completion along the engine's path: ``(first algorithmic divergence or None, flips)``. Each row is the
    target's logits after the history settings on the completion's own history (penalties, logit bias, min_new_tokens:
    greedy decoding applies them too)."""
    steps = min(len(completion) + 1, max_new_tokens)  # one row per position the engine chose (or stopped) at
    flips = []
    for i in range(steps):
        if i > 0 and ((eos_id is not None and completion[i - 1] == eos_id) or (stop is not None and stop(completion[:i]))):
            return None, flips  # stopped at EOS or a stop string (tokens after it are an invariant violation)
        context = list(prompt) + list(completion[:i])
        # row by row: a context past a divergence is never evaluated
        z = processed_logits64(model, prompt, [completion[:i]], sampling, eos_id=eos_id)[0]
        got = completion[i] if i < len(completion) else None
        expected = int(torch.argmax(z))
        if got == expected:
            continue
        verdict = _classify(model, context, got, z, dtype, i, tolerance)
        entry = {"position": i, "expected": expected, "got": got, "verdict": verdict}
        if verdict.kind == NUMERICAL_FLIP:
            flips.append(entry)
            continue
        return entry, flips
    return None, flips


def _greedy_test(model, prompt, group: list[SampleRecord], sampling, *, max_new_tokens, eos_id, dtype,
                 tolerance=None, stop=None) -> PromptReport:
    report = PromptReport(prompt, len(group), [r.line for r in group])
    done: dict[tuple, tuple] = {}
    for r in group:
        if r.completion not in done:
            done[r.completion] = _greedy_walk(
                model, prompt, r.completion, sampling, max_new_tokens=max_new_tokens, eos_id=eos_id, dtype=dtype,
                tolerance=tolerance, stop=stop)
        divergence, flips = done[r.completion]
        if divergence is not None:
            report.divergences.append({**divergence, "line": r.line, "completion": list(r.completion)})
        report.flips.extend({**f, "line": r.line} for f in flips)
    return report
